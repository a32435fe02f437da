"""The heads' ``prepare_block`` on the bundled zoo: build time per round with and without it.

Decodes a few prompts with ``dartree-pruned`` (T=0) to collect the real blocks of every round, then
times ``builder.build`` on those blocks for the head as shipped and for the same head with only its
protocol calls (``prepare_block`` hidden), interleaved block by block, one thread, and reports medians
and the ratio.  The trees are checked equal (same nodes, scores bit for bit) before timing.  Run
pinned to one core:

    taskset -c 0 .venv/bin/python benchmarks/head_steps_zoo.py [--prompts 3] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bound_zoo import Recorder  # the sibling scripts: run as a script, benchmarks/ is on sys.path
from common import draft_block, gru_head

from dartree import SpeculativeDecoder, make_builder
from dartree.eval.datasets import load_prompts
from dartree.models import zoo


class ProtocolOnly:
    """``head`` without ``prepare_block``: the builder makes the protocol calls."""

    def __init__(self, head) -> None:
        self.initial_state, self.logits, self.advance = head.initial_state, head.logits, head.advance
        self.advance_logits = head.advance_logits


METHODS = {"dartree-pruned B=16 W=12": ("dartree-pruned", {"budget": 16, "width": 12}),
           "dartree-pruned B=64 W=12": ("dartree-pruned", {"budget": 64, "width": 12}),
           "dartree-fixed B=16": ("dartree-fixed", {"budget": 16}),
           "corrected-chain": ("corrected-chain", {})}


def compare(label: str, builder, blocks, heads: dict, repeats: int) -> None:
    """Print the median build time of each head on ``blocks`` (interleaved) and the per-block ratio."""
    times = {k: [[] for _ in blocks] for k in heads}
    with torch.inference_mode():
        for block in blocks:
            a, b = (builder.build(block, h) for h in heads.values())
            assert a.canonical() == b.canonical() and torch.equal(a.scores, b.scores)
        for _ in range(repeats):
            for i, block in enumerate(blocks):
                for k, h in heads.items():
                    t0 = time.perf_counter()
                    builder.build(block, h)
                    times[k][i].append(time.perf_counter() - t0)
    med = {k: statistics.median(statistics.median(r) for r in v) for k, v in times.items()}
    ratios = [statistics.median(p) / statistics.median(q) for p, q in zip(times["prepared"], times["protocol"],
                                                                          strict=True)]
    print(f"{label}: prepared {1e3 * med['prepared']:.3f} ms, protocol calls {1e3 * med['protocol']:.3f} ms, "
          f"median per-round ratio {statistics.median(ratios):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=3, help="prompts per dataset (humaneval, stdlib)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--head", choices=["gru", "markov"], default="gru")
    args = parser.parse_args()
    torch.set_num_threads(1)
    bundle = zoo.load("pystdlib-tiny")
    head = bundle.heads[args.head]
    prompts = [p for d in ("humaneval", "stdlib") for p in load_prompts(d, args.prompts)]
    rec = Recorder(make_builder("dartree-pruned", backend="fast", budget=16, width=12))
    dec = SpeculativeDecoder(bundle.target, bundle.drafter, rec, head=head)
    for p in prompts:
        dec.generate(bundle.tokenizer(p.text, return_tensors="pt").input_ids[0], args.new_tokens)
    heads = {"prepared": head, "protocol": ProtocolOnly(head)}
    print(f"{len(rec.blocks)} blocks from {len(prompts)} prompts, {args.head} head, {args.repeats} repeats; "
          f"build ms per round, median over rounds of the median over repeats")
    for label, (name, cfg) in METHODS.items():
        compare(label, make_builder(name, backend="fast", **cfg), rec.blocks, heads, args.repeats)
    synthetic = gru_head(4096)
    blocks = [draft_block(4096)]
    print("synthetic GRU head of benchmarks.common (H=G=512, E=256, V=4096), its random block, 20 x repeats:")
    for label, (name, cfg) in METHODS.items():
        compare(label, make_builder(name, backend="fast", **cfg), blocks,
                {"prepared": synthetic, "protocol": ProtocolOnly(synthetic)}, 20 * args.repeats)

if __name__ == "__main__":
    main()
