"""How much the prompts drawn move a measurement: rounds per block of prompts on the bundled zoo.

Decodes the first ``--prompts`` prompts of each dataset with one ``dartree-pruned`` setting (T=0,
greedy: rounds are deterministic, no timing) and prints tau per prompt and the rounds each block of
``--block`` consecutive prompts takes for its tokens.  A forecast made on one block of prompts can
only be as close to another block's measurement as those blocks' rounds are alike (docs/results.md,
the tuner's forecast section).  One thread:

    taskset -c 0 .venv/bin/python benchmarks/prompt_spread.py [--prompts 32] [--block 8] [--budget 16 --width 8]
"""

from __future__ import annotations

import argparse

import torch

from dartree import SpeculativeDecoder, make_builder
from dartree.eval.bundles import encode
from dartree.eval.datasets import load_prompts
from dartree.models import zoo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--block", type=int, default=8)
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--beta", type=float, default=-0.2)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--datasets", nargs="+", default=["humaneval", "stdlib"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    bundle = zoo.load("pystdlib-tiny")
    builder = make_builder("dartree-pruned", backend="fast", budget=args.budget, width=args.width, beta=args.beta)
    decoder = SpeculativeDecoder(bundle.target, bundle.drafter, builder, head=bundle.heads["gru"])
    print(f"dartree-pruned B={args.budget} W={args.width} beta={args.beta:g}, {args.new_tokens} new tokens, T=0")
    for name in args.datasets:
        rounds = []
        for p in load_prompts(name, args.prompts):
            ids = torch.tensor(encode(bundle.tokenizer, p.text)[-256:])
            rounds.append(len(decoder.generate(ids, args.new_tokens).rounds))
        taus = [(args.new_tokens - 1) / r for r in rounds]
        print(f"{name}: tau per prompt " + " ".join(f"{t:.1f}" for t in taus))
        for start in range(0, len(rounds), args.block):
            part = rounds[start:start + args.block]
            tau = (args.new_tokens - 1) * len(part) / sum(part)
            print(f"  prompts {start}-{start + len(part) - 1}: {sum(part)} rounds, tau {tau:.2f}")


if __name__ == "__main__":
    main()
