"""The fast builders on CPU tensors: numpy on the host, a Python heap where the algorithm is a heap.

Same trees as the reference (same nodes, order and float32 scores) and as the tensorized builders
of :mod:`dartree.fast.tensor_builders`, which serve every other device.  A build here is a handful
of numpy calls per depth plus the head calls; no torch op runs on a small tensor.

- Candidates: :func:`dartree.fast.host.select` (one pass over the vocabulary) and, for
  ``normalize="vocab"``, :func:`dartree.scoring.rest_logsumexp` (one exp pass).
- ``ddtree`` / ``corrected-chain-ddtree``: DDTree's best-first with lazy sibling pushing over
  per-depth distributions shared by every branch: a node's children are in rank order with
  non-increasing scores, so the heap holds only the best unpopped child of each popped node and
  each pop pushes at most two entries (its next sibling and its first child).
- depth-wise builders: per depth, the scores of all children of the kept branches, the best
  ``width`` by one ``np.partition`` (ties by flat index), and one fused head call
  (``advance_logits``) or the two-call form; no ``advance`` after the last depth.
"""

from __future__ import annotations

import heapq
from array import array

import numpy as np
import torch

from dartree import native
from dartree.block import DraftBlock
from dartree.fast import expansion
from dartree.fast.heads import HeadSteps
from dartree.fast.host import candidates_native, keep_best, select
from dartree.fast.widths import pruned_widths, quota_widths, trie_size
from dartree.protocols import CorrectionHead
from dartree.scoring import log_normalize_host, rest_logsumexp
from dartree.structure import PAD
from dartree.tree import DraftTree

__all__ = ["chain", "ddtree", "corrected_chain", "corrected_chain_ddtree", "dartree_fixed", "dartree_pruned",
           "HostCandidates", "candidate_set"]


class HostCandidates:
    """``C_d`` of every depth: numpy ``tokens`` int64 / ``logits`` float32 ``[b, gamma, K]``, ``rest``
    float32 ``[b, gamma]``, base ``log_q`` float32 ``[b, gamma, K]``, and ``tokens_t`` (torch view)."""

    def __init__(self, block: DraftBlock, topk: int, normalize: str) -> None:
        x = block.logits
        if x.dtype != torch.float32 or not x.is_contiguous():
            x = x.float().contiguous()
        self.rest: np.ndarray | None = None  # None: -inf everywhere (log_normalize_host skips it)
        with_rest = normalize == "vocab" and topk < x.shape[-1]
        lib = native.lib()
        if lib is not None:  # selection, normaliser and log q: one C call, the same bits
            self.tokens, self.logits, self.log_q, self.rest = candidates_native(lib, x, topk, with_rest)
        else:
            self.tokens, self.logits = select(x, topk)
            if with_rest:
                top = torch.from_numpy(self.logits[..., 0])
                self.rest = rest_logsumexp(x, torch.from_numpy(self.tokens), top).numpy()
            self.log_q = log_normalize_host(self.logits, self.rest)
        self.tokens_t = torch.from_numpy(self.tokens)
        self._by_depth: tuple[np.ndarray, np.ndarray | None] | None = None

    def by_depth(self) -> tuple[np.ndarray, np.ndarray | None]:
        """``tokens`` as ``[gamma, b, K]`` and ``rest`` as float64 ``[gamma, b]`` (or None), contiguous per
        depth: the inputs of the compiled depth step."""
        if self._by_depth is None:
            rest = None if self.rest is None else np.ascontiguousarray(self.rest.T, dtype=np.float64)
            self._by_depth = (np.ascontiguousarray(self.tokens.transpose(1, 0, 2)), rest)
        return self._by_depth

    def rest_at(self, depth: int) -> np.ndarray | None:
        """``rest_lse`` of ``depth`` (1-based) as ``[b, 1]``, or None for -inf."""
        return None if self.rest is None else self.rest[:, depth - 1, None]


