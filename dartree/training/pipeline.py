"""The driver: command-line options and the stages in order (``python -m dartree.training``)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
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
# Every stage, in the order they run; each skips itself when its output already exists in --work.
STAGES: dict[str, Callable[[Path, argparse.Namespace], None]] = {
    "data": lambda work, args: stage_data(work, args.vocab),
    "target": stage_target,
    "distill": stage_distill,
    "drafter": stage_drafter,
    "heads": stage_heads,
    "export": stage_export,
    "tau": stage_tau,
}


def _stages(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s not in STAGES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"expected comma-separated stages from {', '.join(STAGES)}, got {text!r}")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dartree.training", description=OVERVIEW,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    default_work = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dartree" / "zoo_train"
    p.add_argument("--work", type=Path, default=default_work, help="scratch dir for checkpoints")
    p.add_argument("--out", type=Path, default=ZOO_DIR / ZOO_NAME)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--stages", type=_stages, default="data,target,distill,drafter,heads,export",
                   help=f"comma-separated, from {','.join(STAGES)} (default: all but tau)")
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
    for name, stage in STAGES.items():          # in pipeline order, whatever the order of --stages
        if name in args.stages:
            stage(args.work, args)
