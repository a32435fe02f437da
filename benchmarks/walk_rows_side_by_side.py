"""The verify stage's two ways on the CPU, side by side in one process: every round scoring the root only
(the LM head then runs once per accepted node in the walk: the loop before ``WalkRows``) against the
decoder's own choice (``dartree.rounds.WalkRows``: every node in one LM-head call while the walks are
long, the root only while they are short), per method, interleaved prompt by prompt.

    taskset -c 0 .venv/bin/python benchmarks/walk_rows_side_by_side.py \\
        --methods ddtree16,pruned16,chain,corrected-chain [--prompts 4] [--reps 5] [--temperature 0]

Every decode must equal AR token for token (at T > 0 with a ``KeyedSampler``).  Reported per method:
tokens/s both ways and the median over prompts of the median paired time ratio (root only / chosen).
"""

from __future__ import annotations

import argparse

import torch
from common import checked_times, print_pairs

import dartree.decode as decode
from dartree import SpeculativeDecoder, generate_ar, make_builder
from dartree.eval.bundles import encode, load_bundle
from dartree.eval.datasets import load_prompts
from dartree.models.target import HFTarget
from dartree.rounds import WalkRows
from dartree.verify import KeyedSampler

#: name -> (builder, settings, head)
METHODS = {
    "chain": ("chain", {}, None),
    "ddtree16": ("ddtree", {"budget": 16}, None),
    "ddtree64": ("ddtree", {"budget": 64}, None),
    "pruned16": ("dartree-pruned", {"budget": 16, "width": 12}, "gru"),
    "pruned64": ("dartree-pruned", {"budget": 64, "width": 12}, "gru"),
    "corrected-chain": ("corrected-chain", {}, "gru"),
}


class RootOnly(WalkRows):
    """Every round scores the root only (where allowed): the loop before WalkRows."""

    def logits(self, nodes: int) -> str:
        return "root" if self.allowed else "all"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", default="ddtree16,pruned16,chain", help=f"comma-separated of {', '.join(METHODS)}")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per set (HumanEval, stdlib, packages)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args()
    names = args.methods.split(",")
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        parser.error(f"--methods: unknown {unknown}; choose from {list(METHODS)}")
    torch.set_num_threads(1)
    bundle = load_bundle("pystdlib-tiny")
    prompts = [torch.tensor([encode(bundle.tokenizer, p.text)[-256:]])
               for name in ("humaneval", "stdlib", "packages") for p in load_prompts(name, args.prompts)]
    kw = {} if args.temperature == 0 else {"temperature": args.temperature, "sampler": KeyedSampler(7)}
    layers = tuple(bundle.drafter.target_layer_ids)
    decoders = {}
    for name in names:
        builder, settings, head = METHODS[name]
        for way in ("root", "chosen"):
            decoders[(name, way)] = SpeculativeDecoder(HFTarget(bundle.target, layer_ids=layers), bundle.drafter,
                                                       make_builder(builder, backend="fast", **settings),
                                                       head=None if head is None else bundle.heads[head])

    def run(key, prompt):
        decode.WalkRows = RootOnly if key[1] == "root" else WalkRows     # what generate builds per call
        try:
            return decoders[key].generate(prompt, args.new_tokens, **kw).tokens
        finally:
            decode.WalkRows = WalkRows

    refs = [generate_ar(bundle.target, p, args.new_tokens, **kw).tokens for p in prompts]
    times = checked_times(run, list(decoders), prompts, refs, args.reps)     # every output equals AR's
    tokens = args.new_tokens * len(prompts)
    print(f"{len(prompts)} prompts x {args.new_tokens} tokens, T={args.temperature:g}, {args.reps} interleaved "
          f"repetitions, one thread; ratio = median over prompts of the median paired time root-only / chosen")
    print_pairs(names, times, ("root", "chosen"), ("root only tok/s", "chosen tok/s"), tokens)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
