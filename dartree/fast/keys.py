"""Sortable integer keys for the one total order (score descending, rank path ascending).

A float32 score maps to an int32 whose signed order is the float order (``-0.0`` folded into ``+0.0``),
packed with a tie index ``0 <= tie < 2**32`` (smaller is better) into ``order32(score) << 32 | (2**32 - 1 -
tie)``: a larger key is a better node.  Rank paths compare as mixed-radix int64 *words*, one digit per depth
(``1 + index``; 0: no node, so a prefix sorts first), spilling into further words in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["order32", "pack", "WordPlan", "word_plan", "lexsort"]

WORD_LIMIT = 1 << 62  # every word < 2**62, so int64 max is free as a "no entry" sentinel


def order32(x: Tensor) -> Tensor:
    """int32 with the same order as the float32 ``x`` ``[...]`` (``-0.0 == +0.0``; NaN unsupported)."""
    bits = (x.float() + 0.0).view(torch.int32)  # -0.0 + 0.0 = +0.0: the two zeros tie
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats: flip the magnitude bits


def pack(score: Tensor, tie: Tensor) -> Tensor:
    """int64 key: larger means higher score, then smaller ``tie`` (``0 <= tie < 2**32``).
    Shape: score float ``[...]``, tie int64 broadcastable -> int64 ``[...]``."""
    return (order32(score).to(torch.int64) << 32) | (0xFFFFFFFF - tie)


@dataclass(frozen=True)
class WordPlan:
    """Where each depth's digit lives: ``word[d]`` and ``place[d]`` (its multiplier), depth 1-based
    (index 0, the root, has no digit)."""

    word: tuple[int, ...]
    place: tuple[int, ...]
    num_words: int


def word_plan(bases: list[int]) -> WordPlan:
    """Pack one digit per depth (digit ``< bases[d-1]``) into as few int64 words as fit below 2**62."""
    groups: list[list[int]] = [[]]
    prod = 1
    for depth, base in enumerate(bases, start=1):
        if base >= WORD_LIMIT:
            raise ValueError(f"bases: digit base {base} at depth {depth} does not fit in one word")
        if prod * base >= WORD_LIMIT:
            groups.append([])
            prod = 1
        groups[-1].append(depth)
        prod *= base
    word = [0] * (len(bases) + 1)
    place = [0] * (len(bases) + 1)
    for w, depths in enumerate(groups):
        p = 1
        for depth in reversed(depths):
            word[depth], place[depth] = w, p
            p *= bases[depth - 1]
    return WordPlan(word=tuple(word), place=tuple(place), num_words=max(1, len(groups)))


def lexsort(words: Tensor) -> Tensor:
    """int64 ``[b, N]``: the permutation that sorts the rows of ``words`` (int64 ``[b, N, w]``)
    lexicographically: stable sorts, least-significant word first."""
    perm: Tensor | None = None
    for j in reversed(range(words.shape[-1])):
        key = words[..., j] if perm is None else torch.gather(words[..., j], 1, perm)
        order = torch.sort(key, dim=1, stable=True).indices
        perm = order if perm is None else torch.gather(perm, 1, order)
    assert perm is not None
    return perm
