"""The driver: command-line options and the stages in order (``python -m dartree.training``)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from dartree.training import __doc__ as OVERVIEW
from dartree.training.common import ZOO_NAME
from dartree.training.data import stage_data
from dartree.training.distill import stage_distill
from dartree.training.drafter import stage_drafter
from dartree.training.export import stage_export
from dartree.training.heads import stage_heads
from dartree.training.target import stage_target
from dartree.training.tau import stage_tau

__all__ = ["parse_args", "main"]

ZOO_DIR = Path(__file__).resolve().parents[1] / "models" / "zoo_weights"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dartree.training", description=OVERVIEW,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    default_work = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dartree" / "zoo_train"
    p.add_argument("--work", type=Path, default=default_work, help="scratch dir for checkpoints")
    p.add_argument("--out", type=Path, default=ZOO_DIR / ZOO_NAME)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--stages", default="data,target,distill,drafter,heads,export")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=768)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--target-lr", type=float, default=3e-3)
    p.add_argument("--target-minutes", type=float, default=50.0, help="wall-clock training budget")
    p.add_argument("--drafter-minutes", type=float, default=25.0, help="wall-clock training budget")
    p.add_argument("--heads-minutes", type=float, default=12.0, help="wall-clock training budget")
    p.add_argument("--drafter-layers", type=int, default=2)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--distill-sequences", type=int, default=1024)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--drafter-lr", type=float, default=2e-3)
    p.add_argument("--drafter-batch", type=int, default=8)
    p.add_argument("--anchors", type=int, default=16)
    p.add_argument("--heads-lr", type=float, default=2e-3)
    p.add_argument("--gru-hidden", type=int, default=256)
    p.add_argument("--gru-emb-dim", type=int, default=256)
    p.add_argument("--markov-rank", type=int, default=128)
    p.add_argument("--tau-prompts", type=int, default=5, help="prompts per split for the tau stage")
    p.add_argument("--tau-new-tokens", type=int, default=96)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    stages = args.stages.split(",")
    if "data" in stages:
        stage_data(args.work, args.vocab)
    if "target" in stages:
        stage_target(args.work, args)
    if "distill" in stages:
        stage_distill(args.work, args)
    if "drafter" in stages:
        stage_drafter(args.work, args)
    if "heads" in stages:
        stage_heads(args.work, args)
    if "export" in stages:
        stage_export(args.work, args)
    if "tau" in stages:
        stage_tau(args.work, args)
