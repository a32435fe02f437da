"""The CPU's compiled calls against torch's ops, side by side in one process: the GRU head's step
(``dartree.models.heads._NativeSteps``), the float32 RMSNorm (``dartree.models.norms``), the whole build
with the GRU head (``build``: ``dartree.models.heads._NativeBuild``; off, the depth loop runs) and its depth
loop (``loop``: ``_NativeLoop``; off, neither: the builder's per-depth calls with the compiled steps), each
on or off, per method, interleaved prompt by prompt.

    taskset -c 0 .venv/bin/python benchmarks/compiled_calls_side_by_side.py \\
        --methods ar,ddtree16,pruned16,corrected-chain --calls gru,norm [--prompts 4] [--reps 5]
    taskset -c 0 .venv/bin/python benchmarks/compiled_calls_side_by_side.py --methods ddtree16,pruned16 --calls build

Every decode must equal AR token for token both ways (the compiled calls give torch's bits).  Reported
per method: tokens/s with torch's ops and with the compiled calls, and the median over prompts of the
median paired time ratio (torch's ops / compiled): above 1, the compiled calls are faster.
"""

from __future__ import annotations

import argparse

import torch
from common import checked_times, print_pairs

from dartree import SpeculativeDecoder, generate_ar, make_builder
from dartree.eval.bundles import encode, load_bundle
from dartree.eval.datasets import load_prompts
from dartree.models import heads, norms
from dartree.models.target import HFTarget

#: name -> (builder, settings, head); "ar" is dartree's autoregressive loop
METHODS = {
    "ar": None,
    "ddtree16": ("ddtree", {"budget": 16}, None),
    "pruned16": ("dartree-pruned", {"budget": 16, "width": 12}, "gru"),
    "corrected-chain": ("corrected-chain", {}, "gru"),
}
CALLS = ("gru", "norm", "loop", "build")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", default="ar,ddtree16,pruned16", help=f"comma-separated of {', '.join(METHODS)}")
    parser.add_argument("--calls", default="gru,norm", help=f"the compiled calls turned off for 'torch': {CALLS}")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per set (HumanEval, stdlib, packages)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    names, calls = args.methods.split(","), args.calls.split(",")
    for flag, values, allowed in (("--methods", names, METHODS), ("--calls", calls, CALLS)):
        unknown = [v for v in values if v not in allowed]
        if unknown:
            parser.error(f"{flag}: unknown {unknown}; choose from {list(allowed)}")
    torch.set_num_threads(1)
    if "gru" in calls and heads._native_gru() is None or "norm" in calls and norms.lanes() is None \
            or ("loop" in calls or "build" in calls) and heads._native_gru() is None:
        parser.error("--calls: a compiled call asked for is not available here (dartree._native, AVX-512 torch)")
    bundle = load_bundle("pystdlib-tiny")
    prompts = [torch.tensor([encode(bundle.tokenizer, p.text)[-256:]])
               for name in ("humaneval", "stdlib", "packages") for p in load_prompts(name, args.prompts)]
    target = HFTarget(bundle.target, layer_ids=tuple(bundle.drafter.target_layer_ids))
    decoders = {}
    for name in names:
        if METHODS[name] is not None:
            builder, settings, head = METHODS[name]
            decoders[name] = SpeculativeDecoder(target, bundle.drafter,
                                                make_builder(builder, backend="fast", **settings),
                                                head=None if head is None else bundle.heads[head])
    compiled_gru, lanes, loop, whole = heads._native_gru, norms.lanes(), heads._GRUSteps.native_loop, \
        heads.GRUHead.native_build

    def run(key, prompt):
        name, way = key
        if way == "torch":                                   # the compiled calls asked for turned off
            if "gru" in calls:
                heads._native_gru = lambda: None
            if "norm" in calls:
                norms._LANES[0] = None
            if "loop" in calls:
                heads._GRUSteps.native_loop = lambda self, widths: None
            if "loop" in calls or "build" in calls:
                heads.GRUHead.native_build = lambda self, *args: None
        try:
            if name == "ar":
                return generate_ar(target, prompt, args.new_tokens).tokens
            return decoders[name].generate(prompt, args.new_tokens).tokens
        finally:
            heads._native_gru, norms._LANES[0], heads._GRUSteps.native_loop = compiled_gru, lanes, loop
            heads.GRUHead.native_build = whole

    keys = [(name, way) for name in names for way in ("torch", "compiled")]
    refs = [generate_ar(bundle.target, p, args.new_tokens).tokens for p in prompts]
    times = checked_times(run, keys, prompts, refs, args.reps)     # every output equals AR's
    tokens = args.new_tokens * len(prompts)
    print(f"{len(prompts)} prompts x {args.new_tokens} tokens, {args.reps} interleaved repetitions, one thread, "
          f"compiled calls {'+'.join(calls)}; ratio = median over prompts of the median paired time torch / compiled")
    print_pairs(names, times, ("torch", "compiled"), ("torch tok/s", "compiled tok/s"), tokens)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
