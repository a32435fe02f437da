"""Torch twins of the Triton kernels: same signatures, same output contracts.

They run wherever the kernels do not (``meta``, CUDA sizes beyond their limits, a CPU without
``dartree._native``) and are the kernels' test oracle.  Floats are computed with the very expressions
of :mod:`dartree.scoring`, so a tree built through the twins carries bit-identical scores to the
reference builders'.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dartree.fast.keys import pack
from dartree.fast.results import CandidateSet, DepthStep, GreedyWalk, check_depth_step
from dartree.scoring import child_scores, log_normalize, rest_logsumexp
from dartree.structure import PAD, tree_structure

__all__ = ["topk_candidates", "depth_step", "top_b", "tree_structure", "greedy_walk"]


def topk_candidates(logits: Tensor, topk: int, vocab_normalize: bool) -> CandidateSet:
    """Top-K candidates per position (logit descending, ties by token id) and their log q: one ``topk`` over packed
    (logit, token id) keys, with no data-dependent branch (this twin serves devices where reading a flag is a
    host sync).  Shape: logits float ``[b, gamma, V]`` -> :class:`CandidateSet` with ``K = topk``."""
    x = logits.float()
    vocab = x.shape[-1]
    tokens = torch.topk(pack(x, torch.arange(vocab, device=x.device)), topk, dim=-1).indices
    values = torch.gather(x, -1, tokens)
    if vocab_normalize and topk < vocab:
        rest_lse = rest_logsumexp(x, tokens)  # the reference's normaliser (dartree.scoring)
    else:
        rest_lse = torch.full(x.shape[:2], float("-inf"), device=x.device)
    return CandidateSet(tokens=tokens, logits=values, rest_lse=rest_lse, log_q=log_normalize(values, rest_lse))


def depth_step(parent_scores: Tensor, log_q: Tensor, beta: float, width: int) -> DepthStep:
    """Score all children of ``m`` branches and keep the best ``width`` under the total order.

    With the branches in rank-path order a child's tie-break key is its flat index ``parent * K + rank``; the
    kept children come in that order too.

    Shape:
        parent_scores: float32 ``[b, m]``; log_q: float32 ``[b, m | 1, K]``; ``1 <= width <= m * K``
        -> :class:`DepthStep` of ``[b, width]``.
    """
    b, m, topk = check_depth_step(parent_scores, log_q, width)
    scores = child_scores(parent_scores, log_q, beta).expand(b, m, topk).reshape(b, m * topk)
    # A stable descending sort keeps equal scores in flat-index order: the total order in one pass.
    best = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :width]
    lex = torch.sort(best, dim=1).values
    return DepthStep(parents=lex // topk, ranks=lex % topk, scores=torch.gather(scores, 1, lex))


def top_b(scores: Tensor, budget: int) -> Tensor:
    """int64 ``[b, budget]``: positions of the best ``budget`` scores (float32 ``[b, N]``), best first; ties by
    position."""
    if not 1 <= budget <= scores.shape[1]:
        raise ValueError(f"budget: {budget} outside 1..{scores.shape[1]}")
    return torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :budget]


def greedy_walk(tokens: Tensor, parents: Tensor, num_nodes: Tensor, picks: Tensor) -> GreedyWalk:
    """Walk from the root to the child whose token equals the parent's pick, while one does (siblings carry
    distinct tokens: one chain).  Shape: tokens, parents, picks (the target's token at each node) int64
    ``[b, n]``; num_nodes int64 ``[b]`` -> :class:`GreedyWalk`."""
    b, n = tokens.shape
    dev = tokens.device
    idx = torch.arange(n, device=dev).expand(b, n)
    valid = idx < num_nodes[:, None]
    child = valid & (idx > 0)
    jump = torch.where(child, parents, torch.zeros_like(parents))
    parent_pick = torch.gather(picks, 1, jump)
    ok = (child & (tokens == parent_pick)) | (idx == 0)
    for _ in range(max(n - 1, 0).bit_length()):  # AND over ancestors at distances < 2**k
        ok = ok & torch.gather(ok, 1, jump)
        jump = torch.gather(jump, 1, jump)
    accepted_length = ok.sum(1) - 1
    order = torch.sort((~ok).to(torch.int8), dim=1, stable=True).indices  # index order = root-to-leaf
    accepted = torch.where(idx <= accepted_length[:, None], order, torch.full_like(order, PAD))
    last = torch.gather(accepted, 1, accepted_length[:, None])
    bonus = torch.gather(picks, 1, last)[:, 0]
    return GreedyWalk(accepted=accepted, accepted_length=accepted_length, bonus=bonus)