candidate_set = HostCandidates


def _columns_tree(ints: np.ndarray, scores: np.ndarray) -> DraftTree:
    """A DraftTree from the columns ``ints [4, b, n]`` (tokens, parents, depths, ranks) and ``scores [b, n]``."""
    t = torch.from_numpy(ints)
    return DraftTree(tokens=t[0], parents=t[1], depths=t[2], scores=torch.from_numpy(scores), ranks=t[3],
                     num_nodes=torch.full((ints.shape[1],), ints.shape[2], dtype=torch.int64))


def _record(widths: list[int], b: int, depths: int, branches: int) -> None:
    """:func:`dartree.fast.expansion.record` of a depth-wise build with ``widths`` on ``b`` rows."""
    expansion.record(expansion.Expansion(depths=depths, full_depths=len(widths), branches=branches,
                                         full_branches=b * (1 + sum(widths[:-1]))))


def _tree(block: DraftBlock, tokens: np.ndarray, parents: np.ndarray, depths: np.ndarray, scores: np.ndarray,
          ranks: np.ndarray) -> DraftTree:
    """A DraftTree from draft-node columns ``[b, n_out]`` (total order), the root prepended."""
    b, n_out = tokens.shape
    ints = np.empty((4, b, n_out + 1), dtype=np.int64)  # one buffer: tokens, parents, depths, ranks
    ints[:, :, 0] = PAD
    ints[0, :, 0] = block.root.numpy()
    ints[2, :, 0] = 0
    ints[0, :, 1:], ints[1, :, 1:], ints[2, :, 1:], ints[3, :, 1:] = tokens, parents, depths, ranks
    sc = np.empty((b, n_out + 1), dtype=np.float32)
    sc[:, 0] = 0.0
    sc[:, 1:] = scores
    return _columns_tree(ints, sc)


# --------------------------------------------------------------------------------- best-first
# A rank path as one integer: digit (rank + 1) at depth d, base K + 1, most significant first, so integer
# order is the lexicographic order with a prefix first (a Python int never overflows).  Heap entries are
# (-score, rank path code, parent node, depth, position among the sorted siblings): the code is compared
# only between equal scores.  Scores are rounded to float32 by storing them in an array("f").

def _pops_ranked(lq: list, topk: int, gamma: int, n: int, pars: list, deps: list, pos_out: list,
                 sc: list) -> None:
    """Best-first over rank-sorted rows ``lq[depth - 1][rank]``; appends the popped nodes' columns."""
    place = [(topk + 1) ** (gamma - d) for d in range(gamma + 1)]
    f32 = array("f", [0.0 + lq[0][0]])  # root score + log q (-0.0 becomes +0.0)
    replace, push = heapq.heapreplace, heapq.heappush
    heap = [(-f32[0], place[1], 0, 1, 0)]
    base = len(sc) - 1  # the row's root
    for node in range(1, n):
        neg, code, parent, depth, pos = heap[0]  # it leaves; its next sibling (never better) replaces it
        pars.append(parent)
        deps.append(depth)
        pos_out.append(pos)
        sc.append(-neg)
        pos += 1
        if pos < topk:
            f32[0] = sc[base + parent] + lq[depth - 1][pos]
            replace(heap, (-f32[0], code + place[depth], parent, depth, pos))
        else:
            heapq.heappop(heap)
        if depth < gamma:  # the first child enters the heap
            f32[0] = lq[depth][0] - neg
            push(heap, (-f32[0], code + place[depth + 1], node, depth + 1, 0))


