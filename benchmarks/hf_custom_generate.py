"""``model.generate(custom_generate=dartree.hf.generate)`` against dartree's own ``SpeculativeDecoder.generate``
(same method) and HF's greedy ``generate``, side by side in one process, interleaved prompt by prompt.

    taskset -c 0 .venv/bin/python benchmarks/hf_custom_generate.py [--prompts 3] [--reps 5]

Reported: tokens/s of each and the median paired time ratio to dartree's own loop (goal: custom_generate
>= 0.95x of it); every output must equal HF's greedy output.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import dartree.hf
from dartree import SpeculativeDecoder, make_builder
from dartree.eval.bundles import encode, load_bundle
from dartree.eval.datasets import load_prompts
from dartree.models.target import HFTarget


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=3, help="prompts per set (HumanEval, stdlib)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    bundle = load_bundle("pystdlib-tiny")
    model, n = bundle.target, args.new_tokens
    prompts = [torch.tensor([encode(bundle.tokenizer, p.text)[-256:]])
               for name in ("humaneval", "stdlib") for p in load_prompts(name, args.prompts)]
    builder = make_builder("dartree-pruned", backend="fast", budget=16, width=12)
    head = bundle.heads["gru"]
    own = SpeculativeDecoder(HFTarget(model, layer_ids=tuple(bundle.drafter.target_layer_ids)), bundle.drafter,
                             builder, head)
    ways = {
        "dartree generate": lambda p: torch.cat([p, own.generate(p, n).tokens], 1),
        "custom_generate": lambda p: model.generate(p, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                                    eos_token_id=None, pad_token_id=0,
                                                    custom_generate=dartree.hf.generate,
                                                    drafter=bundle.drafter, builder=builder, head=head),
        "hf generate": lambda p: model.generate(p, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                                eos_token_id=None, pad_token_id=0),
    }
    times = {(w, i): [] for w in ways for i in range(len(prompts))}
    tokens = dict.fromkeys(ways, 0)
    for rep in range(args.reps + 1):                    # the first repetition warms up
        for i, p in enumerate(prompts):
            outs = {}
            for w in (list(ways) if rep % 2 else list(ways)[::-1]):
                start = time.perf_counter()
                outs[w] = ways[w](p)
                if rep:
                    times[(w, i)].append(time.perf_counter() - start)
                    tokens[w] += outs[w].shape[1] - p.shape[1]
            if not all(o.tolist() == outs["hf generate"].tolist() for o in outs.values()):
                raise SystemExit(f"prompt {i}: the outputs differ")
    base = "dartree generate"
    for w in ways:
        rate = tokens[w] / sum(sum(times[(w, i)]) for i in range(len(prompts)))
        ratio = statistics.median(statistics.median(b / t for b, t in zip(times[(base, i)], times[(w, i)],
                                                                          strict=True)) for i in range(len(prompts)))
        print(f"{w:18s} {rate:8.1f} tok/s   speed x{ratio:.3f} of dartree's own generate")


if __name__ == "__main__":
    main()
