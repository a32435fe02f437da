"""Side by side on one pinned core: dartree's loops and the peers' own, interleaved prompt by prompt.

    taskset -c 0 .venv/bin/python benchmarks/peers_side_by_side.py --prompts 2 --reps 5 \\
        --methods dflash,chain,hf-generate,ar,ddtree16,hf-prompt-lookup

Every method decodes the same prompts (``--prompts`` per set of HumanEval, stdlib and held-out
packages, 64 new tokens, T=0, one torch thread) and must equal dartree's AR token for token.  Each
repetition runs every method on one prompt before the next prompt (the order reversed every other
repetition), so a machine whose load drifts charges every method alike.  Reported per method: the
best and the median tokens/s, and the **median over prompts of the median paired ratio** against
the first method (time of the first / time of this one, same prompt, same repetition): the figure
that stays put on a shared machine.  pytest-benchmark's suite (test_bench_peers.py) times one
provider after another, which a drifting machine biases.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from common import checked_times, paired_ratio

from dartree import SpeculativeDecoder, generate_ar, make_builder
from dartree.eval.bundles import encode, load_bundle
from dartree.eval.datasets import load_prompts
from dartree.eval.peers import make_peer
from dartree.models.target import HFTarget

#: name -> (builder, settings, head) of the dartree methods this script knows
METHODS = {
    "chain": ("chain", {}, None),
    "ddtree16": ("ddtree", {"budget": 16}, None),
    "ddtree64": ("ddtree", {"budget": 64}, None),
    "pruned16": ("dartree-pruned", {"budget": 16, "width": 12}, "gru"),
    "pruned16w8": ("dartree-pruned", {"budget": 16, "width": 8}, "gru"),    # the demo tuner's usual choice
    "pruned16b0": ("dartree-pruned", {"budget": 16, "width": 12, "beta": 0.0}, "gru"),  # beta=auto's usual pick
    "pruned64": ("dartree-pruned", {"budget": 64, "width": 12}, "gru"),
    "corrected-chain": ("corrected-chain", {}, "gru"),
}
PEER_NAMES = ("hf-generate", "hf-prompt-lookup", "dflash")
#: a dartree method (or ar) with ``-hf`` appended runs its target through the model's own forward
#: (``HFTarget(..., forward="hf")``) instead of the lean one: the lean forward's share, same run
HF_SUFFIX = "-hf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=2, help="prompts per set (3 sets)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--methods", default="dflash,chain,hf-generate,ar,ddtree16,hf-prompt-lookup",
                        help=f"comma-separated; ar, {', '.join(METHODS)}, {', '.join(PEER_NAMES)}; "
                             f"a dartree method or ar + '{HF_SUFFIX}': through the model's own forward")
    args = parser.parse_args()
    torch.set_num_threads(1)
    bundle = load_bundle("pystdlib-tiny")
    prompts = [torch.tensor([encode(bundle.tokenizer, p.text)[-256:]])
               for name in ("humaneval", "stdlib", "packages") for p in load_prompts(name, args.prompts)]
    names = args.methods.split(",")
    decoders = {}
    layers = tuple(bundle.drafter.target_layer_ids)
    for name in names:
        plain = name.removesuffix(HF_SUFFIX)
        forward = "hf" if plain != name else "auto"
        if plain == "ar":
            target = HFTarget(bundle.target, forward=forward)
            decoders[name] = lambda ids, n, target=target: generate_ar(target, ids, n).tokens
        elif name in PEER_NAMES:
            peer = make_peer(name, bundle)
            decoders[name] = lambda ids, n, peer=peer: peer(ids, n).tokens
        else:
            builder, settings, head = METHODS[plain]
            spec = SpeculativeDecoder(HFTarget(bundle.target, layer_ids=layers, forward=forward), bundle.drafter,
                                      make_builder(builder, backend="fast", **settings),
                                      head=None if head is None else bundle.heads[head])
            decoders[name] = lambda ids, n, spec=spec: spec.generate(ids, n).tokens
    m = args.new_tokens
    refs = [generate_ar(bundle.target, p, m).tokens for p in prompts]
    times = checked_times(lambda name, p: decoders[name](p, m), list(decoders), prompts, refs, args.reps)
    tokens = m * len(prompts)
    base = names[0]
    print(f"{len(prompts)} prompts x {m} tokens, {args.reps} interleaved repetitions, one thread; "
          f"ratio = median over prompts of the median paired (time of {base} / time of the method)")
    print(f"{'method':18s} {'best tok/s':>10s} {'median tok/s':>12s} {'x ' + base:>10s}")
    for name in decoders:
        best = sum(min(t) for t in times[name])
        med = sum(statistics.median(t) for t in times[name])
        ratio = paired_ratio(times[base], times[name])
        print(f"{name:18s} {tokens / best:10.1f} {tokens / med:12.1f} {ratio:10.3f}")


if __name__ == "__main__":
    with torch.inference_mode():
        main()
