"""A sampled decode's rounds replayed stage by stage: the build (the verifier's draws, head included) and the
accept of every round, timed warm and after evicting the caches, on the calling thread's CPU clock.

What a decode's stage times cannot separate: the head's share of the build, and what a cold cache costs (the target
forward between two rounds evicts the head's and the builder's data).  The rounds of one decode per prompt are
captured (their trees, blocks, head, scored logits), then each stage is replayed over all of them, warm and with a
64 MB write before each round (L2 and L3 evicted).  ``time.thread_time`` (CPU time of this thread) leaves out the
time other processes take the core, so a busy machine moves the figures less than wall time would; the head's share
is the ``TimedHead`` proxy's own clock switched to the same CPU clock.  Also the proxy's own cost per head call::

    taskset -c 0 .venv/bin/python benchmarks/round_replay.py [--method corrected-sequoia:budget=3] [--prompts 2]
"""

from __future__ import annotations

import argparse
import time
import types

import torch


def best(fn, n: int, reps: int = 7) -> float:
    """The best of ``reps`` CPU times of ``n`` calls, per call (seconds)."""
    out = float("inf")
    for _ in range(reps):
        start = time.thread_time()
        for _ in range(n):
            fn()
        out = min(out, time.thread_time() - start)
    return out / n


def main() -> None:
    import dartree.timing
    from dartree import verifiers
    from dartree.eval.bundles import encode, load_bundle
    from dartree.eval.datasets import load_prompts
    from dartree.eval.methods import make_decoder, parse_method
    from dartree.verify.sampling import GeneratorSampler

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--method", default="corrected-sequoia:budget=3", help="dartree bench's NAME[:KEY=VALUE,...]")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per set (HumanEval, stdlib), 64 tokens each")
    parser.add_argument("--reps", type=int, default=3, help="replays of every round, warm then cold")
    args = parser.parse_args()
    torch.set_num_threads(1)
    bundle = load_bundle("pystdlib-tiny")
    prompts = [torch.tensor([encode(bundle.tokenizer, p.text)[-256:]])
               for s in ("humaneval", "stdlib") for p in load_prompts(s, args.prompts)]
    decoder = make_decoder(bundle, parse_method(args.method, {"budget": 16}), "fast")
    draws, accepts = [], []
    draw, accept = verifiers.Traversal.draw, verifiers.Traversal.accept

    def capture_draw(self, tree, block, head=None, **kw):
        draws.append((self, tree, block, head, kw))
        return draw(self, tree, block, head, **kw)

    def capture_accept(self, drafted, scored, prefix, rows=None):
        accepts.append((self, drafted, types.SimpleNamespace(logits=scored.logits.clone()), prefix))
        return accept(self, drafted, scored, prefix, rows)

    verifiers.Traversal.draw, verifiers.Traversal.accept = capture_draw, capture_accept
    with torch.inference_mode():
        for i, prompt in enumerate(prompts):
            decoder.generate(prompt, 64, 1.0, GeneratorSampler(torch.Generator().manual_seed(7 + i)))
    verifiers.Traversal.draw, verifiers.Traversal.accept = draw, accept
    if not draws:
        raise SystemExit(f"{args.method}: no sampled rounds with the traversal verifier")
    head = draws[0][3]
    if head is not None:      # the head's share on the same clock as the stages
        dartree.timing.time = types.SimpleNamespace(perf_counter=time.thread_time)
    junk = torch.ones(16 * 1024 * 1024)                  # 64 MB: more than L2 and L3
    n = len(draws)
    print(f"{args.method}: {n} rounds of {len(prompts)} decodes at T=1 (traversal); us a round, CPU time")
    with torch.inference_mode():
        for _ in range(args.reps):
            for cold in (False, True):
                build = verify = 0.0
                if head is not None:
                    head.take()
                for c, a in zip(draws, accepts, strict=True):
                    if cold:
                        junk.add_(1.0)
                    start = time.thread_time()
                    c[0].draw(c[1], c[2], c[3], **c[4])
                    build += time.thread_time() - start
                    if cold:
                        junk.add_(1.0)
                    start = time.thread_time()
                    a[0].accept(a[1], a[2], a[3])
                    verify += time.thread_time() - start
                spent = head.take()[0] if head is not None else 0.0
                print(f"  {'cold' if cold else 'warm'}: build {build / n * 1e6:6.0f} (head {spent / n * 1e6:4.0f}, "
                      f"builder {(build - spent) / n * 1e6:4.0f})  accept {verify / n * 1e6:5.0f}")
        dartree.timing.time = time                      # the proxy's own clock again (a cheaper read)
        if head is not None and hasattr(head.head, "vocab_logits"):
            block = draws[len(draws) // 2][2]
            states = head.head.initial_state(block)[:, None]
            tokens = torch.zeros(1, 1, dtype=torch.int64)
            depth = min(2, block.gamma)
            for name, call in (("vocab_logits", lambda h: h.vocab_logits(block, depth, states)),
                               ("advance", lambda h: h.advance(block, 1, states, tokens))):
                bare, proxied = best(lambda c=call: c(head.head), 2000), best(lambda c=call: c(head), 2000)
                print(f"  {name}: bare {bare * 1e6:.1f} us, through the proxy {proxied * 1e6:.1f} us (warm)")


if __name__ == "__main__":
    main()
