"""Stage 6, ``export``: weights (safetensors) and configs of the target, tokenizer, drafter and heads, and the
stages' final statistics (``training_stats.json``), written to a hidden folder beside ``--out`` (default
``dartree/models/zoo_weights/<name>``) and put in place whole (:func:`publish`): an interrupted export leaves
the earlier bundle whole, where writing in place left a mix of new and old weights."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import torch

from dartree.training.common import log
from dartree.training.drafter import load_trained_drafter
from dartree.training.target import load_target

__all__ = ["stage_export", "publish", "EXPORTED"]

#: what an export writes into ``--out`` (``gru_head_<G>x<E>`` folders too, with several GRU widths)
EXPORTED = ("target", "drafter", "gru_head", "markov_head", "tokenizer.json", "training_stats.json")


def publish(staged: Path, out: Path) -> None:
    """Put the bundle written to ``staged`` at ``out``.  ``out`` missing: one rename.  ``out`` holding an
    earlier export (nothing but :data:`EXPORTED` names): renamed aside, ``staged`` renamed in, the earlier one
    removed (a kill between the two renames leaves the earlier bundle whole at ``.<name>.previous``, and
    ``out`` missing, not a mix).  ``out`` holding anything else is refused, nothing moved: a folder swap
    would remove it."""
    out = Path(out)
    if os.path.lexists(out):
        if not out.is_dir():
            raise ValueError(f"--out: {out} is a file, not a folder")
        others = sorted(p.name for p in out.iterdir() if p.name not in EXPORTED and not p.name.startswith("gru_head_"))
        if others:
            raise ValueError(f"--out: {out} holds {others}, which an export does not write; the bundle is left in "
                             f"{staged}: move it there yourself, or pick an --out that holds only an earlier export")
        previous = out.parent / f".{out.name}.previous"
        if os.path.lexists(previous):
            shutil.rmtree(previous)
        os.rename(out, previous)
        os.rename(staged, out)
        shutil.rmtree(previous)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staged, out)


def stage_export(work: Path, args: argparse.Namespace) -> None:
    from dartree.models.heads import GRUHead, MarkovHead
    from dartree.models.loaders import save_drafter, save_gru_head, save_markov_head

    final = Path(args.out)
    out = final.parent / f".{final.name}.export"        # written here, then put in place whole (publish)
    if os.path.lexists(out):
        shutil.rmtree(out)                               # a killed export's
    out.mkdir(parents=True)
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
    publish(out, final)
    log(f"export: wrote {final}")
