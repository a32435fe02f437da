"""dartree-pruned's exact bound on the bundled zoo: head calls and build time per round, bound on vs off.

Decodes a few prompts with the GRU head (T=0, the trees are identical either way, so one decoding per
budget gives the real blocks of every round), then times ``builder.build`` on those blocks with the
bound on and off, interleaved, one thread, and reports medians.  Run pinned to one core:

    taskset -c 0 .venv/bin/python benchmarks/bound_zoo.py [--prompts 3] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dartree import SpeculativeDecoder, make_builder
from dartree.eval.datasets import load_prompts
from dartree.fast import expansion
from dartree.models import zoo


class Recorder:
    """A builder proxy that keeps every block it is asked to build from."""

    def __init__(self, builder) -> None:
        self._builder = builder
        self.blocks = []

    def build(self, block, head=None):
        self.blocks.append(block)
        return self._builder.build(block, head)

    def __getattr__(self, name):
        return getattr(self._builder, name)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=3, help="prompts per dataset (humaneval, stdlib)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budgets", type=int, nargs="+", default=[16, 64])
    args = parser.parse_args()
    torch.set_num_threads(1)
    bundle = zoo.load("pystdlib-tiny")
    head = bundle.heads["gru"]
    prompts = [p for d in ("humaneval", "stdlib") for p in load_prompts(d, args.prompts)]
    for budget in args.budgets:
        cfg = {"budget": budget, "width": 12}
        rec = Recorder(make_builder("dartree-pruned", backend="fast", **cfg))
        dec = SpeculativeDecoder(bundle.target, bundle.drafter, rec, head=head)
        for p in prompts:
            ids = bundle.tokenizer(p.text, return_tensors="pt").input_ids[0]
            dec.generate(ids, args.new_tokens)
        on = make_builder("dartree-pruned", backend="fast", bound=True, **cfg)
        off = make_builder("dartree-pruned", backend="fast", bound=False, **cfg)
        depths = {True: [], False: []}
        times = {True: [], False: []}
        with torch.no_grad():
            for block in rec.blocks:
                a, b = on.build(block, head), off.build(block, head)  # warm, and the same tree
                assert a.canonical() == b.canonical() and torch.equal(a.scores, b.scores)
                for _ in range(args.repeats):
                    for flag, builder in ((True, on), (False, off)):
                        t0 = time.perf_counter()
                        builder.build(block, head)
                        times[flag].append((len(depths[flag]), time.perf_counter() - t0))
                        depths[flag].append(expansion.last().depths)
        per_round = {f: [statistics.median(t for i, t in times[f] if i // args.repeats == r)
                         for r in range(len(rec.blocks))] for f in (True, False)}
        gamma = rec.blocks[0].gamma
        print(f"B={budget} W=12 K=64 gamma={gamma}: {len(rec.blocks)} rounds, "
              f"head logits evaluations per round (one head call each) "
              f"off {statistics.mean(depths[False]):.2f}, on {statistics.mean(depths[True]):.2f}; "
              f"build ms per round (median over rounds) off {1e3 * statistics.median(per_round[False]):.3f}, "
              f"on {1e3 * statistics.median(per_round[True]):.3f}; "
              f"mean off {1e3 * statistics.mean(per_round[False]):.3f}, "
              f"on {1e3 * statistics.mean(per_round[True]):.3f}")


if __name__ == "__main__":
    main()
