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

import threading
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from dartree.block import DraftBlock

__all__ = ["Candidates", "Normalize", "NORMALIZE_CHOICES", "candidates", "check_candidate_logits", "child_scores",
           "log_normalize", "log_normalize_host", "pairwise_sum", "rest_logsumexp", "too_few_finite"]

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


def check_candidate_logits(values: Tensor) -> None:
    """Reject a position whose K-th candidate logit is ``-inf`` (fewer than K finite logits).

    ``-inf`` is how a caller masks tokens out of the vocabulary: such a token is never a candidate
    unless K exceeds the finite logits of its position, and that is the one case refused (a node with
    log q = -inf would sit in the tree).  One host synchronisation (the reference only).

    Shape: values float32 ``[b, gamma, K]`` (sorted descending).
    """
    short = values[..., -1] == float("-inf")
    if bool(short.any()):
        r, d = (int(v) for v in short.nonzero()[0])
        finite = int(torch.isfinite(values[r, d]).sum())
        raise ValueError(too_few_finite(r, d + 1, finite, values.shape[-1]))


def too_few_finite(row: int, depth: int, finite: int, topk: int) -> str:
    return (f"topk: row {row} depth {depth} has {finite} logits above -inf, fewer than topk={topk}; "
            f"lower topk, or mask tokens with a large negative finite logit instead of -inf")


_local = threading.local()
_CHUNK = 1 << 20
_LOG2E = 1.4426950408889634


def _scratch(like: Tensor) -> Tensor:
    """A float32 buffer shaped like ``like``, reused across calls of this thread: a fresh tensor of a
    large vocabulary costs page faults and zeroing on every call (about 1 ms for 15 x 151936 floats)."""
    if like.device.type != "cpu":
        return torch.empty_like(like)
    buf = getattr(_local, "buf", None)
    if buf is None or buf.numel() < like.numel():
        buf = _local.buf = torch.empty(like.numel(), dtype=torch.float32)
    return buf[: like.numel()].view(like.shape)


