"""How much the prompts drawn move a measurement: rounds per block of prompts on the bundled zoo.

Decodes the first ``--prompts`` prompts of each dataset with one ``dartree-pruned`` setting (T=0,
greedy: rounds are deterministic, no timing) and prints tau per prompt and the rounds each block of
``--block`` consecutive prompts takes for its tokens.  A forecast made on one block of prompts can
only be as close to another block's measurement as those blocks' rounds are alike (docs/results.md,
the tuner's forecast section).

``--split-sizes`` then asks how often a forecast made on n calibration prompts can land within
``--tolerance`` of a measurement on n other prompts when nothing but the prompts differ: over
``--splits`` random disjoint draws of n + n of the decoded prompts, the share whose rounds (the
time of a decode at a fixed cost per round, so the tokens/s error of a perfect cost model) agree
within the tolerance, and the split the bench makes (evaluation = the first n prompts, calibration =
the next n).  A dataset with fewer prompts than asked for decodes all it has.  One thread:

    taskset -c 0 .venv/bin/python benchmarks/prompt_spread.py [--prompts 32] [--block 8] [--budget 16 --width 8]
"""

from __future__ import annotations

import argparse
import random

import torch

from dartree import SpeculativeDecoder, make_builder
from dartree.eval.bundles import encode
from dartree.eval.datasets import count_prompts, load_prompts
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
    parser.add_argument("--split-sizes", type=int, nargs="*", default=[8, 16])
    parser.add_argument("--splits", type=int, default=20000)
    parser.add_argument("--tolerance", type=float, default=0.15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    bundle = zoo.load("pystdlib-tiny")
    builder = make_builder("dartree-pruned", backend="fast", budget=args.budget, width=args.width, beta=args.beta)
    decoder = SpeculativeDecoder(bundle.target, bundle.drafter, builder, head=bundle.heads["gru"])
    print(f"dartree-pruned B={args.budget} W={args.width} beta={args.beta:g}, {args.new_tokens} new tokens, T=0")
    for name in args.datasets:
        rounds = []
        for p in _prompts(name, args.prompts):
            ids = torch.tensor(encode(bundle.tokenizer, p.text)[-256:])
            rounds.append(len(decoder.generate(ids, args.new_tokens).rounds))
        taus = [(args.new_tokens - 1) / r for r in rounds]
        print(f"{name}: tau per prompt " + " ".join(f"{t:.1f}" for t in taus))
        for start in range(0, len(rounds), args.block):
            part = rounds[start:start + args.block]
            tau = (args.new_tokens - 1) * len(part) / sum(part)
            print(f"  prompts {start}-{start + len(part) - 1}: {sum(part)} rounds, tau {tau:.2f}")
        for n in args.split_sizes:
            if 2 * n > len(rounds):
                print(f"  n={n}: needs {2 * n} prompts, {name} decoded {len(rounds)}")
                continue
            share, p90 = _split_errors(rounds, n, args.splits, args.tolerance)
            bench = sum(rounds[:n]) / sum(rounds[n:2 * n]) - 1.0
            print(f"  n={n} + {n}: {share:.0%} of {args.splits} random splits within {args.tolerance:.0%} "
                  f"(90th percentile |error| {p90:.0%}); the bench's split (first {n} evaluated, next {n} "
                  f"calibrate): {bench:+.0%}")


def _prompts(name: str, wanted: int):
    """The first ``wanted`` prompts of ``name``, or all it has when it has fewer."""
    return load_prompts(name, min(wanted, count_prompts(name)))


def _split_errors(rounds: list[int], n: int, splits: int, tolerance: float) -> tuple[float, float]:
    """Over ``splits`` random disjoint (calibration, evaluation) draws of ``n`` prompts each (seeded): the
    share with ``|rounds(evaluation) / rounds(calibration) - 1| <= tolerance``, and that error's 90th
    percentile (the forecast's tokens/s error when the cost per round is known exactly)."""
    rng = random.Random(0)
    errors = []
    for _ in range(splits):
        drawn = rng.sample(range(len(rounds)), 2 * n)
        errors.append(abs(sum(rounds[i] for i in drawn[:n]) / sum(rounds[i] for i in drawn[n:]) - 1.0))
    errors.sort()
    return sum(e <= tolerance for e in errors) / splits, errors[int(0.9 * splits)]


if __name__ == "__main__":
    main()
