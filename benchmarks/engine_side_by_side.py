"""Today's decoding loop against another checkout's, side by side in one process, prompt by prompt.

The other checkout is imported as the package ``dartree_base`` (a copy of its ``dartree/`` with the
package name rewritten, its compiled ``_native`` module beside it), so both loops run on the same core
under the same load, interleaved (the order alternates every repetition)::

    git worktree add /tmp/base <commit> && cp dartree/_native*.so /tmp/base/dartree/   # same C source
    mkdir -p /tmp/basepkg && cp -r /tmp/base/dartree /tmp/basepkg/dartree_base
    grep -rl dartree --include=*.py /tmp/basepkg/dartree_base | xargs sed -i -E \\
        -e 's/\\bdartree\\.([a-z_])/dartree_base.\\1/g' -e 's/from dartree import/from dartree_base import/g' \\
        -e 's/"dartree\\./"dartree_base./g'
    PYTHONPATH=/tmp/basepkg taskset -c 0 .venv/bin/python benchmarks/engine_side_by_side.py --reps 5

Each side loads its own bundle.  Reported per method: tokens/s of each side and the median over prompts of
the median paired time ratio (base / new: above 1, today's loop is faster); every output must be equal
on both sides (and, at T=0, to AR).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time

import torch

METHODS = {
    "ar": None,
    "chain": ("chain", {}, None),
    "ddtree16": ("ddtree", {"budget": 16}, None),
    "pruned16": ("dartree-pruned", {"budget": 16, "width": 12}, "gru"),
    "corrected-chain": ("corrected-chain", {}, "gru"),
}


def side(package: str, names: list[str], new_tokens: int, prompts_per_set: int):
    """The decode callables of one package, and its prompts."""
    root = importlib.import_module(package)
    bundles = importlib.import_module(f"{package}.eval.bundles")
    datasets = importlib.import_module(f"{package}.eval.datasets")
    target_mod = importlib.import_module(f"{package}.models.target")
    bundle = bundles.load_bundle("pystdlib-tiny")
    prompts = [torch.tensor([bundles.encode(bundle.tokenizer, p.text)[-256:]])
               for name in ("humaneval", "stdlib") for p in datasets.load_prompts(name, prompts_per_set)]
    target = target_mod.HFTarget(bundle.target, layer_ids=tuple(bundle.drafter.target_layer_ids))
    runs = {}
    for name in names:
        if METHODS[name] is None:
            runs[name] = lambda p: root.generate_ar(target, p, new_tokens)
        else:
            builder, settings, head = METHODS[name]
            made = root.make_builder(builder, backend="fast", **settings)
            dec = root.SpeculativeDecoder(target, bundle.drafter, made,
                                          head=None if head is None else bundle.heads[head])
            runs[name] = lambda p, dec=dec: dec.generate(p, new_tokens)
    return runs, prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", default="ar,ddtree16,pruned16,corrected-chain")
    parser.add_argument("--prompts", type=int, default=3, help="prompts per set (HumanEval, stdlib)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    names = args.methods.split(",")
    sides = {key: side(pkg, names, args.new_tokens, args.prompts) for key, pkg in (("base", "dartree_base"),
                                                                                    ("new", "dartree"))}
    prompts = sides["new"][1]
    assert all(torch.equal(a, b) for a, b in zip(prompts, sides["base"][1], strict=True))
    times = {(n, k, i): [] for n in names for k in sides for i in range(len(prompts))}
    tokens = {(n, k): 0 for n in names for k in sides}
    for rep in range(args.reps + 1):                 # the first repetition warms up
        for i, p in enumerate(prompts):
            for name in names:
                outs = {}
                for key in (("base", "new") if rep % 2 else ("new", "base")):
                    start = time.perf_counter()
                    outs[key] = sides[key][0][name](p)
                    if rep:
                        times[(name, key, i)].append(time.perf_counter() - start)
                        tokens[(name, key)] += outs[key].tokens.shape[1]
                if outs["base"].tokens.tolist() != outs["new"].tokens.tolist():
                    raise SystemExit(f"{name}: prompt {i}: the two loops' outputs differ")
    print(f"{'method':<16} {'base tok/s':>10} {'new tok/s':>10} {'base/new time':>14}")
    for name in names:
        rate = {k: tokens[(name, k)] / sum(sum(times[(name, k, i)]) for i in range(len(prompts))) for k in sides}
        ratio = statistics.median(statistics.median(b / n for b, n in zip(times[(name, "base", i)],
                                                                          times[(name, "new", i)], strict=True))
                                  for i in range(len(prompts)))
        print(f"{name:<16} {rate['base']:>10.1f} {rate['new']:>10.1f} {ratio:>14.3f}")


if __name__ == "__main__":
    main()