def _pops_sorted(lq: list, rk: list, topk: int, gamma: int, n: int, pars: list, deps: list, pos_out: list,
                 sc: list) -> None:
    """As :func:`_pops_ranked` over rows sorted by (log q descending, rank); ``rk[depth - 1][pos]`` is the
    rank at a sorted position (the code holds ranks)."""
    place = [(topk + 1) ** (gamma - d) for d in range(gamma + 1)]
    f32 = array("f", [0.0 + lq[0][0]])  # root score + log q (-0.0 becomes +0.0)
    replace, push = heapq.heapreplace, heapq.heappush
    heap = [(-f32[0], (rk[0][0] + 1) * place[1], 0, 1, 0)]
    base = len(sc) - 1
    for node in range(1, n):
        neg, code, parent, depth, pos = heap[0]
        pars.append(parent)
        deps.append(depth)
        pos_out.append(pos)
        sc.append(-neg)
        if pos + 1 < topk:
            f32[0] = sc[base + parent] + lq[depth - 1][pos + 1]
            step = rk[depth - 1][pos + 1] - rk[depth - 1][pos]
            replace(heap, (-f32[0], code + step * place[depth], parent, depth, pos + 1))
        else:
            heapq.heappop(heap)
        if depth < gamma:
            f32[0] = lq[depth][0] - neg
            push(heap, (-f32[0], code + (rk[depth][0] + 1) * place[depth + 1], node, depth + 1, 0))


def _best_first(block: DraftBlock, cands: HostCandidates, log_q: np.ndarray, budget: int,
                ranked: bool = False) -> DraftTree:
    """DDTree's best-first over per-depth distributions ``log_q [b, gamma, K]`` shared by all branches.

    Siblings are walked in (log q descending, rank) order: for base marginals that is rank order; a
    corrected distribution (``corrected-chain-ddtree``) is sorted first; ``ranked`` says it already is.
    The output columns are written as the nodes pop (Python lists, one numpy conversion at the end).
    """
    b, gamma, topk = log_q.shape
    n = trie_size(topk, gamma, budget) + 1
    order = None if ranked else np.argsort(-log_q, axis=-1, kind="stable")  # sibling order: score, then rank
    sorted_q = log_q if ranked else np.take_along_axis(log_q, order, -1)
    lib = native.lib()
    if lib is not None:  # the same pops, one C call for every row
        ints = np.empty((4, b, n), dtype=np.int64)  # tokens, parents, depths, ranks
        scores = np.empty((b, n), dtype=np.float32)
        lib.best_first(np.ascontiguousarray(sorted_q, dtype=np.float32), b, gamma, topk,
                       None if ranked else np.ascontiguousarray(order), n, cands.tokens,
                       np.ascontiguousarray(block.root.numpy(), dtype=np.int64),
                       ints[0], ints[1], ints[2], ints[3], scores)
        return _columns_tree(ints, scores)
    pars, deps, pos, sc = [], [], [], []
    for r in range(b):
        pars.append(PAD)  # the root
        deps.append(0)
        pos.append(0)
        sc.append(0.0)
        if ranked:
            _pops_ranked(sorted_q[r].tolist(), topk, gamma, n, pars, deps, pos, sc)
        else:
            _pops_sorted(sorted_q[r].tolist(), order[r].tolist(), topk, gamma, n, pars, deps, pos, sc)
    ints = np.array(array("q", pars + deps + pos)).reshape(3, b, n)
    return _best_first_tree(block, cands, ints, np.array(array("f", sc)).reshape(b, n), order)


def _best_first_tree(block: DraftBlock, cands: HostCandidates, ints: np.ndarray, scores: np.ndarray,
                     order: np.ndarray | None) -> DraftTree:
    """The DraftTree of best-first columns ``ints = [parents, depths, sorted positions]`` ``[3, b, n]``
    (``order``: rank at each sorted position, None when positions are ranks)."""
    b, n = scores.shape
    d1 = ints[1] - 1
    d1[:, 0] = 0
    rows = np.arange(b)[:, None]
    if order is not None:
        ints[2] = order[rows, d1, ints[2]]  # sorted position -> rank
    ints[2, :, 0] = PAD
    tokens = cands.tokens[rows, d1, ints[2]]
    tokens[:, 0] = block.root.numpy()
    t = torch.from_numpy(ints)
    return DraftTree(tokens=torch.from_numpy(tokens), parents=t[0], depths=t[1], scores=torch.from_numpy(scores),
                     ranks=t[2], num_nodes=torch.full((b,), n, dtype=torch.int64))