def rest_logsumexp(logits: Tensor, tokens: Tensor, top: Tensor | None = None) -> Tensor:
    """log-sum-exp of the logits outside the candidates ``tokens``: THE vocabulary normaliser.

    ``top + log(sum_{v not in C} exp(x_v - top))`` in float32, where ``top`` is the row maximum (the
    best candidate's logit, taken from ``logits`` at ``tokens[..., 0]``: exact).  One exp pass over the
    vocabulary, each term as ``exp2((x_v - top) * log2 e)`` (one more float32 rounding, ~1e-7 relative
    per term; about twice as fast as ``exp`` on the CPU); the candidates' terms are zeroed before the
    sum, so nothing cancels.  A ``-inf`` logit
    contributes 0.  If every term underflows (the rest lies > 104 below the top), the result is
    ``-inf``, which changes log q by less than a float32 rounding step.  Every backend calls this
    function on the same ``[b, gamma, V]`` float32 tensor, so their ``rest_lse`` are bit-identical.

    Shape:
        logits: float32 ``[b, gamma, V]``; tokens: int64 ``[b, gamma, K]``; top: float32 ``[b, gamma]``
        (the best candidates' logits, if the caller has them) -> float32 ``[b, gamma]``.
    """
    top = torch.gather(logits, -1, tokens[..., :1])[..., 0] if top is None else top
    vocab = logits.shape[-1]
    x, tok, t = logits.reshape(-1, vocab), tokens.reshape(-1, tokens.shape[-1]), top.reshape(-1, 1)
    # On the CPU, rows go in chunks of ~2**20 logits through one reused buffer that stays in cache;
    # each row's sum is a reduction over that row alone, so the chunking does not change any bit.
    rows = x.shape[0]
    step = rows if x.device.type != "cpu" else max(1, _CHUNK // vocab)
    if rows <= step:  # one chunk: no slicing (a small vocabulary pays per torch call, not per logit)
        terms = torch.sub(x, t, out=_scratch(x))
        terms.mul_(_LOG2E).exp2_()  # exp(y) as exp2(y log2 e): ~2x faster than exp on the CPU
        sums = terms.scatter_(-1, tok, 0.0).sum(-1)
    else:
        sums = torch.empty(rows, dtype=torch.float32, device=x.device)
        for r in range(0, rows, step):
            terms = torch.sub(x[r : r + step], t[r : r + step], out=_scratch(x[r : r + step]))
            terms.mul_(_LOG2E).exp2_()
            terms.scatter_(-1, tok[r : r + step], 0.0)
            torch.sum(terms, -1, out=sums[r : r + step])
    return top + sums.log_().view(top.shape)


def candidates(block: DraftBlock, topk: int, normalize: Normalize) -> Candidates:
    """Select ``C_d`` for every depth of every row, in the one total order of candidates.

    The reference selection: a stable sort of the whole vocabulary (obviously correct); the
    normaliser is :func:`rest_logsumexp`, shared with the fast backend.
    """
    logits = block.logits.float()  # [b, gamma, V]
    vocab = logits.shape[-1]
    if not 1 <= topk <= vocab:
        raise ValueError(f"topk: {topk} is outside the allowed range 1..V={vocab} (the block's vocabulary)")
    # A stable descending sort keeps equal logits in token-id order: the tie-break of the design.
    values, tokens = torch.sort(logits, dim=-1, descending=True, stable=True)
    tokens, values = tokens[..., :topk].contiguous(), values[..., :topk].contiguous()
    check_candidate_logits(values)
    if normalize == "vocab" and topk < vocab:
        rest_lse = rest_logsumexp(logits, tokens)
    else:
        rest_lse = torch.full(logits.shape[:2], float("-inf"), device=logits.device)
    return Candidates(tokens=tokens, logits=values, rest_lse=rest_lse)


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

    Computed in float64 and rounded once to float32.  CPU tensors go through
    :func:`log_normalize_host` (numpy: a dozen calls of ~1 us instead of torch ops of ~5 us), other
    devices through the torch version below; the two use the same float64 formula.  On the CPU,
    element-wise ``exp``/``log`` may run a vectorised routine on full vector lanes and a scalar one on
    the tail, which can differ in the last bit, so a computation of the same row could round
    differently inside a bigger batch.  In float64 those differences sit ~2**29 times below a float32
    rounding step and vanish in the final rounding (a miss needs a float64 result within one float64
    ulp of a float32 midpoint).  The candidate sum uses a fixed pairwise order (:func:`pairwise_sum`)
    for the same reason.

    Shape:
        cand_logits: float ``[..., K]``; rest_lse: float ``[...]`` (broadcast) -> float32 ``[..., K]``.
    """
    if cand_logits.device.type == "cpu":
        rest = rest_lse.detach().cpu().numpy() if isinstance(rest_lse, Tensor) else rest_lse
        return torch.from_numpy(log_normalize_host(cand_logits.detach().float().numpy(), rest))
    z = cand_logits.double()
    top = z.amax(dim=-1, keepdim=True)  # max is exact in any order
    lse = top.squeeze(-1) + torch.log(pairwise_sum(torch.exp(z - top)))
    total = torch.logaddexp(lse, rest_lse.double())
    return (z - total.unsqueeze(-1)).float()


def log_normalize_host(cand_logits: np.ndarray, rest_lse: np.ndarray | float | None = None) -> np.ndarray:
    """numpy :func:`log_normalize` (float64, one rounding to float32).  ``rest_lse=None`` means ``-inf``.

    The candidate sum is numpy's sum over the contiguous last axis: a fixed pairwise order per row that
    does not depend on the other rows (``tests/test_scoring.py`` checks the batch invariance).

    Shape:
        cand_logits: ``[..., K]``; rest_lse: ``[...]`` (broadcast) -> float32 ``[..., K]``.
    """
    z = np.asarray(cand_logits, dtype=np.float64)
    top = z.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):  # NaN in, NaN out: the callers reject NaN / inf inputs themselves
        total = np.log(np.exp(z - top).sum(axis=-1, keepdims=True)) + top
        if rest_lse is not None:
            total = np.logaddexp(total, np.asarray(rest_lse, dtype=np.float64)[..., None])
        return (z - total).astype(np.float32)


def child_scores(parent_scores: Tensor, log_q: Tensor, beta: float) -> Tensor:
    """Scores of children: ``(parent + log_q) + beta`` in float32.

    Shape:
        parent_scores ``[..., m]``, log_q ``[..., m, K]`` -> ``[..., m, K]``.
    """
    return (parent_scores.float().unsqueeze(-1) + log_q) + beta
