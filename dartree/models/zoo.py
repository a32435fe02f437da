"""The bundled model zoo: a small Python-code target, its DFlash drafter and both correction heads, trained on the
CPU by ``python -m dartree.training`` and committed under ``dartree/models/zoo_weights/<name>/``; :func:`load`
reads local files only.  Usage and contents: docs/zoo.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from dartree.models.drafter import DFlashDrafter
from dartree.models.loaders import load_drafter, load_head, load_target

__all__ = ["ZooBundle", "available", "load", "ZOO_DIR", "DEFAULT_NAME"]

ZOO_DIR = Path(__file__).resolve().parent / "zoo_weights"
DEFAULT_NAME = "pystdlib-tiny"


@dataclass(frozen=True)
class ZooBundle:
    """A ready-to-use target, tokenizer, drafter and heads."""

    name: str
    path: Path
    target: nn.Module
    tokenizer: object
    drafter: DFlashDrafter
    heads: dict[str, nn.Module] = field(default_factory=dict)

    @property
    def eos_token_id(self) -> int:
        return int(self.tokenizer.convert_tokens_to_ids("<|endoftext|>"))

    def encode(self, text: str) -> torch.Tensor:
        """Token ids of ``text``.  Shape: int64 ``[1, n]``."""
        return torch.tensor([self.tokenizer.encode(text)], dtype=torch.int64)

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist()
        return self.tokenizer.decode(ids)


def available() -> list[str]:
    """Names of the bundles shipped with the package."""
    if not ZOO_DIR.is_dir():
        return []
    return sorted(p.name for p in ZOO_DIR.iterdir() if (p / "target" / "config.json").is_file())


def load(name: str = DEFAULT_NAME, attn_implementation: str = "sdpa") -> ZooBundle:
    """Load bundled zoo entry ``name`` (one of :func:`available`) from the package's files (no download, no
    training); ``attn_implementation``: ``"sdpa"`` or ``"eager"`` for the target."""
    from transformers import PreTrainedTokenizerFast

    names = available()
    if name not in names:
        raise ValueError(f"name: unknown zoo entry {name!r}; available: {names}")
    if attn_implementation not in ("sdpa", "eager"):
        raise ValueError(f"attn_implementation: expected 'sdpa' or 'eager', got {attn_implementation!r}")
    path = ZOO_DIR / name
    target = load_target(path / "target", attn_implementation)     # missing / unexpected tensors are errors
    drafter = load_drafter(path / "drafter", target=target)
    heads = {key: load_head(path / f"{key}_head", target=target) for key in ("gru", "markov")}
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"), eos_token="<|endoftext|>",
                                        pad_token="<|endoftext|>", mask_token="<|mask|>")
    return ZooBundle(name=name, path=path, target=target, tokenizer=tokenizer, drafter=drafter, heads=heads)