# -------------------------------------------------------------------------------- depth-wise
def _expand(block: DraftBlock, cands: HostCandidates, widths: list[int], head: CorrectionHead | None,
            beta: float = 0.0, budget: int | None = None, trace: bool = False, bound: bool = False):
    """Depth-wise expansion (DARTree's Algorithm 1, chains with width 1) and the final selection.

    Returns the DraftTree of the best ``budget`` supertree nodes (all when None) in the total order,
    or, with ``trace``, the ``[b, gamma, K]`` log q of a width-1 chain instead.
    """
    lib = native.lib()
    if lib is not None and head is not None:
        return _expand_native(lib, block, cands, widths, head, beta, budget, trace, bound)
    b = block.batch_size
    gamma = len(widths)
    topk = cands.tokens.shape[-1]
    rows = np.arange(b)[:, None]
    rows_t = torch.arange(b)[:, None]
    scores = np.zeros((b, 1), dtype=np.float32)
    beta32 = np.float32(beta)
    states = logits = None
    if head is not None:
        steps = HeadSteps(head, block, cands.tokens_t)
        states = steps.initial()
        logits = steps.logits(1, states)
    parents, ranks, tokens, depth_scores, lex, traced = [], [], [], [], [], []
    branching = not trace and max(widths) > 1  # a chain needs no sort: depth order is the total order
    anc = np.zeros((b, 1, gamma), dtype=np.int64)  # 1-based lex index of each kept node's ancestor per depth
    for depth, width in enumerate(widths, start=1):
        if head is not None:
            lq = log_normalize_host(logits.detach().float().numpy(), cands.rest_at(depth))  # [b, m, K]
            if not np.isfinite(lq).all():  # a NaN / inf logit gives NaN or -inf log q
                raise ValueError("head.logits: must be finite (found NaN or inf)")
            child = (scores[:, :, None] + lq) + beta32
        else:
            lq = cands.log_q[:, depth - 1 : depth]  # [b, 1, K] shared by every branch
            child = np.ascontiguousarray((scores[:, :, None] + lq) + beta32)
        if trace:
            traced.append(lq)
        flat = child.reshape(b, -1)
        kept = keep_best(flat, width)  # [b, W] in rank-path order
        par, rk = np.divmod(kept, topk)
        tok = cands.tokens[:, depth - 1][rows, rk]
        scores = flat[rows, kept]
        parents.append(par)
        ranks.append(rk)
        tokens.append(tok)
        depth_scores.append(scores)
        if branching:
            anc = anc[rows, par]
            anc[:, :, depth - 1] = np.arange(1, width + 1)
            lex.append(anc)
        if head is not None and depth < gamma:  # the last depth's advance would never be used
            states, logits = steps.advance_logits(depth, states[rows_t, torch.from_numpy(par)], torch.from_numpy(tok))
    _record(widths, b, gamma, b * (1 + sum(widths[:-1])))
    if trace:
        return np.concatenate(traced, axis=1)
    return _select_tree(block, parents, ranks, tokens, depth_scores, lex, budget)


