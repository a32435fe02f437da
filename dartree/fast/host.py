"""Host (CPU) implementations of the fast operations: numpy and a few large torch passes.

On one CPU thread every torch op costs microseconds of dispatch however small its tensor, so for
CPU tensors :mod:`dartree.fast.ops` sends the operations here.  Same signatures and output contracts
as the torch twins (:mod:`dartree.fast.twins`), same outputs bit for bit: float32 arithmetic is
IEEE in numpy as in torch, and every float formula is a shared function of :mod:`dartree.scoring`.

Candidate selection (:func:`select`) reads the vocabulary once.  The vocabulary is cut into ``n``
strided groups of ``C`` tokens (token ``v`` is in group ``v mod n``); one vertical ``amax`` gives
every group's maximum.  The K-th largest group maximum ``t`` is a lower bound of the K-th largest
logit (K distinct tokens reach it), so every candidate is among the tokens ``>= t``, which lie in the
groups whose maximum is ``>= t`` (about K groups): those few tokens are sorted exactly by (logit
descending, token id) and the first K kept.  NaN and ``+inf`` propagate into the maxima, so the finite
check of the logits costs nothing more.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from dartree import native
from dartree.fast.results import CandidateSet, DepthStep, GreedyWalk, check_depth_step
from dartree.scoring import log_normalize_host, rest_logsumexp, too_few_finite
from dartree.structure import PAD
from dartree.structure import tree_structure_host as tree_structure

__all__ = ["select", "check_logits", "topk_candidates", "depth_step", "top_b", "tree_structure", "greedy_walk",
           "keep_best"]


_SCAN_ALL = 1 << 17  # rows x V up to which the second stage compares every logit with the threshold


def _group_size(vocab: int, topk: int) -> int:
    """Tokens per group: at most 16 (a vertical max over 16 rows runs at memory speed), and at least
    4 K groups so that the threshold is tight."""
    return max(1, min(16, vocab // (4 * topk)))


def check_logits(top: float, what: str = "block.logits") -> None:
    """Raise if a maximum is NaN or +inf (``top`` is the max over maxima, which propagate NaN)."""
    if not top < float("inf"):
        raise ValueError(f"{what}: must not hold NaN or +inf (-inf is allowed, to mask tokens)")


def select(logits: Tensor, topk: int) -> tuple[np.ndarray, np.ndarray]:
    """The K best tokens of every position (logit descending, ties by token id) and their logits.

    Raises ``ValueError`` for NaN / +inf logits, or a position with fewer than K logits above -inf.

    Shape:
        logits: float32 CPU ``[b, gamma, V]`` -> tokens int64 ``[b, gamma, K]``, logits float32 ``[b, gamma, K]``.
    """
    b, gamma, vocab = logits.shape
    rows = b * gamma
    lib = native.lib()
    if lib is not None:  # the same selection, compiled (with log q of the candidates, unused here)
        return candidates_native(lib, logits, topk, False)[:2]
    x = logits.reshape(rows, vocab)
    xn = x.numpy()
    size = _group_size(vocab, topk)
    n = vocab // size
    maxima = x[:, : size * n].view(rows, size, n).amax(1).numpy()  # [rows, n], one pass at memory speed
    tail = xn[:, size * n:]
    check_logits(float(maxima.max()))  # NaN propagates through max (never through Python's max())
    if tail.size:
        check_logits(float(tail.max()))
    t = np.partition(maxima, n - topk, axis=1)[:, n - topk] if n > topk else maxima.min(1)
    if rows * vocab <= _SCAN_ALL:  # small: one compare over everything beats gathering the groups
        r, tok = np.divmod(np.flatnonzero(xn >= t[:, None]), vocab)
        v = xn[r, tok]
    else:
        grp_r, grp_j = np.divmod(np.flatnonzero(maxima >= t[:, None]), n)
        vals = xn[:, : size * n].reshape(rows, size, n)[grp_r, :, grp_j]  # [groups, size]
        hits = np.flatnonzero(vals >= t[grp_r, None])
        hit_g, hit_c = np.divmod(hits, size)
        r, tok, v = grp_r[hit_g], hit_c * n + grp_j[hit_g], vals.ravel()[hits]
        if tail.size:
            tr, tc = np.nonzero(tail >= t[:, None])
            r, tok, v = (np.concatenate([r, tr]), np.concatenate([tok, tc + size * n]),
                         np.concatenate([v, tail[tr, tc]]))
        order = np.argsort(tok, kind="stable")  # group order is not token order
        r, tok, v = r[order], tok[order], v[order]
    # Row ascending, logit descending; a stable sort keeps token ids ascending among equal logits.
    bits = (v + np.float32(0.0)).view(np.int32).astype(np.int64)  # -0.0 + 0.0 = +0.0: the zeros tie
    order = np.argsort((r << 32) | (np.where(bits >= 0, bits ^ 0x7FFFFFFF, bits) & 0xFFFFFFFF), kind="stable")
    starts = np.searchsorted(r[order], np.arange(rows))
    take = order[(starts[:, None] + np.arange(topk)).ravel()]
    tokens = tok[take].astype(np.int64).reshape(b, gamma, topk)
    values = v[take].reshape(b, gamma, topk)
    if topk and (values[..., -1] == -np.inf).any():
        r, d = (int(i) for i in np.argwhere(values[..., -1] == -np.inf)[0])
        raise ValueError(too_few_finite(r, d + 1, int(np.isfinite(values[r, d]).sum()), topk))
    return tokens, values


def candidates_native(lib, logits: Tensor, topk: int, with_rest: bool
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """:func:`select`, :func:`dartree.scoring.rest_logsumexp` (when ``with_rest``) and
    :func:`dartree.scoring.log_normalize_host` in one call of the compiled module (same bits).

    Shape:
        logits: float32 contiguous ``[b, gamma, V]`` -> tokens int64, logits float32, log q float32
        ``[b, gamma, K]``, rest float32 ``[b, gamma]`` or None (without ``with_rest``, or when K = V).
    """
    b, gamma, vocab = logits.shape
    with_rest = with_rest and topk < vocab  # every token a candidate: no rest
    tokens = np.empty((b, gamma, topk), dtype=np.int64)
    values = np.empty((b, gamma, topk), dtype=np.float32)
    log_q = np.empty((b, gamma, topk), dtype=np.float32)
    rest = np.empty((b, gamma), dtype=np.float32) if with_rest else None
    status, row, finite = lib.candidates(np.ascontiguousarray(logits.numpy()), b * gamma, vocab, topk, int(with_rest),
                                         tokens, values, rest, log_q)
    if status == 1:
        check_logits(float("nan"))
    if status == 2:
        raise ValueError(too_few_finite(row // gamma, row % gamma + 1, finite, topk))
    return tokens, values, log_q, rest


def topk_candidates(logits: Tensor, topk: int, vocab_normalize: bool) -> CandidateSet:
    """Host version of :func:`dartree.fast.twins.topk_candidates` (identical outputs)."""
    x = logits.float().contiguous()
    with_rest = vocab_normalize and topk < x.shape[-1]
    lib = native.lib()
    if lib is not None:
        tokens, values, log_q, rest = candidates_native(lib, x, topk, with_rest)
        rest_t = torch.from_numpy(rest) if rest is not None else torch.full(x.shape[:2], float("-inf"))
        return CandidateSet(tokens=torch.from_numpy(tokens), logits=torch.from_numpy(values), rest_lse=rest_t,
                            log_q=torch.from_numpy(log_q))
    tokens, values = select(x, topk)
    tok = torch.from_numpy(tokens)
    if vocab_normalize and topk < x.shape[-1]:
        rest = rest_logsumexp(x, tok)
    else:
        rest = torch.full(x.shape[:2], float("-inf"))
    log_q = torch.from_numpy(log_normalize_host(values, rest.numpy()))
    return CandidateSet(tokens=tok, logits=torch.from_numpy(values), rest_lse=rest, log_q=log_q)


def keep_best(scores: np.ndarray, width: int) -> np.ndarray:
    """Per row, the flat positions of the best ``width`` scores under (score descending, position),
    listed in position order.

    Shape: scores float32 ``[b, N]`` (no NaN), ``1 <= width <= N`` -> int64 ``[b, width]``.
    """
    b, total = scores.shape
    if width == total:
        return np.broadcast_to(np.arange(total), (b, total))
    t = np.partition(scores, total - width, axis=1)[:, total - width, None]  # the width-th best score
    keep = scores >= t
    if np.count_nonzero(keep) != b * width:  # ties at the threshold: the smallest positions win
        better = scores > t
        tied = scores == t
        keep = better | (tied & (np.cumsum(tied, axis=1) <= width - better.sum(1, keepdims=True)))
    return np.nonzero(keep)[1].reshape(b, width)


def depth_step(parent_scores: Tensor, log_q: Tensor, beta: float, width: int) -> DepthStep:
    """Host version of :func:`dartree.fast.twins.depth_step` (identical outputs)."""
    b, m, topk = check_depth_step(parent_scores, log_q, width)
    scores = (parent_scores.float().numpy()[:, :, None] + log_q.float().numpy()) + np.float32(beta)
    scores = np.ascontiguousarray(np.broadcast_to(scores, (b, m, topk))).reshape(b, m * topk)
    lex = keep_best(scores, width)
    return DepthStep(parents=torch.from_numpy(lex // topk), ranks=torch.from_numpy(lex % topk),
                     scores=torch.from_numpy(np.take_along_axis(scores, lex, 1)))


def top_b(scores: Tensor, budget: int) -> Tensor:
    """Host version of :func:`dartree.fast.twins.top_b`: best first, ties by position."""
    if not 1 <= budget <= scores.shape[1]:
        raise ValueError(f"budget: {budget} outside 1..{scores.shape[1]}")
    s = scores.float().numpy()
    pos = keep_best(s, budget)
    order = np.argsort(-np.take_along_axis(s, pos, 1), axis=1, kind="stable")
    return torch.from_numpy(np.ascontiguousarray(np.take_along_axis(pos, order, 1)))


def greedy_walk(tokens: Tensor, parents: Tensor, num_nodes: Tensor, picks: Tensor) -> GreedyWalk:
    """Host version of :func:`dartree.fast.twins.greedy_walk`: a walk down first-child/next-sibling links."""
    tok, par, pick, count = tokens.numpy(), parents.numpy(), picks.numpy(), num_nodes.tolist()
    b, n = tok.shape
    accepted = np.full((b, n), PAD, dtype=np.int64)
    length = np.zeros(b, dtype=np.int64)
    bonus = np.zeros(b, dtype=np.int64)
    for r in range(b):
        kids: dict[tuple[int, int], int] = {(int(par[r, i]), int(tok[r, i])): i for i in range(1, count[r])}
        node, path = 0, [0]
        while (node, int(pick[r, node])) in kids:
            node = kids[(node, int(pick[r, node]))]
            path.append(node)
        accepted[r, : len(path)] = path
        length[r], bonus[r] = len(path) - 1, pick[r, node]
    return GreedyWalk(accepted=torch.from_numpy(accepted), accepted_length=torch.from_numpy(length),
                      bonus=torch.from_numpy(bonus))
