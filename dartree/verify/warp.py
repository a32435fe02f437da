"""Target-side warpers: temperature, top-k, top-p and min-p with HF ``generate``'s semantics and order, the one
distribution every sampled token is drawn from (AR and every T>0 verifier).  Semantics and the differences from
HF's defaults: docs/verification.md, "Target-side warpers".  Shape: float ``[..., V]`` -> float32 ``[..., V]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from dartree.arguments import check_number, plain_scalar
from dartree.verify.sampling import check_temperature

__all__ = ["Warp"]


@dataclass(frozen=True)
class Warp:
    """The target's sampling distribution at ``temperature > 0`` with optional top-k / top-p / min-p."""

    temperature: float
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None

    def __post_init__(self) -> None:
        for name in ("temperature", "top_k", "top_p", "min_p"):        # numpy / 0-d tensor numbers as Python's
            object.__setattr__(self, name, plain_scalar(getattr(self, name)))
        t = check_temperature(self.temperature)
        if t == 0:
            raise ValueError("temperature: a Warp samples; expected a finite number > 0 (0 is greedy: no warp)")
        object.__setattr__(self, "temperature", t)
        k = self.top_k
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"top_k: expected None (off) or an int >= 1, got {k!r}")
        for name in ("top_p", "min_p"):       # top_p=0 keeps the most likely token, as HF's TopPLogitsWarper
            v = getattr(self, name)
            if v is None:
                continue
            check_number(name, v, lambda x: math.isfinite(x) and 0 <= x <= 1,
                         f"expected None (off) or a number with 0 <= {name} <= 1")
            object.__setattr__(self, name, float(v))

    @property
    def filters(self) -> bool:
        """Whether any filter (top-k, top-p, min-p) is on."""
        return self.top_k is not None or (self.top_p is not None and self.top_p < 1.0) or bool(self.min_p)

    def logits(self, x: Tensor) -> Tensor:
        """Warped logits: float32 ``x / temperature`` with the dropped tokens at ``-inf``."""
        scores = x.float() / self.temperature
        if self.top_k is not None:
            k = min(self.top_k, scores.shape[-1])
            scores = scores.masked_fill(scores < torch.topk(scores, k, dim=-1).values[..., -1:], float("-inf"))
        if self.top_p is not None and self.top_p < 1.0:
            scores = scores.masked_fill(_top_p_drop(scores, self.top_p), float("-inf"))
        if self.min_p:
            probs = scores.softmax(dim=-1)
            drop = probs < self.min_p * probs.amax(dim=-1, keepdim=True)
            drop.scatter_(-1, probs.argmax(dim=-1, keepdim=True), False)
            scores = scores.masked_fill(drop, float("-inf"))
        return scores

    def probs(self, x: Tensor) -> Tensor:
        """The warped distribution: ``softmax(self.logits(x))``.

        perf: at temperature 1 without filters the softmax of ``x.float()`` itself (``x / 1.0`` is ``x`` bit for
        bit: one pass over the vocabulary and one tensor less per proposal row)."""
        if self.temperature == 1.0 and not self.filters:
            return (x if x.dtype == torch.float32 else x.float()).softmax(dim=-1)
        return self.logits(x).softmax(dim=-1)


def _hf_top_p_drop(scores: Tensor, top_p: float) -> Tensor:
    """transformers' ``TopPLogitsWarper`` mask: the ascending sort's prefix whose cumulative probability is
    ``<= 1 - top_p`` (the largest token always kept), scattered back to token order."""
    ordered, order = torch.sort(scores, dim=-1, descending=False)
    drop = ordered.softmax(dim=-1).cumsum(dim=-1) <= (1 - top_p)
    drop[..., -1:] = False
    return drop.scatter(-1, order, drop)


def _top_p_drop(scores: Tensor, top_p: float) -> Tensor:
    """:func:`_hf_top_p_drop`, bit for bit; perf (CPU): numpy sorts the values faster than ``torch.sort`` sorts
    values and indices.  The mask needs only the sorted values (so the count ``j`` of dropped tokens) and, where a
    tie straddles the boundary, torch's tie order: such rows take torch's sort.  On an accelerator: torch's sort.
    """
    flat = scores.reshape(-1, scores.shape[-1])
    if scores.device.type != "cpu":
        return _hf_top_p_drop(scores, top_p)
    ordered = np.sort(flat.detach().numpy(), axis=-1)
    cum = torch.from_numpy(ordered).softmax(dim=-1).cumsum(dim=-1).numpy()
    # transformers compares the float32 sums with ``1 - top_p`` in float32 (a Python scalar takes the tensor's
    # dtype); the largest token is always kept, so at most V - 1 are dropped
    threshold = np.float32(1 - top_p)
    if len(cum) == 1:                  # one row (AR's draw, one node): the count by a search (the sums ascend)
        j = np.minimum(cum[0].searchsorted(threshold, side="right"), cum.shape[-1] - 1)[None]
    else:
        j = np.minimum((cum <= threshold).sum(axis=-1), cum.shape[-1] - 1)
    rows = np.arange(len(cum))
    first_kept = ordered[rows, j]
    drop = flat < torch.from_numpy(first_kept[:, None])
    tied = (j > 0) & (ordered[rows, np.maximum(j - 1, 0)] == first_kept)
    if tied.any():
        at = torch.from_numpy(tied.nonzero()[0])
        drop[at] = _hf_top_p_drop(flat[at], top_p)
    return drop.view(scores.shape)