def _expand_native(lib, block: DraftBlock, cands: HostCandidates, widths: list[int], head: CorrectionHead,
                   beta: float, budget: int | None, trace: bool, bound: bool = False):
    """:func:`_expand` with the compiled depth step and selection (``dartree/_native.c``): per depth one C
    call (log q, child scores, the best ``width``, rank paths, parent-state rows) and the head call; the
    outputs of every depth go into one preallocated buffer each (depth d's ``[b, W_d]`` block at
    ``b * offset_d``), which the compiled selection reads at the end.

    ``bound`` (``dartree-pruned``; docs/builders.md, "Bound pruning"): after each depth, once a row holds
    ``budget`` nodes, one C call (``bound_frontier``) finds the branches that may have a child ranking at
    or before the row's ``budget``-th best node (ties broken by rank path; a child scores at most its
    parent's score plus ``beta``); when no row keeps one, the expansion stops: no deeper node can enter
    the tree.  Until then nothing changes: single branches are not dropped, because
    a head call on fewer rows need not give the same float bits per row (a real GRU's matmul does not;
    measured on the zoo, dropping them saved no further depth), and every head call made is the one
    Algorithm 1 makes, so the tree is identical bit for bit."""
    b, gamma, topk = block.batch_size, len(widths), cands.tokens.shape[-1]
    total = sum(widths)  # the most nodes the buffers hold (the bound only ever keeps fewer)
    branching = not trace and max(widths) > 1  # a chain needs no sort: depth order is the total order
    ints = np.empty((4, b * total), dtype=np.int64)  # parents, ranks, tokens, parent-state rows
    scores = np.empty(b * total, dtype=np.float32)
    paths = np.zeros(b * (total + 1) * gamma, dtype=np.int64) if branching else None  # a zero root path first
    tokens_by_depth, rest_by_depth = cands.by_depth()
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
    _record(widths, b, expanded, branches)
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


def _select_tree(block: DraftBlock, parents: list[np.ndarray], ranks: list[np.ndarray], tokens: list[np.ndarray],
                 scores: list[np.ndarray], lex: list[np.ndarray], budget: int | None) -> DraftTree:
    """The best ``budget`` supertree nodes (all when None) as a DraftTree in the total order."""
    b = block.batch_size
    widths = [p.shape[1] for p in parents]
    offsets = np.cumsum([0] + widths)
    flat_par = np.concatenate([np.full((b, widths[0]), -1)] + [p + offsets[d] for d, p in enumerate(parents[1:])],
                              axis=1)
    flat_sc = np.concatenate(scores, axis=1)
    depths = np.concatenate([np.full(w, d, dtype=np.int64) for d, w in enumerate(widths, start=1)])
    total = flat_sc.shape[1]
    n_out = total if budget is None else min(budget, total)
    if not lex:  # a chain: depth order is the total order
        sel = np.broadcast_to(np.arange(n_out), (b, n_out))
    else:
        gamma = len(widths)
        paths = np.concatenate(lex, axis=1)
        keys = [paths[..., j] for j in reversed(range(gamma))] + [-flat_sc]
        sel = np.lexsort(keys, axis=-1)[:, :n_out]  # score descending, then rank path (a prefix first)
    slot = np.zeros((b, total), dtype=np.int64)
    np.put_along_axis(slot, sel, np.arange(1, n_out + 1)[None, :], 1)
    par = np.take_along_axis(flat_par, sel, 1)
    out_par = np.where(par < 0, 0, np.take_along_axis(slot, np.maximum(par, 0), 1))
    return _tree(block, np.take_along_axis(np.concatenate(tokens, 1), sel, 1), out_par,
                 depths[sel],
                 np.take_along_axis(flat_sc, sel, 1), np.take_along_axis(np.concatenate(ranks, 1), sel, 1))


# ---------------------------------------------------------------------------------- builders
def chain(block: DraftBlock, head: None, config) -> DraftTree:
    """The best candidate of every depth; scores are the float32 running sum of their log q (numpy's
    ``cumsum`` adds in order, in float32: ``(parent + log q) + 0``, as every builder does)."""
    cands = HostCandidates(block, config.topk, config.normalize)
    b, gamma = cands.tokens.shape[:2]
    scores = np.cumsum(cands.log_q[:, :, 0], axis=1, dtype=np.float32) + np.float32(0.0)
    parents = np.broadcast_to(np.arange(gamma), (b, gamma))
    return _tree(block, cands.tokens[:, :, 0], parents, parents + 1, scores, np.zeros((b, gamma), dtype=np.int64))


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

