"""torch.compile (CPU inductor) of the target's forward against dartree's lean forward and HF's own, side by side
in one process: an AR step and a 17-node tree forward after a 256-token prefix, interleaved, medians.

    taskset -c 1 .venv/bin/python benchmarks/compile_side_by_side.py [--reps 30]

Each HF call gets the same cache state: the prefix's keys and values copied into a fresh DynamicCache (the
copy is inside the timed region for both HF ways alike); the lean forward runs as the decoder runs it, a
pending forward on the prefilled target, then rolled back. Reported: median ms per forward, the ratio to the
lean forward, the largest absolute difference of the logits from HF's eager forward, and whether they are
equal bit for bit (the lean forward is only used when they are: docs/verification.md, "The lean forward"). The
GPU path of torch.compile is mode="reduce-overhead" (CUDA graphs), which this CPU-only machine cannot measure.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers.cache_utils import DynamicCache

from dartree import DraftBlock, make_builder
from dartree.eval.bundles import load_bundle
from dartree.models.target import HFTarget
from dartree.verify.inputs import tree_inputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--prefix", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_bundle("pystdlib-tiny").target
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (1, args.prefix), generator=g)
    with torch.no_grad():
        base = DynamicCache(config=model.config)
        model(input_ids=prefix, cache=base, use_cache=True)
    layers = [(layer.keys.clone(), layer.values.clone()) for layer in base.layers]

    def fresh() -> DynamicCache:
        cache = DynamicCache(config=model.config)
        for i, (k, v) in enumerate(layers):
            cache.update(k.clone(), v.clone(), i)
        return cache

    block = DraftBlock(logits=torch.randn(1, 15, vocab, generator=g) * 3, root=torch.tensor([7]))
    tree = make_builder("ddtree", backend="fast", budget=16).build(block)          # 17 nodes, root included
    inputs = tree_inputs(tree, args.prefix)
    target = HFTarget(model)
    assert target.forward_path == "lean", target.forward_note
    compiled = torch.compile(model, dynamic=True)
    cases = {
        "ar step": dict(input_ids=torch.randint(0, vocab, (1, 1), generator=g),
                        position_ids=torch.tensor([[args.prefix]]), attention_mask=None),
        "tree of 17": dict(input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                           attention_mask=inputs.mask_for(target.attn_implementation, target.dtype)),
    }

    def hf(fn, case):
        return fn(**case, cache=fresh(), use_cache=True).logits

    target.prefill(prefix)

    def lean(case):                      # the decoder's calls: a pending forward, then dropped (rollback)
        if case is cases["ar step"]:
            out = target.forward_next(case["input_ids"][:, 0])
        else:
            out = target.forward_tree(target.tree_inputs(tree))
        target.rollback()
        return out.logits

    ways = {"hf eager": lambda c: hf(model, c), "hf compiled": lambda c: hf(compiled, c), "lean": lean}
    with torch.no_grad():
        start = time.perf_counter()
        for case in cases.values():
            hf(compiled, case)               # compile (dynamic shapes: one graph for both cases if it can)
        compile_s = time.perf_counter() - start
        print(f"torch.compile(dynamic=True) first calls: {compile_s:.1f} s")
        for name, case in cases.items():
            want = hf(model, case)
            times = {w: [] for w in ways}
            for rep in range(args.reps):
                for w in (list(ways) if rep % 2 else list(ways)[::-1]):
                    start = time.perf_counter()
                    got = ways[w](case)
                    times[w].append(time.perf_counter() - start)
            lean_ms = 1e3 * statistics.median(times["lean"])
            for w in ways:
                got = ways[w](case)
                diff = (got.float() - want.float()).abs().max().item()
                ms = 1e3 * statistics.median(times[w])
                print(f"{name:12s} {w:12s} {ms:7.3f} ms  x{ms / lean_ms:5.2f} of lean  max|diff| {diff:.3g}  "
                      f"bit-equal {torch.equal(got, want)}")


if __name__ == "__main__":
    main()
