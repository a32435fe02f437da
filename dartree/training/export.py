"""Stage 6, ``export``: weights (safetensors) and configs of the target, tokenizer, drafter and heads
written to ``--out`` (default: the package's ``dartree/models/zoo_weights/<name>``), with the stages'
final statistics in ``training_stats.json``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from dartree.training.common import log
from dartree.training.drafter import load_trained_drafter
from dartree.training.target import load_target

__all__ = ["stage_export"]


def stage_export(work: Path, args: argparse.Namespace) -> None:
    from dartree.models.heads import GRUHead, MarkovHead
    from dartree.models.loaders import save_drafter, save_gru_head, save_markov_head

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    model = load_target(work)
    model.save_pretrained(out / "target")
    (out / "tokenizer.json").write_bytes((work / "tokenizer.json").read_bytes())
    drafter = load_trained_drafter(work, model)
    save_drafter(drafter, out / "drafter")
    heads = torch.load(work / "heads_final.pt", weights_only=False)
    c = model.config
    widths = heads.get("gru_widths") or [{"config": heads["gru_config"], "state": heads["gru"]}]
    for i, width in enumerate(widths):      # the first as gru_head/; with several, each as gru_head_<G>x<E>/ too
        gru = GRUHead(c.hidden_size, c.vocab_size, **width["config"])
        gru.load_state_dict(width["state"])
        if i == 0:
            save_gru_head(gru, out / "gru_head", drafter.config)
        if len(widths) > 1:
            save_gru_head(gru, out / f"gru_head_{gru.gru_hidden_dim}x{gru.emb_dim}", drafter.config)
    markov = MarkovHead(c.vocab_size, **heads["markov_config"])
    markov.load_state_dict(heads["markov"])
    save_markov_head(markov, out / "markov_head", drafter.config)
    stats = {}
    for name in ("target", "drafter", "heads"):
        f = work / f"{name}_stats.json"
        if f.exists():
            s = json.loads(f.read_text())
            s.pop("history", None)
            stats[name] = s
    (out / "training_stats.json").write_text(json.dumps(stats, indent=1))
    log(f"export: wrote {out}")
