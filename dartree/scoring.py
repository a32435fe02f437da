"""Candidate selection and log-normalisation shared by every builder and backend.

Both backends call these functions, so a node's score is the same float32 number whichever
backend built the tree:

    score(child) = (score(parent) + log_q) + beta          # float32, in this order

``log_q`` of a candidate with (corrected or base) logit ``z`` is ``z - logaddexp(lse(z_C), rest)``,
where ``lse(z_C)`` is the log-sum-exp over the K candidates and ``rest`` the log-sum-exp of the base
logits of the tokens outside the candidate set (``normalize="vocab"``), or ``-inf``
(``normalize="candidates"``).  With ``normalize="vocab"`` and base logits this is the full
log-softmax; with a head, tokens outside ``C_d`` keep their base logits.  ``log_q <= 0`` always, so
scores never increase along a path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from dartree.block import DraftBlock

__all__ = ["Candidates", "Normalize", "NORMALIZE_CHOICES", "candidates", "child_scores", "log_normalize",
           "pairwise_sum"]

Normalize = Literal["vocab", "candidates"]
NORMALIZE_CHOICES: tuple[str, ...] = ("vocab", "candidates")


@dataclass(frozen=True)
class Candidates:
    """Per-depth candidate sets ``C_d = top-K(L_d)``.

    Shape:
        tokens:   int64 ``[b, gamma, K]`` base logit descending, ties by token id ascending.
        logits:   float32 ``[b, gamma, K]`` base logits of those tokens.
        rest_lse: float32 ``[b, gamma]`` log-sum-exp of the base logits outside ``C_d`` (``-inf``
                  when ``normalize="candidates"`` or ``K == V``).
    """

    tokens: Tensor
    logits: Tensor
    rest_lse: Tensor

    @property
    def topk(self) -> int:
        return self.tokens.shape[-1]


def candidates(block: DraftBlock, topk: int, normalize: Normalize) -> Candidates:
    """Select ``C_d`` for every depth of every row, in the one total order of candidates."""
    logits = block.logits.float()  # [b, gamma, V]
    vocab = logits.shape[-1]
    if not 1 <= topk <= vocab:
        raise ValueError(f"topk: {topk} is outside the allowed range 1..V={vocab} (the block's vocabulary)")
    # A stable descending sort keeps equal logits in token-id order: the tie-break of the design.
    values, tokens = torch.sort(logits, dim=-1, descending=True, stable=True)
    tokens, values = tokens[..., :topk], values[..., :topk]
    if normalize == "vocab" and topk < vocab:
        rest = logits.scatter(-1, tokens, float("-inf"))
        rest_lse = torch.logsumexp(rest, dim=-1)
    else:
        rest_lse = torch.full(logits.shape[:2], float("-inf"), device=logits.device)
    return Candidates(tokens=tokens.contiguous(), logits=values.contiguous(), rest_lse=rest_lse)


def pairwise_sum(x: Tensor) -> Tensor:
    """Sum over the last dimension in a fixed pairwise order, independent of the leading shape.

    ``torch.sum``/``logsumexp`` pick their reduction order from the tensor's shape (a ``[m, 4]``
    tensor may be reduced across rows with vector lanes), so the same row can round differently
    inside a bigger batch.  Builders compare scores exactly, so every backend sums this way: pad to
    a power of two with zeros (exact) and add halves until one column is left.

    Shape:
        x ``[..., K]`` -> ``[...]``.
    """
    k = x.shape[-1]
    width = 1 << (k - 1).bit_length()
    if width != k:
        x = torch.nn.functional.pad(x, (0, width - k))
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = x[..., :half] + x[..., half:]
    return x[..., 0]


def log_normalize(cand_logits: Tensor, rest_lse: Tensor) -> Tensor:
    """log q of K candidates: ``z - logaddexp(lse(z), rest_lse)``, identical for any batching.

    Computed in float64 and rounded once to float32.  On the CPU, element-wise ``exp``/``log``
    run a vectorised routine on full vector lanes and a scalar one on the tail, which differ in the
    last bit, so a float32 computation of the same row can round differently inside a bigger batch.
    In float64 those differences sit ~2**29 times below a float32 rounding step and vanish in the
    final rounding (a miss needs a float64 result within one float64 ulp of a float32 midpoint).
    The candidate sum uses a fixed pairwise order (:func:`pairwise_sum`) for the same reason.

    Shape:
        cand_logits: float ``[..., K]``; rest_lse: float ``[...]`` (broadcast) -> float32 ``[..., K]``.
    """
    z = cand_logits.double()
    top = z.amax(dim=-1, keepdim=True)  # max is exact in any order
    lse = top.squeeze(-1) + torch.log(pairwise_sum(torch.exp(z - top)))
    total = torch.logaddexp(lse, rest_lse.double())
    return (z - total.unsqueeze(-1)).float()


def child_scores(parent_scores: Tensor, log_q: Tensor, beta: float) -> Tensor:
    """Scores of children: ``(parent + log_q) + beta`` in float32.

    Shape:
        parent_scores ``[..., m]``, log_q ``[..., m, K]`` -> ``[..., m, K]``.
    """
    return (parent_scores.float().unsqueeze(-1) + log_q) + beta
