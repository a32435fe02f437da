"""Run folders: where a command writes its results, checked before any model loads.

Every command that writes results (``bench``, ``sweep``, ``show-tree``, ``tune``) calls
:func:`check_out_dir` first, before it loads a model: the folder must be creatable and writable
(a probe file is written and removed), and must not already hold files, so that a run never
replaces an earlier one without being asked.  With ``force=True`` a folder that holds only the
results of earlier dartree runs (the names in :data:`RUN_FILE_PATTERNS`) is accepted; the command
then calls :func:`clear_earlier_run` just before it writes its own files, so no stale file of the
earlier run stays mixed with the new ones, and a run that fails halfway leaves the earlier results
in place.  A folder that holds anything else is refused even with ``force``: dartree deletes only
files it writes itself.
"""

from __future__ import annotations

import fnmatch
import os
import tempfile
from pathlib import Path

__all__ = ["RUN_FILE_PATTERNS", "check_out_dir", "clear_earlier_run", "run_files"]

# Every file name a dartree command writes into its --out folder.
RUN_FILE_PATTERNS: tuple[str, ...] = (
    "results.md", "results.json", "acceptance.png", "tuning_*.png",           # bench
    "sweep_*.md", "sweep_*.json", "sweep_*.png",                               # sweep
    "tree_*.png", "depth_distribution.png",                                    # show-tree
    "tune_*.md", "tune_*.json", "tune_*.png",                                  # tune
)


def _is_run_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink() and any(fnmatch.fnmatchcase(path.name, p)
                                                            for p in RUN_FILE_PATTERNS)


def run_files(out: Path) -> list[Path]:
    """The files of earlier dartree runs in ``out`` (sorted; empty when ``out`` does not exist)."""
    if not out.is_dir():
        return []
    return sorted(p for p in out.iterdir() if _is_run_file(p))


def _names(paths: list[Path], limit: int = 4) -> str:
    names = [p.name for p in paths[:limit]]
    return ", ".join(names) + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def check_out_dir(out: Path, force: bool = False) -> list[Path]:
    """Make sure results can be written to ``out``; returns the earlier run's files ``force`` will replace.

    Creates ``out`` (and its parents) when missing.  Raises ``ValueError`` naming the folder when it
    cannot be created or written, when it is a file, when it holds files and ``force`` is false, or
    when it holds anything that no dartree command writes (never deleted, even with ``force``).
    """
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: {out} is a file, not a folder; pick a folder")
    entries = sorted(out.iterdir()) if out.is_dir() else []
    if entries and not force:
        raise ValueError(f"--out: {out} already holds files ({_names(entries)}); pass --force to replace the "
                         f"earlier run's results, or pick another --out")
    foreign = [p for p in entries if not _is_run_file(p)]
    if foreign:
        raise ValueError(f"--out: {out} holds files that dartree did not write ({_names(foreign)}); --force "
                         f"replaces only earlier results, so pick an empty or new folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".dartree-probe-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        reason = e.strerror or str(e)
        raise ValueError(f"--out: cannot write to {out}: {reason}; pick a writable folder") from None
    return entries


def clear_earlier_run(out: Path) -> list[Path]:
    """Delete the earlier runs' files from ``out`` (only names in :data:`RUN_FILE_PATTERNS`); returns them."""
    removed = run_files(out)
    for path in removed:
        path.unlink()
    return removed
