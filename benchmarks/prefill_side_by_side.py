"""Prefill to the first token, side by side on one pinned core: dartree's ``HFTarget.prefill`` (lean
forward, and through the model's own forward) against the model called the way z-lab's
``dflash_generate`` and HF ``generate`` call it (``logits_to_keep=1``, hidden states on).

    taskset -c 0 .venv/bin/python benchmarks/prefill_side_by_side.py --prompts 2 --reps 5

Prompts: ``--prompts`` per set of HumanEval, stdlib and held-out packages (the last 256 tokens),
interleaved prompt by prompt; reported: the median per prefill and the median paired ratio against
the reference.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import DynamicCache

from dartree.eval.bundles import encode, load_bundle
from dartree.eval.datasets import load_prompts
from dartree.models.target import HFTarget


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=2, help="prompts per set (3 sets)")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    bundle = load_bundle("pystdlib-tiny")
    model = bundle.target
    prompts = [torch.tensor([encode(bundle.tokenizer, p.text)[-256:]])
               for name in ("humaneval", "stdlib", "packages") for p in load_prompts(name, args.prompts)]
    layers = tuple(bundle.drafter.target_layer_ids)
    lean, own = HFTarget(model, layer_ids=layers), HFTarget(model, layer_ids=layers, forward="hf")

    def reference(ids: torch.Tensor) -> object:
        return model(input_ids=ids, cache=DynamicCache(config=model.config), use_cache=True, logits_to_keep=1,
                     output_hidden_states=True)

    runs = {"dartree (lean forward)": lambda ids: lean.prefill(ids, logits="last"),
            "dartree (model's forward)": lambda ids: own.prefill(ids, logits="last"),
            "reference": reference}
    for run in runs.values():                                # warm up
        for ids in prompts:
            run(ids)
    times = {name: [] for name in runs}
    for _ in range(args.reps):
        for ids in prompts:
            for name, run in runs.items():
                start = time.perf_counter()
                run(ids)
                times[name].append(time.perf_counter() - start)
    print(f"{len(prompts)} prompts of {[p.shape[1] for p in prompts]} tokens, {args.reps} interleaved repetitions")
    for name in runs:
        ratio = statistics.median(r / t for r, t in zip(times["reference"], times[name], strict=True))
        print(f"{name:28s} median {statistics.median(times[name]) * 1e3:6.2f} ms   x reference speed {ratio:.3f}")


if __name__ == "__main__":
    with torch.inference_mode():
        main()
