"""The driver: command-line options and the stages in order (``python -m dartree.training``)."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path

import torch

from dartree.training import __doc__ as OVERVIEW
from dartree.training.common import ZOO_NAME
from dartree.training.data import stage_data
from dartree.training.distill import CHUNK_ROWS, stage_distill
from dartree.training.drafter import stage_drafter
from dartree.training.export import stage_export
from dartree.training.heads import stage_heads
from dartree.training.target import stage_target
from dartree.training.tau import stage_tau

__all__ = ["parse_args", "main"]

ZOO_DIR = Path(__file__).resolve().parents[1] / "models" / "zoo_weights"
# Every stage, in the order they run; each skips itself when its output already exists in --work.
STAGES: dict[str, Callable[[Path, argparse.Namespace], None]] = {
    "data": lambda work, args: stage_data(work, args.vocab, args.init_from),
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


def _widths(text: str) -> list[tuple[int, int]]:
    try:
        widths = [tuple(int(v) for v in item.strip().split("x")) for item in text.split(",") if item.strip()]
    except ValueError:
        widths = []
    if not widths or any(len(w) != 2 or min(w) < 1 for w in widths) or len(set(widths)) != len(widths):
        raise argparse.ArgumentTypeError(f"expected distinct GxE pairs of ints >= 1 (e.g. 64x64,128x128), got {text!r}")
    return widths


def _head_kinds(text: str) -> list[str]:
    kinds = [s.strip() for s in text.split(",") if s.strip()]
    if "gru" not in kinds or any(k not in ("gru", "markov") for k in kinds):
        raise argparse.ArgumentTypeError(f"expected gru or gru,markov, got {text!r}")
    return kinds


def _bundle_dir(text: str) -> Path:
    path = Path(text)
    missing = [name for name in ("target", "drafter", "gru_head", "markov_head", "tokenizer.json")
               if not (path / name).exists()]
    if missing:
        raise argparse.ArgumentTypeError(f"expected a bundle directory with {', '.join(missing)}, got {text!r}")
    return path


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
    p.add_argument("--init-from", type=_bundle_dir, default=None,
                   help="a bundle directory (e.g. dartree/models/zoo_weights/pystdlib-tiny): keep its tokenizer "
                        "and target, warm-start the drafter and heads from its weights")
    p.add_argument("--distill-sequences", type=int, default=6144)
    p.add_argument("--distill-new-tokens", type=int, default=80,
                   help="tokens the target writes after each prompt (decoding runs 64 + one block)")
    p.add_argument("--prompt-min", type=int, default=24, help="shortest real-text prompt, tokens")
    p.add_argument("--prompt-max", type=int, default=256, help="longest real-text prompt, tokens")
    p.add_argument("--validation-sequences", type=int, default=512, help="held-out continuations (validation)")
    p.add_argument("--sampled-fraction", type=float, default=0.25,
                   help="fraction of continuations sampled at temperature 1 (the rest are greedy)")
    p.add_argument("--package-files", type=int, default=1500,
                   help="installed-package source files added to the prompt corpus (0: stdlib only)")
    p.add_argument("--drafter-lr", type=float, default=2e-3)
    p.add_argument("--drafter-batch", type=int, default=16)
    p.add_argument("--anchors", type=int, default=16)
    p.add_argument("--eval-every", type=int, default=200, help="steps between validation probes")
    p.add_argument("--decode-prompts", type=int, default=8,
                   help="held-out prompts decoded for real at each probe (the validation tau)")
    p.add_argument("--heads-lr", type=float, default=2e-3)
    p.add_argument("--gru-hidden", type=int, default=256)
    p.add_argument("--gru-emb-dim", type=int, default=256)
    p.add_argument("--gru-widths", type=_widths, default=None,
                   help="GRU heads trained side by side on the same batches, GxE (gru_hidden_dim x emb_dim) comma-"
                        "separated, e.g. 64x64,128x128; the first is exported as gru_head/ (default: one head, "
                        "--gru-hidden x --gru-emb-dim, or the --init-from bundle's width)")
    p.add_argument("--markov-rank", type=int, default=None, help="default: the --init-from bundle's rank, else 128")
    p.add_argument("--head-kinds", type=_head_kinds, default="gru,markov",
                   help="heads the heads stage trains: gru,markov (an untrained Markov head keeps its start)")
    p.add_argument("--tau-prompts", type=int, default=5, help="prompts per split for the tau stage")
    p.add_argument("--tau-new-tokens", type=int, default=96)
    args = p.parse_args(argv)
    if args.distill_new_tokens <= args.block_size:
        p.error(f"--distill-new-tokens: must exceed --block-size ({args.block_size}): a block's labels lie after "
                f"its root, got {args.distill_new_tokens}")
    if not 1 <= args.drafter_batch <= CHUNK_ROWS:
        p.error(f"--drafter-batch: a batch holds rows of one distillation chunk, 1..{CHUNK_ROWS}, "
                f"got {args.drafter_batch}")
    if not 1 <= args.prompt_min <= args.prompt_max:
        p.error(f"--prompt-min/--prompt-max: need 1 <= min <= max, got {args.prompt_min}, {args.prompt_max}")
    return args


def _check_origin(args: argparse.Namespace) -> None:
    """A work directory holds one recipe's stages: from scratch, or kept from one ``--init-from``
    bundle.  Reusing it with another origin would mix a stale tokenizer or target with new stages."""
    record = args.work / "origin.json"
    origin = {"init_from": None if args.init_from is None else str(args.init_from.resolve())}
    if record.exists():
        old = json.loads(record.read_text())
        if old != origin:
            raise SystemExit(f"--work: {args.work} was started with init_from={old['init_from']}, now "
                             f"init_from={origin['init_from']}; use another --work directory")
    else:
        record.write_text(json.dumps(origin))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    _check_origin(args)
    for name, stage in STAGES.items():          # in pipeline order, whatever the order of --stages
        if name in args.stages:
            stage(args.work, args)
