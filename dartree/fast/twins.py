"""Torch twins of the Triton kernels: same signatures, same output contracts.

They run on the CPU (and anywhere Triton does not) and are the reference the kernels are tested
against.  Floats are computed with the very expressions of :mod:`dartree.scoring`, so a tree built
through the twins carries bit-identical scores to the reference builders'.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dartree.fast.keys import pack
from dartree.fast.results import CandidateSet, DepthStep, GreedyWalk, TreeStructure
from dartree.scoring import child_scores, log_normalize
from dartree.tree import PAD

__all__ = ["topk_candidates", "depth_step", "top_b", "tree_structure", "greedy_walk"]


def topk_candidates(logits: Tensor, topk: int, vocab_normalize: bool) -> CandidateSet:
    """Top-K candidates per position (logit descending, ties by token id) and their log q.

    A float ``topk`` selects the right set unless the K-th largest logit is tied with a logit left
    out; then (and only then) one ``topk`` over packed (logit, token id) keys picks the smallest ids.
    That branch reads one bool on the host: free here, since the twin serves CPU tensors (CUDA
    tensors go to the Triton kernel, which is branch-free).  Either way the K tokens are then put in
    the total order by a stable sort, never by a full sort of the vocabulary.

    Shape:
        logits: float ``[b, gamma, V]`` -> :class:`CandidateSet` with ``K = topk``.
    """
    x = logits.float()
    vocab = x.shape[-1]
    values, tokens = torch.topk(x, topk, dim=-1, largest=True, sorted=True)
    if bool(((x >= values[..., -1:]).sum(-1) > topk).any()):  # a tie straddles the K-th place
        tokens = torch.topk(pack(x, torch.arange(vocab, device=x.device)), topk, dim=-1).indices
    tokens = torch.sort(tokens, dim=-1).values  # token id order, then a stable sort by logit
    order = torch.sort(torch.gather(x, -1, tokens), dim=-1, descending=True, stable=True).indices
    tokens = torch.gather(tokens, -1, order)
    values = torch.gather(x, -1, tokens)
    if vocab_normalize and topk < vocab:
        rest_lse = torch.logsumexp(x.scatter(-1, tokens, float("-inf")), dim=-1)  # as dartree.scoring
    else:
        rest_lse = torch.full(x.shape[:2], float("-inf"), device=x.device)
    return CandidateSet(tokens=tokens, logits=values, rest_lse=rest_lse, log_q=log_normalize(values, rest_lse))


def depth_step(parent_scores: Tensor, log_q: Tensor, beta: float, width: int) -> DepthStep:
    """Score all children of ``m`` branches and keep the best ``width`` under the total order.

    The branches must be given in rank-path lexicographic order; then a child's tie-break key is its
    flat index ``parent * K + rank`` and the kept children are returned in that order too.

    Shape:
        parent_scores: float32 ``[b, m]``; log_q: float32 ``[b, m, K]`` or ``[b, 1, K]`` (shared by
        all branches); ``1 <= width <= m * K`` -> :class:`DepthStep` of ``[b, width]``.
    """
    b, m = parent_scores.shape
    if log_q.dim() != 3 or log_q.shape[0] != b or log_q.shape[1] not in (1, m):
        raise ValueError(f"log_q: expected [{b}, {m} or 1, K], got {tuple(log_q.shape)}")
    topk = log_q.shape[-1]
    if not 1 <= width <= m * topk:
        raise ValueError(f"width: {width} outside 1..{m * topk} (branches x candidates)")
    scores = child_scores(parent_scores, log_q, beta).expand(b, m, topk).reshape(b, m * topk)
    # A stable descending sort keeps equal scores in flat-index order: the total order in one pass.
    best = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :width]
    lex = torch.sort(best, dim=1).values
    return DepthStep(parents=lex // topk, ranks=lex % topk, scores=torch.gather(scores, 1, lex))


def top_b(scores: Tensor, budget: int) -> Tensor:
    """int64 ``[b, budget]``: positions of the best ``budget`` scores, best first; ties by position.

    Shape:
        scores: float32 ``[b, N]``, ``budget <= N``.
    """
    if not 1 <= budget <= scores.shape[1]:
        raise ValueError(f"budget: {budget} outside 1..{scores.shape[1]}")
    return torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :budget]


def _doubling_steps(n: int) -> int:
    """Jumps of 1, 2, 4, ... that cover every ancestor distance up to ``n - 1``."""
    return max(n - 2, 0).bit_length()


def tree_structure(parents: Tensor, num_nodes: Tensor, prefix_len: int | Tensor = 0) -> TreeStructure:
    """Ancestor mask, positions and first-child / next-sibling links from parents (pointer doubling).

    Shape:
        parents: int64 ``[b, n]``; num_nodes: int64 ``[b]``; prefix_len: int or int64 ``[b]``.
    """
    b, n = parents.shape
    dev = parents.device
    idx = torch.arange(n, device=dev).expand(b, n)
    valid = idx < num_nodes[:, None]
    child = valid & (idx > 0)
    jump = torch.where(child, parents, idx)  # 2**k-th ancestor; the root and padding point to themselves
    mask = torch.zeros(b, n, n, dtype=torch.bool, device=dev)
    mask.scatter_(2, idx[:, :, None], valid[:, :, None])
    mask.scatter_(2, jump[:, :, None], valid[:, :, None])
    for _ in range(_doubling_steps(n)):
        mask = mask | torch.gather(mask, 1, jump[:, :, None].expand(b, n, n))
        jump = torch.gather(jump, 1, jump)
    depth = (mask.sum(2) - 1).clamp(min=0)
    prefix = torch.as_tensor(prefix_len, device=dev, dtype=torch.int64)
    positions = (prefix[:, None] if prefix.dim() == 1 else prefix) + depth

    par = torch.where(child, parents, torch.full_like(parents, n))  # non-children in group n (no parent)
    first = torch.full((b, n + 1), n, dtype=torch.int64, device=dev)
    first.scatter_reduce_(1, par, torch.where(child, idx, torch.full_like(idx, n)), reduce="amin")
    first = first[:, :n]
    first_child = torch.where(first < n, first, torch.full_like(first, PAD))
    # A stable sort by parent lists each sibling group in index order: the next sibling is the next entry.
    order = torch.sort(par, dim=1, stable=True).indices
    grouped = torch.gather(par, 1, order)
    same = torch.cat([(grouped[:, 1:] == grouped[:, :-1]) & (grouped[:, 1:] < n),
                      torch.zeros(b, 1, dtype=torch.bool, device=dev)], dim=1)
    following = torch.cat([order[:, 1:], torch.full((b, 1), PAD, dtype=torch.int64, device=dev)], dim=1)
    next_sibling = torch.full((b, n), PAD, dtype=torch.int64, device=dev)
    next_sibling.scatter_(1, order, torch.where(same, following, torch.full_like(following, PAD)))
    return TreeStructure(mask=mask, positions=positions, first_child=first_child, next_sibling=next_sibling)


def greedy_walk(tokens: Tensor, parents: Tensor, num_nodes: Tensor, picks: Tensor) -> GreedyWalk:
    """Walk from the root to the child whose token equals the parent's pick, while one does.

    Siblings carry distinct tokens, so the nodes whose every ancestor-or-self matches form one chain.

    Shape:
        tokens, parents: int64 ``[b, n]``; num_nodes: int64 ``[b]``; picks: int64 ``[b, n]`` the
        target's token at each node -> :class:`GreedyWalk`.
    """
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
