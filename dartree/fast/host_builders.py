"""The fast builders on CPU tensors: the loops of a build run in the compiled module (``dartree/_native.c``).

Same trees as the reference (same nodes, order and float32 scores).  Used only when the module is built
and enabled (:func:`dartree.fast.ops.builders`); without it the CPU runs the tensorized builders.  A build
is a few C calls plus the head's calls; no torch op runs on a small tensor (docs/kernels.md).
"""

from __future__ import annotations

import numpy as np
import torch

from dartree import native
from dartree.block import DraftBlock
from dartree.fast import expansion
from dartree.fast.heads import HeadSteps
from dartree.fast.widths import pruned_widths, quota_widths, trie_size
from dartree.protocols import CorrectionHead
from dartree.scoring import too_few_finite
from dartree.structure import PAD
from dartree.tree import DraftTree

__all__ = ["chain", "ddtree", "corrected_chain", "corrected_chain_ddtree", "dartree_fixed", "dartree_pruned",
           "HostCandidates"]


class HostCandidates:
    """``C_d`` of every depth, from one C call: numpy ``tokens`` int64 / ``logits`` float32 ``[b, gamma, K]``,
    ``rest`` float32 ``[b, gamma]`` (None: -inf everywhere), base ``log_q`` float32 ``[b, gamma, K]``, and
    ``tokens_t`` (torch view).  NaN / +inf logits, or a position with fewer than K logits above -inf, raise."""

    def __init__(self, block: DraftBlock, topk: int, normalize: str) -> None:
        x = block.logits
        if x.dtype != torch.float32 or not x.is_contiguous():
            x = x.float().contiguous()
        b, gamma, vocab = x.shape
        with_rest = normalize == "vocab" and topk < vocab  # every token a candidate: no rest
        self.tokens = np.empty((b, gamma, topk), dtype=np.int64)
        self.logits = np.empty((b, gamma, topk), dtype=np.float32)
        self.log_q = np.empty((b, gamma, topk), dtype=np.float32)
        self.rest = np.empty((b, gamma), dtype=np.float32) if with_rest else None
        status, row, finite = native.lib().candidates(x.numpy(), b * gamma, vocab, topk, int(with_rest),
                                                      self.tokens, self.logits, self.rest, self.log_q)
        if status == 1:
            raise ValueError("block.logits: must not hold NaN or +inf (-inf is allowed, to mask tokens)")
        if status == 2:
            raise ValueError(too_few_finite(row // gamma, row % gamma + 1, finite, topk))
        self.tokens_t = torch.from_numpy(self.tokens)


def _columns_tree(ints: np.ndarray, scores: np.ndarray) -> DraftTree:
    """A DraftTree from the columns ``ints [4, b, n]`` (tokens, parents, depths, ranks) and ``scores [b, n]``."""
    t = torch.from_numpy(ints)
    return DraftTree(tokens=t[0], parents=t[1], depths=t[2], scores=torch.from_numpy(scores), ranks=t[3],
                     num_nodes=torch.full((ints.shape[1],), ints.shape[2], dtype=torch.int64))


def _best_first(block: DraftBlock, cands: HostCandidates, log_q: np.ndarray, budget: int,
                ranked: bool = False) -> DraftTree:
    """DDTree's best-first over per-depth distributions ``log_q [b, gamma, K]`` shared by all branches, one
    C call for every row.  Siblings are walked in (log q descending, rank) order: for base marginals that is
    rank order; a corrected distribution (``corrected-chain-ddtree``) is sorted first; ``ranked`` says it
    already is."""
    b, gamma, topk = log_q.shape
    n = trie_size(topk, gamma, budget) + 1
    order = None if ranked else np.argsort(-log_q, axis=-1, kind="stable")  # sibling order: score, then rank
    sorted_q = log_q if ranked else np.take_along_axis(log_q, order, -1)
    ints = np.empty((4, b, n), dtype=np.int64)  # tokens, parents, depths, ranks
    scores = np.empty((b, n), dtype=np.float32)
    native.lib().best_first(np.ascontiguousarray(sorted_q, dtype=np.float32), b, gamma, topk,
                            None if ranked else np.ascontiguousarray(order), n, cands.tokens,
                            np.ascontiguousarray(block.root.numpy(), dtype=np.int64),
                            ints[0], ints[1], ints[2], ints[3], scores)
    return _columns_tree(ints, scores)


def _expand(block: DraftBlock, cands: HostCandidates, widths: list[int], head: CorrectionHead, beta: float = 0.0,
            budget: int | None = None, trace: bool = False, bound: bool = False):
    """Depth-wise expansion (DARTree's Algorithm 1, chains with width 1) and the final selection: the DraftTree
    of the best ``budget`` supertree nodes (all when None) in the total order, or, with ``trace``, the
    ``[b, gamma, K]`` log q of a width-1 chain instead.

    Per depth one C call (log q, child scores, the best ``width``, rank paths, parent-state rows) and the head
    call; the outputs of every depth go into one preallocated buffer each (depth d's ``[b, W_d]`` block at
    ``b * offset_d``), which the compiled selection reads at the end.

    ``bound`` (``dartree-pruned``; docs/builders.md, "Bound pruning"): once the rows hold ``budget`` nodes,
    one C call per depth (``bound_frontier``) says whether any branch may still have a child ranking at or
    before its row's ``budget``-th node; when none does, the expansion stops.  No branch is dropped before
    that (a head call on fewer rows need not give the same float bits), so the tree is Algorithm 1's."""
    lib = native.lib()
    b, gamma, topk = block.batch_size, len(widths), cands.tokens.shape[-1]
    total = sum(widths)  # the most nodes the buffers hold (the bound only ever keeps fewer)
    branching = not trace and max(widths) > 1  # a chain needs no sort: depth order is the total order
    ints = np.empty((4, b * total), dtype=np.int64)  # parents, ranks, tokens, parent-state rows
    scores = np.empty(b * total, dtype=np.float32)
    paths = np.zeros(b * (total + 1) * gamma, dtype=np.int64) if branching else None  # a zero root path first
    # the compiled depth step's inputs, contiguous per depth: tokens [gamma, b, K], rest float64 [gamma, b] or None
    tokens_by_depth = np.ascontiguousarray(cands.tokens.transpose(1, 0, 2))
    rest_by_depth = None if cands.rest is None else np.ascontiguousarray(cands.rest.T, dtype=np.float64)
    steps = HeadSteps(head, block, cands.tokens_t)
    states = steps.initial()
    logits = steps.logits(1, states)
    parent_scores = np.zeros(b, dtype=np.float32)
    traced = []
    # perf: scratch the C calls write into, allocated once (they accept buffers at least as long as needed)
    most = max(widths)
    lq_scratch = None if trace else np.empty(b * most * topk, dtype=np.float32)
    used = np.zeros(gamma, dtype=np.int64)  # the width of every expanded depth (0: never expanded)
    expanded = 0
    lo = branches = 0
    for depth, width in enumerate(widths, start=1):
        m = 1 if depth == 1 else widths[depth - 2]
        hi = lo + b * width
        if logits.dtype == torch.float32 and logits.is_contiguous() and not logits.requires_grad:
            z = logits.numpy()
        else:
            z = np.ascontiguousarray(logits.detach().float().numpy())
        lq = np.empty((b, m, topk), dtype=np.float32) if trace else lq_scratch
        branches += b * m
        if branching:  # the previous depth's paths (the root's zeros at depth 1), then this depth's
            start = b * gamma + (lo - b * m) * gamma
            anc_in = paths[: b * gamma] if depth == 1 else paths[start: b * gamma + lo * gamma]
            anc_out = paths[b * gamma + lo * gamma: b * gamma + hi * gamma]
        else:
            anc_in = anc_out = None
        bad, identity = lib.depth_step(z, b, m, topk, None if rest_by_depth is None else rest_by_depth[depth - 1],
                                       parent_scores, beta, width, tokens_by_depth[depth - 1], lq, ints[0, lo:hi],
                                       ints[1, lo:hi], ints[2, lo:hi], scores[lo:hi], anc_in, anc_out, gamma, depth,
                                       ints[3, lo:hi])
        if bad:
            raise ValueError("head.logits: must be finite (found NaN or inf)")
        used[depth - 1], expanded = width, depth
        parent_scores = scores[lo:hi]
        if trace:
            traced.append(lq)
        if depth == gamma:  # the last depth's advance would never be used
            break
        if bound and hi >= b * budget:  # the rows hold `budget` nodes: does a branch not rank after the budget-th?
            keep = lib.bound_frontier(b, gamma, depth, used, budget, ints[1, :hi], scores[:hi],
                                      None if paths is None else paths[b * gamma: b * gamma + hi * gamma], beta)
            if keep == 0:  # no row keeps a branch: nothing deeper can enter the tree
                break
        lo = hi
        if not identity:
            flat = states.reshape(b * m, states.shape[-1])
            states = flat.index_select(0, torch.from_numpy(ints[3, lo - b * width:lo])).view(b, width, -1)
        tokens = torch.from_numpy(ints[2, lo - b * width:lo]).view(b, width)
        states, logits = steps.advance_logits(depth, states, tokens)
    expansion.record(expansion.Expansion(depths=expanded, full_depths=gamma, branches=branches,
                                         full_branches=b * (1 + sum(widths[:-1]))))
    if trace:
        return np.concatenate(traced, axis=1)
    return _selected(lib, block, used, budget, ints, scores, paths)


def _selected(lib, block: DraftBlock, used: np.ndarray, budget: int | None, ints: np.ndarray, scores: np.ndarray,
              paths: np.ndarray | None) -> DraftTree:
    """The DraftTree of the best ``budget`` nodes (all when None) of a depth-wise expansion's buffers."""
    b, gamma = block.batch_size, used.shape[0]
    total = scores.shape[0] // b
    n_out = total if budget is None else min(budget, total)
    out = np.empty((4, b, n_out + 1), dtype=np.int64)  # tokens, parents, depths, ranks
    out_scores = np.empty((b, n_out + 1), dtype=np.float32)
    root = np.ascontiguousarray(block.root.numpy(), dtype=np.int64)
    lib.select_tree(b, gamma, used, n_out, ints[0], ints[1], ints[2], scores,
                    None if paths is None else paths[b * gamma:], root, out[0], out[1], out[2], out[3], out_scores)
    return _columns_tree(out, out_scores)


# ---------------------------------------------------------------------------------- builders
def chain(block: DraftBlock, head: None, config) -> DraftTree:
    """The best candidate of every depth; scores are the float32 running sum of their log q (numpy's
    ``cumsum`` adds in order, in float32: ``(parent + log q) + 0``, as every builder does)."""
    cands = HostCandidates(block, config.topk, config.normalize)
    b, gamma = cands.tokens.shape[:2]
    ints = np.zeros((4, b, gamma + 1), dtype=np.int64)  # tokens, parents, depths, ranks
    ints[0, :, 0] = block.root.numpy()
    ints[0, :, 1:] = cands.tokens[:, :, 0]
    ints[1] = np.arange(-1, gamma)  # the root's parent is PAD (-1)
    ints[2] = np.arange(gamma + 1)
    ints[3, :, 0] = PAD
    scores = np.zeros((b, gamma + 1), dtype=np.float32)
    scores[:, 1:] = np.cumsum(cands.log_q[:, :, 0], axis=1, dtype=np.float32) + np.float32(0.0)
    return _columns_tree(ints, scores)


def corrected_chain(block: DraftBlock, head: CorrectionHead, config) -> DraftTree:
    widths = [1] * block.gamma
    cands = HostCandidates(block, config.topk, config.normalize)
    return _expand(block, cands, widths, head)


def ddtree(block: DraftBlock, head: None, config) -> DraftTree:
    cands = HostCandidates(block, config.topk, config.normalize)
    return _best_first(block, cands, cands.log_q, config.budget, ranked=True)


def corrected_chain_ddtree(block: DraftBlock, head: CorrectionHead, config) -> DraftTree:
    cands = HostCandidates(block, config.topk, config.normalize)
    log_q = _expand(block, cands, [1] * block.gamma, head, trace=True)
    return _best_first(block, cands, log_q, config.budget)


def dartree_fixed(block: DraftBlock, head: CorrectionHead, config) -> DraftTree:
    widths = quota_widths(config.budget, config.topk, block.gamma)
    cands = HostCandidates(block, config.topk, config.normalize)
    return _expand(block, cands, widths, head)


def dartree_pruned(block: DraftBlock, head: CorrectionHead, config) -> DraftTree:
    widths = pruned_widths(config.width, config.topk, block.gamma)
    cands = HostCandidates(block, config.topk, config.normalize)
    return _expand(block, cands, widths, head, beta=config.beta, budget=config.budget, bound=config.bound)

