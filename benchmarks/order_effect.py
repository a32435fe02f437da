"""Does a decode run slower right after a tree decode?  AR timed right after a tree decode and right after
another AR decode, on the same prompts, interleaved (``dartree bench`` alternates its method order in case)::

    taskset -c 1 .venv/bin/python benchmarks/order_effect.py [--prompts 8] [--reps 3] \\
        [--method corrected-sequoia:budget=16]

Per prompt and repetition: tree, AR (after a tree), AR (after AR), tree, AR (after a tree); T=1 with the generator
sampler, 64 new tokens, one torch thread.  Reported: the median AR time after each, and their ratio (2026-12-07,
one pinned core: 1.019, 0.962, 1.016, 1.002 in four runs: no consistent effect).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dartree.decode import generate_ar
from dartree.eval.bundles import encode, load_bundle
from dartree.eval.datasets import load_prompts
from dartree.eval.methods import make_decoder, parse_method
from dartree.verify.sampling import GeneratorSampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=8, help="HumanEval prompts")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--method", default="corrected-sequoia:budget=16", help="the tree method run before AR")
    args = parser.parse_args()
    torch.set_num_threads(1)
    bundle = load_bundle("pystdlib-tiny")
    prompts = [torch.tensor([encode(bundle.tokenizer, p.text)[-256:]]) for p in load_prompts("humaneval", args.prompts)]
    decoder = make_decoder(bundle, parse_method(args.method), "auto")

    def seconds(run, ids: torch.Tensor, seed: int) -> float:
        sampler = GeneratorSampler(torch.Generator().manual_seed(seed))
        start = time.perf_counter()
        run(ids, 64, 1.0, sampler)
        return time.perf_counter() - start

    def ar(ids, new, temperature, sampler):
        return generate_ar(bundle.target, ids, new, temperature, sampler)

    for ids in prompts[:2]:                                  # warm-up, untimed
        seconds(ar, ids, 0), seconds(decoder.generate, ids, 0)
    after_tree, after_ar = [], []
    for _ in range(args.reps):
        for i, ids in enumerate(prompts):
            seconds(decoder.generate, ids, i)
            after_tree.append(seconds(ar, ids, i))
            after_ar.append(seconds(ar, ids, i))
            seconds(decoder.generate, ids, i)
            after_tree.append(seconds(ar, ids, i))
    tree_ms, ar_ms = 1e3 * statistics.median(after_tree), 1e3 * statistics.median(after_ar)
    print(f"AR after {args.method}: {tree_ms:.2f} ms; after AR: {ar_ms:.2f} ms; ratio {tree_ms / ar_ms:.3f} "
          f"({len(after_tree)} / {len(after_ar)} decodes)")


if __name__ == "__main__":
    main()
