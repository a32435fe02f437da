"""Stage 1, ``data``: the Python standard library of the running interpreter (``*.py`` files, not
``site-packages`` and not the test suites), split train / validation by a hash of the file's
relative path; a byte-level BPE tokenizer trained with ``tokenizers``; token ids cached in
``data.pt``."""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import torch

from dartree.training.common import SPECIAL_TOKENS, log

__all__ = ["stdlib_files", "is_validation", "stage_data", "joined_ids", "load_data", "random_windows"]


def stdlib_files() -> list[tuple[str, Path]]:
    """(relative path, absolute path) of every stdlib ``*.py`` file, sorted, tests excluded."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idle_test", "__pycache__"}
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in skip for part in rel.parts):
            continue
        out.append((rel.as_posix(), path))
    return out


def is_validation(rel: str) -> bool:
    """Deterministic 5% validation split by the file's relative path."""
    return int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 20 == 0


def stage_data(work: Path, vocab_size: int, init_from: Path | None = None) -> None:
    """Corpus, split and token ids; the tokenizer is trained here, or copied from ``init_from`` (a
    released bundle whose target is kept, so its tokenizer must be too)."""
    if (work / "data.pt").exists():
        return
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    files = stdlib_files()
    texts = {"train": [], "validation": []}
    for rel, path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts["validation" if is_validation(rel) else "train"].append(text)
    log(f"corpus: {len(texts['train'])} train files, {len(texts['validation'])} validation files")

    if init_from is not None:
        tok = Tokenizer.from_file(str(init_from / "tokenizer.json"))
        log(f"tokenizer: copied from {init_from}")
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts["train"], trainer=trainer)
    tok.save(str(work / "tokenizer.json"))
    data = {split: joined_ids(tok, docs) for split, docs in texts.items()}
    for split, ids in data.items():
        log(f"{split}: {ids.numel()} tokens")
    torch.save(data, work / "data.pt")


def joined_ids(tok, texts: list[str]) -> torch.Tensor:
    """int32 token ids of ``texts``, each followed by ``<|endoftext|>``."""
    eot = tok.token_to_id("<|endoftext|>")
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.int32)


def load_data(work: Path) -> dict[str, torch.Tensor]:
    return torch.load(work / "data.pt")


def random_windows(ids: torch.Tensor, batch: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, ids.numel() - seq - 1, (batch,), generator=gen)
    return torch.stack([ids[s : s + seq] for s in starts.tolist()]).long()
