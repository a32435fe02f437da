"""Run folders: where a command writes its results, checked before any model loads.

Each command that writes results owns a set of file names in its ``--out`` folder (its *kind*:
:data:`BENCH_FILES`, :func:`sweep_files`, :data:`TREE_FILES`, :func:`tune_files`).  Before it loads
a model, the command calls :func:`check_out_dir`: the folder must be creatable and writable (a
probe file is written and removed), and must not hold files of the command's kind from an earlier
run, so that a run never replaces another one silently.  With ``force=True`` such files are
accepted; the command calls :func:`clear_earlier_run` just before it writes its own, so no stale
file of the earlier run stays mixed with the new ones (e.g. the tuning plot of a builder the new
run does not tune), and a run that fails halfway leaves the earlier results in place.

Files of other kinds are never touched: sweeps of different parameters, a bench and its
``sweeps/`` sub-folder, or a user's notes share a folder safely.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

__all__ = ["BENCH_FILES", "TREE_FILES", "sweep_files", "tune_files", "check_out_dir", "clear_earlier_run",
           "run_files"]

BENCH_FILES: tuple[str, ...] = ("results.md", "results.json", "acceptance.png", "tuning_*.png")
TREE_FILES: tuple[str, ...] = ("tree_*.png", "depth_distribution.png")


def sweep_files(param: str) -> tuple[str, ...]:
    """The files ``dartree sweep --param PARAM`` writes (sweeps of other parameters are another kind)."""
    return tuple(f"sweep_{glob.escape(param)}.{ext}" for ext in ("md", "json", "png"))


def tune_files(builder: str) -> tuple[str, ...]:
    """The files ``dartree tune`` writes for one builder."""
    return tuple(f"tune_{glob.escape(builder)}.{ext}" for ext in ("md", "json", "png"))


def run_files(out: Path, patterns: Sequence[str]) -> list[Path]:
    """The regular files in ``out`` whose names match ``patterns`` (sorted; empty when ``out`` does not exist)."""
    if not out.is_dir():
        return []
    return sorted(p for p in out.iterdir()
                  if p.is_file() and not p.is_symlink() and any(fnmatch.fnmatchcase(p.name, pat) for pat in patterns))


def _names(paths: list[Path], limit: int = 4) -> str:
    names = [p.name for p in paths[:limit]]
    return ", ".join(names) + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def check_out_dir(out: Path, patterns: Sequence[str], force: bool = False) -> list[Path]:
    """Make sure results can be written to ``out``; returns the earlier run's files that ``force`` replaces.

    Creates ``out`` (and its parents) when missing.  Raises ``ValueError`` naming the folder when it
    cannot be created or written, when it is a file, or when it holds files matching ``patterns``
    and ``force`` is false.
    """
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: {out} is a file, not a folder; pick a folder")
    try:
        earlier = run_files(out, patterns)
        if earlier and not force:
            raise ValueError(f"--out: {out} already holds results of an earlier run ({_names(earlier)}); pass "
                             f"--force to replace them, or pick another --out")
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".dartree-probe-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ValueError(f"--out: cannot write to {out}: {e.strerror or e}; pick a writable folder") from None
    return earlier


def clear_earlier_run(out: Path, patterns: Sequence[str]) -> list[Path]:
    """Delete the files of ``out`` that match ``patterns`` (an earlier run of the same kind); returns them."""
    removed = run_files(out, patterns)
    for path in removed:
        path.unlink()
    return removed
