"""Hypothesis strategies for draft blocks and builder configurations."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from dartree import DraftBlock


def random_logits(seed: int, shape: tuple[int, ...], ties: bool) -> torch.Tensor:
    """Normal logits, or logits from a 4-value set so that ties (in candidates and scores) are common."""
    g = torch.Generator().manual_seed(seed)
    if ties:
        return torch.randint(0, 4, shape, generator=g).float()
    return torch.randn(shape, generator=g) * 2.0


@st.composite
def blocks(draw, max_vocab: int = 300, max_gamma: int = 16, max_batch: int = 3) -> DraftBlock:
    b = draw(st.integers(1, max_batch))
    gamma = draw(st.integers(1, max_gamma))
    vocab = draw(st.integers(2, max_vocab))
    seed = draw(st.integers(0, 2**31 - 1))
    ties = draw(st.booleans())
    logits = random_logits(seed, (b, gamma, vocab), ties)
    root = torch.randint(0, vocab, (b,), generator=torch.Generator().manual_seed(seed + 1))
    return DraftBlock(logits=logits, root=root)


def config_for(draw, name: str, vocab: int, max_budget: int = 200, max_width: int = 32,
               max_topk: int | None = None) -> dict:
    """Draw a valid config for registry entry ``name`` given the block's vocabulary size."""
    topk = draw(st.integers(1, min(vocab, max_topk or vocab)))
    normalize = draw(st.sampled_from(["vocab", "candidates"]))
    cfg: dict = {"topk": topk, "normalize": normalize}
    if name not in ("chain", "corrected-chain"):
        cfg["budget"] = draw(st.integers(1, max_budget))
    if name == "dartree-pruned":
        cfg["width"] = draw(st.integers(1, max_width))
        cfg["beta"] = draw(st.sampled_from([0.0, -0.2, -1.0]))
    return cfg
