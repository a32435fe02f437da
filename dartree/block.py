"""What a drafter hands to a tree builder.

A drafter runs once per round and returns a :class:`DraftBlock`: base (marginal) logits for each
of the next ``gamma`` positions, optional hidden representations, and the root token.  The protocols over
it (the drafter's, the correction head's) are in :mod:`dartree.protocols`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["DraftBlock", "check_finite", "check_logits", "check_not_meta"]


def check_not_meta(name: str, x: Tensor) -> None:
    """Raise ``ValueError`` if ``x`` is on the ``meta`` device (a shape without values): meta blocks are accepted
    for shape-only tracing, so the checks that read values call this first."""
    if x.device.type == "meta":
        raise ValueError(f"{name}: on the meta device (a tensor with a shape but no data); trees are built from "
                         f"real values: put the drafter's output and the inputs on cpu or an accelerator")


def check_finite(name: str, x: Tensor) -> None:
    """Raise ``ValueError`` if ``x`` holds NaN or +-inf: one host sync, once per round on purpose, so that a
    drafter's NaN is reported instead of building a garbage tree."""
    check_not_meta(name, x)
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name}: must be finite (found NaN or inf)")


def check_logits(name: str, x: Tensor) -> None:
    """Raise ``ValueError`` if ``x`` holds NaN or ``+inf`` (``-inf`` masks a token); one host sync."""
    if bool((torch.isnan(x) | (x == float("inf"))).any()):
        raise ValueError(f"{name}: must not hold NaN or +inf (-inf is allowed, to mask tokens)")


@dataclass(frozen=True)
class DraftBlock:
    """Drafter output for one round.

    Shape:
        logits: float ``[b, gamma, V]`` base logits of draft positions 1..gamma.
        hidden: float ``[b, gamma, H]`` or ``None``; the shared representations ``H_d``.
        root:   int64 ``[b]`` the last committed token (the tree's root, not yet in the target's cache).

    Construction checks ranks, dtypes, batch sizes and devices without a host sync, and on the CPU that
    ``root`` lies in ``[0, V)`` (elsewhere the decoder's own checks cover it).  The builders check the logits
    (NaN and ``+inf`` are errors, ``-inf`` masks a token); the head proxy checks ``hidden``'s width.  A ``meta``
    block is accepted for tracing; the reference builders and the decoder refuse it (:func:`check_not_meta`).
    """

    logits: Tensor
    root: Tensor
    hidden: Tensor | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.logits, Tensor) or self.logits.dim() != 3:
            raise ValueError("logits: expected a float tensor of shape [b, gamma, V]")
        if not self.logits.is_floating_point():
            raise ValueError(f"logits: expected a floating dtype, got {self.logits.dtype}")
        b, gamma, vocab = self.logits.shape
        if b < 1 or gamma < 1 or vocab < 1:
            raise ValueError(f"logits: every dimension must be >= 1, got shape {tuple(self.logits.shape)}")
        if not isinstance(self.root, Tensor) or self.root.dtype != torch.int64 or self.root.shape != (b,):
            got = (
                f"{self.root.dtype} {tuple(self.root.shape)}" if isinstance(self.root, Tensor) else type(self.root)
            )
            raise ValueError(f"root: expected int64 tensor of shape [{b}] (batch of logits), got {got}")
        if self.root.device != self.logits.device:
            raise ValueError(f"root: on {self.root.device}, but logits are on {self.logits.device}")
        if self.root.device.type == "cpu":
            # CPU only: elsewhere a host sync per round (the decoder compares it with the root it passed)
            roots = self.root.tolist()
            if min(roots) < 0 or max(roots) >= vocab:
                raise ValueError(f"root: expected token ids in [0, {vocab}) (the block's vocabulary), got {roots}")
        if self.hidden is not None:
            h = self.hidden
            if not isinstance(h, Tensor) or h.dim() != 3 or h.shape[:2] != (b, gamma) or h.shape[2] < 1:
                got = tuple(h.shape) if isinstance(h, Tensor) else type(h)
                raise ValueError(f"hidden: expected shape [{b}, {gamma}, H] (H >= 1) to match logits, got {got}")
            if not h.is_floating_point():
                raise ValueError(f"hidden: expected a floating dtype, got {h.dtype}")
            if h.device != self.logits.device:
                raise ValueError(f"hidden: on {h.device}, but logits are on {self.logits.device}")

    @property
    def batch_size(self) -> int:
        return self.logits.shape[0]

    @property
    def gamma(self) -> int:
        return self.logits.shape[1]

    @property
    def vocab_size(self) -> int:
        return self.logits.shape[2]

    @property
    def device(self) -> torch.device:
        return self.logits.device

    def rows(self, index: int | slice | Tensor) -> DraftBlock:
        """The block restricted to some rows of the batch (``index`` as in tensor indexing)."""
        if isinstance(index, int):
            index = slice(index, index + 1)
        hidden = None if self.hidden is None else self.hidden[index]
        return DraftBlock(logits=self.logits[index], root=self.root[index], hidden=hidden)
