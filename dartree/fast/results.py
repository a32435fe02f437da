"""Result types of the fast kernels (shared by the torch twins and the Triton kernels)."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from dartree.structure import TreeStructure

__all__ = ["CandidateSet", "DepthStep", "TreeStructure", "GreedyWalk", "check_depth_step"]


class CandidateSet(NamedTuple):
    """Per-position top-K candidates with their log-probabilities.

    Shape:
        tokens:   int64 ``[b, gamma, K]`` base logit descending, ties by token id ascending.
        logits:   float32 ``[b, gamma, K]`` base logits of those tokens.
        rest_lse: float32 ``[b, gamma]`` log-sum-exp of the logits outside the candidates (``-inf``
                  for ``normalize="candidates"`` or ``K == V``).
        log_q:    float32 ``[b, gamma, K]`` ``logits - logaddexp(logsumexp(logits), rest_lse)``.
    """

    tokens: Tensor
    logits: Tensor
    rest_lse: Tensor
    log_q: Tensor


class DepthStep(NamedTuple):
    """The children kept at one depth, in rank-path lexicographic order.

    Shape:
        parents: int64 ``[b, W]`` branch index (into the previous depth's kept nodes) of each child.
        ranks:   int64 ``[b, W]`` candidate rank of each child.
        scores:  float32 ``[b, W]`` ``(parent + log_q) + beta``.
    """

    parents: Tensor
    ranks: Tensor
    scores: Tensor


class GreedyWalk(NamedTuple):
    """The greedy walk of verification (the fields of ``dartree.verify.VerifyResult`` it decides).

    Shape:
        accepted:        int64 ``[b, n]`` root, then the accepted draft nodes root-to-leaf; -1 after.
        accepted_length: int64 ``[b]`` accepted draft nodes (root excluded).
        bonus:           int64 ``[b]`` the target's pick at the last accepted node.
    """

    accepted: Tensor
    accepted_length: Tensor
    bonus: Tensor


def check_depth_step(parent_scores: Tensor, log_q: Tensor, width: int) -> tuple[int, int, int]:
    """The argument checks every ``depth_step`` shares; returns ``(b, m, K)``.
    Shape: parent_scores ``[b, m]``, log_q ``[b, m | 1, K]``, ``1 <= width <= m * K``."""
    b, m = parent_scores.shape
    if log_q.dim() != 3 or log_q.shape[0] != b or log_q.shape[1] not in (1, m):
        raise ValueError(f"log_q: expected [{b}, {m} or 1, K], got {tuple(log_q.shape)}")
    topk = log_q.shape[-1]
    if not 1 <= width <= m * topk:
        raise ValueError(f"width: {width} outside 1..{m * topk} (branches x candidates)")
    return b, m, topk
