"""One process of an A/B of the decoding loop between two checkouts: decode the same prompts with the
same methods and print tokens/s per method plus a digest of every output (equal digests: equal tokens).

Run it alternately from each checkout, one pinned core (the machine is shared: interleave the runs)::

    for i in 1 2 3; do for tree in /tmp/base /work/main; do
        PYTHONPATH=$tree taskset -c 0 .venv/bin/python benchmarks/engine_ab.py --label $tree; done; done

It uses only the public API, so that it runs on both sides of an API change.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time

import torch

from dartree import SpeculativeDecoder, generate_ar, make_builder
from dartree.eval.bundles import encode, load_bundle
from dartree.eval.datasets import load_prompts
from dartree.models.target import HFTarget

METHODS = {
    "ar": None,
    "chain": ("chain", {}, None),
    "ddtree16": ("ddtree", {"budget": 16}, None),
    "pruned16": ("dartree-pruned", {"budget": 16, "width": 12}, "gru"),
    "corrected-chain": ("corrected-chain", {}, "gru"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--label", default="")
    parser.add_argument("--methods", default="ar,ddtree16,pruned16,corrected-chain")
    parser.add_argument("--prompts", type=int, default=3, help="prompts per set (HumanEval, stdlib)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    bundle = load_bundle("pystdlib-tiny")
    prompts = [torch.tensor([encode(bundle.tokenizer, p.text)[-256:]])
               for name in ("humaneval", "stdlib") for p in load_prompts(name, args.prompts)]
    target = HFTarget(bundle.target, layer_ids=tuple(bundle.drafter.target_layer_ids))
    names = args.methods.split(",")
    runs = {}
    for name in names:
        if METHODS[name] is None:
            runs[name] = lambda p, **kw: generate_ar(target, p, args.new_tokens, **kw)
        else:
            builder, settings, head = METHODS[name]
            dec = SpeculativeDecoder(target, bundle.drafter, make_builder(builder, backend="fast", **settings),
                                     head=None if head is None else bundle.heads[head])
            runs[name] = lambda p, dec=dec, **kw: dec.generate(p, args.new_tokens, **kw)
    seconds = {n: [] for n in names}
    tokens = {n: 0 for n in names}
    digest = {n: hashlib.sha256() for n in names}
    for rep in range(args.reps + 1):                # the first repetition warms up
        for p in prompts:
            for name in (names if rep % 2 else names[::-1]):
                kw = {}
                if args.temperature > 0:
                    from dartree import KeyedSampler
                    kw = {"temperature": args.temperature, "sampler": KeyedSampler(7)}
                start = time.perf_counter()
                out = runs[name](p, **kw)
                t = time.perf_counter() - start
                if rep:
                    seconds[name].append(t)
                    tokens[name] += out.tokens.shape[1]
                    digest[name].update(str(out.tokens.tolist()).encode())
    for name in names:
        per = statistics.median(seconds[name]) * len(seconds[name])
        print(f"{args.label}\t{name}\ttok/s={tokens[name] / sum(seconds[name]):.1f}"
              f"\tmedian-based={tokens[name] / per:.1f}\tdigest={digest[name].hexdigest()[:12]}")


if __name__ == "__main__":
    main()
