"""Hypothesis strategies for draft blocks, builder configurations, heads and trees: test a builder of your own
with the draws dartree's property tests use.

    @given(data=st.data())
    def test_my_builder(data):
        block = data.draw(blocks())
        tree = make_builder("my-builder", **config_for(data.draw, "my-builder", block.vocab_size)).build(block)
"""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import strategies as st

from dartree.block import DraftBlock

__all__ = ["random_logits", "blocks", "config_for", "heads", "trees"]


def random_logits(seed: int, shape: tuple[int, ...], ties: bool) -> torch.Tensor:
    """Normal logits, or logits from a 4-value set so that ties (in candidates and scores) are common."""
    g = torch.Generator().manual_seed(seed)
    if ties:
        return torch.randint(0, 4, shape, generator=g).float()
    return torch.randn(shape, generator=g) * 2.0


@st.composite
def blocks(draw, max_vocab: int = 300, max_gamma: int = 16, max_batch: int = 3) -> DraftBlock:
    """A random block: batch 1..max_batch, gamma 1..max_gamma, vocabulary 2..max_vocab, ties often."""
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
    """A valid config for registry entry ``name`` given the block's vocabulary: the fields dartree knows
    (``topk``, ``normalize``, ``budget``, ``width``, ``beta``, ``acceptance``) drawn where the builder's config
    has them; any other field keeps its default."""
    from dartree.builders import builder_spec

    fields = {f.name for f in dataclasses.fields(builder_spec(name).config_cls)}
    cfg: dict = {}
    if "topk" in fields:
        cfg["topk"] = draw(st.integers(1, min(vocab, max_topk or vocab)))
    if "normalize" in fields:
        cfg["normalize"] = draw(st.sampled_from(["vocab", "candidates"]))
    if "budget" in fields:
        cfg["budget"] = draw(st.integers(1, max_budget))
    if "width" in fields:
        cfg["width"] = draw(st.integers(1, max_width))
    if "beta" in fields:
        cfg["beta"] = draw(st.sampled_from([0.0, -0.2, -1.0]))
    if "acceptance" in fields:              # Sequoia's P_r: in (0, 1), non-increasing, summing to at most 1
        probs = sorted(draw(st.lists(st.floats(0.01, 0.9), min_size=1, max_size=5)), reverse=True)
        scale = min(1.0, 0.99 / sum(probs))
        cfg["acceptance"] = tuple(p * scale for p in probs)
    return cfg


def heads():
    """dartree's deterministic test heads (a pure function of the branch's tokens)."""
    from dartree.testing.heads import IdentityHead, PathHashHead

    return st.sampled_from([PathHashHead(), IdentityHead()])


@st.composite
def trees(draw, name: str, backend: str = "ref", **block_kwargs):
    """``(block, tree)``: a random block and the tree registry entry ``name`` builds from it."""
    from dartree.builders import make_builder

    block = draw(blocks(**block_kwargs))
    builder = make_builder(name, backend, **config_for(draw, name, block.vocab_size))
    head = draw(heads()) if builder.needs_head else None
    return block, builder.build(block, head)
