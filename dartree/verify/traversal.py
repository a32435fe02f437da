"""Traversal Verification: sampled draft trees verified leaf to root, sequence by sequence; lossless at T>0.

Weng et al. 2025 (arXiv 2505.12398), written from the algorithm's description, with our own sibling update for
draws without replacement.  The algorithm, why it is exact, the randomness, the tests and measurements:
docs/verification.md, "Traversal verification".

Shape: ``tree`` tensors ``[b, n]``; target logits ``[b, n, V]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from dartree.tree import DraftTree, children_lists
from dartree.verify.accept import VerifyResult, host_result
from dartree.verify.rejection import SampledTree, draw_index, proposal_row, walk_coins
from dartree.verify.warp import Warp

__all__ = ["verify_traversal", "traverse", "child_weight", "after_deletion", "children_of"]


def children_of(tree: DraftTree) -> list[list[list[int]]]:
    """Per row, per node, its children in sibling order (node index order).

    Shape: ``tree`` ``[b, n]`` -> host lists ``[b][n][children]``.
    """
    return [children_lists(parents, count)
            for count, parents in zip(tree.num_nodes.tolist(), tree.parents.tolist(), strict=True)]


def child_weight(w: float, r: np.ndarray, s: np.ndarray, x: int) -> float:
    """The weight of a child with token ``x`` under a node of weight ``w``: ``min(1, w r(x) / s(x))``.

    Shape: ``r``, ``s``: float64 ``[V]`` (host).
    """
    return 1.0 if s[x] <= 0 else min(1.0, w * r[x] / s[x])


def after_deletion(w: float, r: np.ndarray, s: np.ndarray, x: int) -> tuple[float, np.ndarray, np.ndarray]:
    """The node's weight, target and proposal after its child ``x`` (and that child's subtree) was deleted:
    ``A / (1 - w + A)``, ``norm(max(w r - s, 0))`` and ``s`` without ``x`` (module docstring).

    Shape: ``r``, ``s``: float64 ``[V]`` (host).
    """
    if w == 1.0:
        rest = r - s                                # 1.0 * r is r bit for bit (perf: one pass fewer)
    else:
        rest = w * r                                # perf: in place, 4 passes over V for the residual
        rest -= s
    np.maximum(rest, 0.0, out=rest)
    mass = float(rest.sum())
    left = 1.0 - w + mass
    # left == 0 (w == 1 and r == s) only when deleting had probability 0; mass == 0: the weight is 0 and r unused
    w_next = min(1.0, mass / left) if left > 0 else w
    if mass > 0:
        rest /= mass
    total = 1.0 - s[x]                              # s sums to 1 (float64)
    s_next = s / total if total > 0 else s.copy()
    s_next[x] = 0.0
    return w_next, (rest if mass > 0 else r), s_next


def traverse(children: Sequence[Sequence[int]], tokens: Sequence[int], target: Callable[[int], np.ndarray],
             proposal: Callable[[int], np.ndarray], coin: Callable[[float], bool]) -> tuple[list[int], np.ndarray]:
    """One tree's Traversal Verification (module docstring): the accepted path (node indices, the root ``0``
    first) and the distribution its bonus is drawn from.

    ``children[u]``: node ``u``'s children in sibling order; ``tokens[u]``: node ``u``'s token; ``target(u)``:
    the warped target distribution at ``u`` (float64 ``[V]``); ``proposal(u)``: the distribution ``u``'s
    children were drawn from; ``coin(a)``: ``True`` with probability ``a`` (one call per leaf tested).
    """

    def visit(u: int, w: float) -> list[int] | None:
        nonlocal bonus
        if w <= 0:                  # a weight-0 subtree: every weight below is 0, all of it is deleted (perf)
            return None
        r = None
        if children[u]:
            r, s = target(u), proposal(u)
            for c in children[u]:
                x = tokens[c]
                path = visit(c, child_weight(w, r, s, x))
                if path is not None:
                    return [u, *path]
                w, r, s = after_deletion(w, r, s, x)
        if u != 0 and not coin(w):
            return None
        bonus = target(u) if r is None else r
        return [u]

    bonus: np.ndarray | None = None
    path = visit(0, 1.0)
    assert path is not None and bonus is not None          # the root is always accepted
    return path, bonus


def _distributions(warp: Warp, logits: Tensor) -> np.ndarray:
    """The warped softmax, float64 on the host: computed in float32 and renormalised in float64 (perf: a float64
    softmax costs several times as much; the float32 one is the model's own precision).

    Shape: float ``[..., V]`` -> float64 ``[..., V]``.
    """
    p = warp.probs(logits.float()).cpu().numpy().astype(np.float64)
    p /= p.sum(-1, keepdims=True)
    return p


def verify_traversal(sampled: SampledTree, target_logits: Tensor, warp: Warp,
                     generator: torch.Generator | None = None) -> VerifyResult:
    """Traversal Verification of ``sampled.tree`` (module docstring); the committed tokens have the
    distribution of the target's (warped) sampling.  The contract of
    :func:`~dartree.verify.rejection.verify_rejection`: the same arguments and result.
    """
    coins = walk_coins(sampled, target_logits, warp, generator)
    tree = sampled.tree
    b, n = tree.tokens.shape
    vocab = target_logits.shape[-1]
    made = sampled.host_lists()            # perf: sample_tree's own lists of this tree, when it made them
    kids = children_of(tree) if made is None else made.children
    tokens = tree.tokens.tolist() if made is None else made.tokens
    # one host read of the target's distributions at every node with children and of the proposals (perf: the walk
    # visits most of them, so one read costs less than one per visited node); a leaf's only
    # when its path is accepted (its bonus)
    inner = [(row, u) for row in range(b) for u in range(n) if kids[row][u]]
    at = {pair: i for i, pair in enumerate(inner)}
    # float32 [b, R, P] on the host; a visited row is widened to float64 (exact) when its proposal is read
    proposals, support = sampled.host_proposals()
    widened = None                        # [R, V] float64 every proposal row renormalised, when made at once
    if b == 1 and [u for _, u in inner] == list(range(len(inner))):     # perf: a slice, no gather of [inner, V]
        if support is None:
            # perf: one row (a Sequoia shape): the inner nodes' targets and every proposal row widened and
            # renormalised together (numpy's row sums are its 1-D sums: the same bits as one row at a time), so a
            # visited node's proposal is a view, not three passes over the vocabulary
            k = len(inner)
            wide = np.empty((k + proposals.shape[1], vocab))
            wide[:k] = warp.probs(target_logits[0, :k]).cpu().numpy()
            wide[k:] = proposals[0]
            wide /= wide.sum(-1, keepdims=True)
            probs, widened = wide[:k], wide[k:]
        else:
            probs = _distributions(warp, target_logits[0, : len(inner)])                    # [inner, V]
    else:
        rows = torch.tensor([r for r, _ in inner], dtype=torch.int64, device=target_logits.device)
        nodes = torch.tensor([u for _, u in inner], dtype=torch.int64, device=target_logits.device)
        probs = _distributions(warp, target_logits[rows, nodes])                            # [inner, V]
    row_of = sampled.row_of.tolist() if made is None else made.row_of
    paths, bonus = [], []
    for row in range(b):
        used = 0

        def coin(a: float, row: int = row) -> bool:
            nonlocal used
            used += 1
            return bool(coins[row, used - 1] < a)

        def target(u: int, row: int = row) -> np.ndarray:
            i = at.get((row, u))
            return probs[i] if i is not None else _distributions(warp, target_logits[row, u])

        def proposal(u: int, row: int = row) -> np.ndarray:
            if widened is not None:
                return widened[row_of[row][u]]              # never written: the walk makes new arrays
            return proposal_row(proposals, support, row, row_of[row][u], vocab)

        path, residual = traverse(kids[row], tokens[row], target, proposal, coin)
        bonus.append(draw_index(residual, coins[row, used]))
        paths.append(path)
    committed = [[tokens[row][i] for i in path[1:]] + [bonus[row]] for row, path in enumerate(paths)]
    return host_result(paths, committed, None, n, tree.device)          # picks: none sampled at a node
