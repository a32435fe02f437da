"""Candidate selection and log-normalisation shared by every builder and backend, so that a node's score is
the same float32 number whichever backend built the tree::

    score(child) = (score(parent) + log_q) + beta          # float32, in this order

``log_q`` of a candidate with (corrected or base) logit ``z`` is ``z - logaddexp(lse(z_C), rest)``: the
log-sum-exp over the K candidates, and ``rest`` the log-sum-exp of the base logits outside the candidate set
(``normalize="vocab"``) or ``-inf`` (``"candidates"``).  ``log_q <= 0``, so scores never increase along a path.
"""

from __future__ import annotations

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
    """Reject a position whose K-th candidate logit is ``-inf`` (fewer than K finite logits): ``-inf`` masks a
    token, which is never a candidate unless K exceeds the finite logits, the one case refused (a node with
    log q = -inf would sit in the tree).  One host sync (the reference only).  Shape: values float32
    ``[b, gamma, K]`` (sorted descending)."""
    short = values[..., -1] == float("-inf")
    if bool(short.any()):
        r, d = (int(v) for v in short.nonzero()[0])
        finite = int(torch.isfinite(values[r, d]).sum())
        raise ValueError(too_few_finite(r, d + 1, finite, values.shape[-1]))


def too_few_finite(row: int, depth: int, finite: int, topk: int) -> str:
    return (f"topk: row {row} depth {depth} has {finite} logits above -inf, fewer than topk={topk}; "
            f"lower topk, or mask tokens with a large negative finite logit instead of -inf")


_LOG2E = 1.4426950408889634  # used as a float32 factor: 1.44269502162933349609375
# 2**f on [0, 1): degree-6 polynomial, highest power first (interpolation at Chebyshev nodes; every
# coefficient is a float32 value; relative error < 1e-7 evaluated in float32).  dartree/_native.c has the
# same table.
EXP2_POLY = (0.00021865784947294742, 0.0012391331838443875, 0.009684186428785324, 0.055480629205703735,
             0.24023045599460602, 0.6931469440460205, 1.0)


def exp2_f32_(y: Tensor) -> Tensor:
    """``2 ** y`` in place for float32 ``y <= 0``, defined op by op so that any IEEE float32 implementation (torch,
    the C loop of ``dartree/_native.c``) gets the same bits: ``y`` clamped at -127, ``n = floor(y)``,
    ``f = y - n`` (exact), ``2 ** f`` by :data:`EXP2_POLY` in Horner form (a multiply, then an add: never a fused
    multiply-add), times ``2 ** n`` from its exponent bits (``n = -127`` builds 0).  Relative error < 1e-7."""
    n = torch.floor(y.clamp_(min=-127.0))
    f = y.sub_(n)
    p = torch.mul(f, EXP2_POLY[0]).add_(EXP2_POLY[1])
    for c in EXP2_POLY[2:]:
        p.mul_(f).add_(c)
    return y.copy_(p.mul_(n.to(torch.int32).add_(127).bitwise_left_shift_(23).view(torch.float32)))


def rest_shift(vocab: int) -> int:
    """``s`` of the fixed-point sum in :func:`rest_logsumexp`: every term (<= 1) times ``2 ** s`` stays
    below ``2 ** 51`` and ``vocab`` of them sum below ``2 ** 62``."""
    return min(50, 62 - int(vocab).bit_length())


_CHUNK = 1 << 20  # logits per chunk of rows on the CPU: the temporaries stay in cache


def rest_logsumexp(logits: Tensor, tokens: Tensor) -> Tensor:
    """log-sum-exp of the logits outside the candidates ``tokens``: THE vocabulary normaliser, defined op by op so
    that torch and the C loop of ``dartree/_native.c`` give the same bits (each term :func:`exp2_f32_`, summed exactly
    in fixed point: docs/kernels.md, "An exact normaliser").  CPU rows go in chunks of ~2**20 logits.

    Shape: logits float32 ``[b, gamma, V]``; tokens int64 ``[b, gamma, K]`` -> float32 ``[b, gamma]``.
    """
    top = torch.gather(logits, -1, tokens[..., :1])[..., 0]         # the best candidate's logit
    vocab = logits.shape[-1]
    x, tok, t = logits.reshape(-1, vocab), tokens.reshape(-1, tokens.shape[-1]), top.reshape(-1, 1)
    rows, shift = x.shape[0], rest_shift(vocab)
    step = rows if x.device.type != "cpu" else max(1, _CHUNK // vocab)
    total = torch.empty(rows, dtype=torch.int64, device=x.device)
    for r in range(0, rows, step):
        terms = exp2_f32_(torch.sub(x[r : r + step], t[r : r + step]).mul_(_LOG2E)).scatter_(-1, tok[r : r + step], 0.0)
        fixed = terms.double().mul_(2.0**shift).round_().long()  # exact: power-of-two scaling, < 2**51
        torch.sum(fixed, -1, out=total[r : r + step])
    return (t[:, 0].double() + (total.double() * 2.0**-shift).log_()).float().view(top.shape)


def candidates(block: DraftBlock, topk: int, normalize: Normalize) -> Candidates:
    """Select ``C_d`` for every depth of every row, in the one total order of candidates: the reference's
    stable sort of the whole vocabulary; the normaliser is :func:`rest_logsumexp`, shared with the fast backend."""
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
    """Sum over the last dimension in a fixed pairwise order (zero-padded to a power of two, halves added),
    independent of the leading shape, as ``torch.sum`` is not.  Shape: x ``[..., K]`` -> ``[...]``.
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
    """log q of K candidates: ``z - logaddexp(lse(z), rest_lse)`` in float64, the candidate sum in a fixed pairwise
    order (:func:`pairwise_sum`), rounded once to float32: identical for any batching (why: docs/builders.md,
    "Exactness across backends and batchings").  CPU tensors go through :func:`log_normalize_host` (numpy).

    Shape: cand_logits float ``[..., K]``; rest_lse float ``[...]`` (broadcast) -> float32 ``[..., K]``.
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
    """numpy :func:`log_normalize` (``rest_lse=None``: ``-inf``); numpy's sum over the contiguous last axis is a
    fixed pairwise order per row (tests/test_scoring.py checks the batch invariance).
    Shape: cand_logits ``[..., K]``; rest_lse ``[...]`` (broadcast) -> float32 ``[..., K]``."""
    z = np.asarray(cand_logits, dtype=np.float64)
    top = z.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):  # NaN in, NaN out: the callers reject NaN / inf inputs themselves
        total = np.log(np.exp(z - top).sum(axis=-1, keepdims=True)) + top
        if rest_lse is not None:
            total = np.logaddexp(total, np.asarray(rest_lse, dtype=np.float64)[..., None])
        return (z - total).astype(np.float32)


def child_scores(parent_scores: Tensor, log_q: Tensor, beta: float) -> Tensor:
    """Scores of children: ``(parent + log_q) + beta`` in float32.
    Shape: parent_scores ``[..., m]``, log_q ``[..., m, K]`` -> ``[..., m, K]``."""
    return (parent_scores.float().unsqueeze(-1) + log_q) + beta
