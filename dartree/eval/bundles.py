"""Model bundles for the harness (a target, its tokenizer, a drafter, correction heads): a zoo model, or
``"tiny-random"``, a toy built in seconds so that every command runs without trained weights."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["Bundle", "ByteTokenizer", "TINY_RANDOM", "load_bundle", "local_bundle", "tiny_random_bundle", "encode",
           "decode", "stop_token_id"]

TINY_RANDOM = "tiny-random"


class ByteTokenizer:
    """UTF-8 bytes as tokens 0..255, ``<|endoftext|>`` = 256 (the toy bundle's tokenizer)."""

    eos_token_id = 256
    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Bundle:
    """What the harness needs of a model: target (HF causal LM), tokenizer, drafter, heads by name."""

    name: str
    target: nn.Module
    tokenizer: Any
    drafter: Any
    heads: dict[str, Any] = field(default_factory=dict)

    def to(self, device: str | Any) -> Bundle:
        """Move the target, the drafter and every head that is a module to ``device`` (in place)."""
        self.target.to(device)
        for module in (self.drafter, *self.heads.values()):
            if hasattr(module, "to"):
                module.to(device)
        return self


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` for a ``tokenizers.Tokenizer``, a transformers tokenizer or :class:`ByteTokenizer`."""
    out = tokenizer.encode(text)
    return list(out.ids) if hasattr(out, "ids") else list(out)


def decode(tokenizer: Any, ids: list[int]) -> str:
    """Text of ``ids`` (any tokenizer accepted by :func:`encode`)."""
    return tokenizer.decode(list(ids))


def stop_token_id(bundle: Bundle) -> int | None:
    """The end-of-text token of ``bundle`` (from the target's config), or ``None`` if it has none."""
    eos = getattr(bundle.target.config, "eos_token_id", None)
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return eos if isinstance(eos, int) else None


def tiny_random_bundle(seed: int = 0, gamma: int = 8, demote: float = 0.3, drop: float = 0.1) -> Bundle:
    """The toy bundle: random 2-layer Qwen3 over bytes, oracle drafter with noise, test heads."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from dartree.testing import PathHashHead
    from dartree.testing.drafter import OracleDrafter

    tokenizer = ByteTokenizer()
    config = Qwen3Config(vocab_size=tokenizer.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                         tie_word_embeddings=True, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.eos_token_id)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    drafter = OracleDrafter(model, gamma, demote=demote, drop=drop, seed=seed)
    heads = {"gru": PathHashHead(strength=0.5), "markov": PathHashHead(strength=0.25)}
    return Bundle(TINY_RANDOM, model, tokenizer, drafter, heads)


def load_bundle(name: str) -> Bundle:
    """The bundle called ``name``: ``"tiny-random"`` or a zoo model (``dartree.models.zoo``)."""
    if name == TINY_RANDOM:
        return tiny_random_bundle()
    from dartree.models import zoo

    known = tuple(zoo.available())
    if name not in known:
        hint = "" if known else " (no zoo weights are installed: train them with `python -m dartree.training`)"
        raise ValueError(f"model: must be one of {(TINY_RANDOM, *known)}, got {name!r}{hint}")
    z = zoo.load(name)
    return Bundle(name, z.target, z.tokenizer, z.drafter, dict(z.heads))


def _local_tokenizer(path: Path):
    """A tokenizer from a ``tokenizer.json`` file, or a directory holding a HF tokenizer or ``tokenizer.json``."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if path.is_file():
        return PreTrainedTokenizerFast(tokenizer_file=str(path))
    if (path / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    if (path / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))
    raise ValueError(f"tokenizer: {path} holds neither tokenizer_config.json nor tokenizer.json "
                     "(pass --tokenizer FILE_OR_DIR)")


def local_bundle(target_dir: str | Path, drafter_dir: str | Path, tokenizer: str | Path | None = None,
                 attn_implementation: str = "sdpa") -> Bundle:
    """A bundle from local directories: a HF causal-LM target (:func:`dartree.models.loaders.load_target`,
    nothing downloaded), a released drafter (:func:`dartree.models.load_drafter`; its heads become the
    bundle's) and a tokenizer (default: ``target_dir``)."""
    from dartree.models import load_drafter
    from dartree.models.loaders import load_target

    target_dir, drafter_dir = Path(target_dir), Path(drafter_dir)
    for name, path in (("target", target_dir), ("drafter", drafter_dir)):
        if not (path / "config.json").is_file():
            raise ValueError(f"{name}: {path} is not a checkpoint directory (no config.json)")
    tok = _local_tokenizer(Path(tokenizer) if tokenizer is not None else target_dir)
    target = load_target(target_dir, attn_implementation)
    drafter = load_drafter(drafter_dir, target=target)
    return Bundle(f"{target_dir.name}+{drafter_dir.name}", target, tok, drafter, dict(drafter.heads))
