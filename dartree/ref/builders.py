"""Reference implementations of the seven tree builders (one row at a time, obviously correct).

Each function has the signature ``build(block, head, config) -> DraftTree`` and is registered in
:mod:`dartree.builders`; inputs are validated there.  See docs/builders.md for pseudo-code.
"""

from __future__ import annotations

import math

from dartree.block import CorrectionHead, DraftBlock
from dartree.ref.core import (
    Node,
    advance,
    assemble,
    base_log_q,
    best_first,
    children,
    depthwise,
    head_log_q,
    initial_state,
)
from dartree.scoring import candidates
from dartree.tree import DraftTree

__all__ = ["chain", "ddtree", "corrected_chain", "corrected_chain_ddtree", "sequential_heap", "dartree_fixed",
           "dartree_pruned"]


def _depthwise_tree(block: DraftBlock, head: CorrectionHead | None, config, quota, beta: float = 0.0,
                    budget: int | None = None) -> DraftTree:
    cands = candidates(block, config.topk, config.normalize)
    roots, rows = [], []
    for r in range(block.batch_size):
        root, nodes = depthwise(block, r, cands, head, quota, beta)
        if budget is not None:  # global top-B of the supertree (prefix-closed by Lemma 1)
            nodes = sorted(nodes, key=lambda u: u.key)[:budget]
        roots.append(root)
        rows.append(nodes)
    return assemble(roots, rows, block.device)


def chain(block: DraftBlock, head: None, config) -> DraftTree:
    """DFlash: the argmax of the base logits at every depth (gamma draft nodes)."""
    return _depthwise_tree(block, None, config, lambda depth, used: 1)


def corrected_chain(block: DraftBlock, head: CorrectionHead, config) -> DraftTree:
    """Domino: a greedy chain, each depth re-scored by the head along the chain's own path."""
    return _depthwise_tree(block, head, config, lambda depth, used: 1)


def dartree_fixed(block: DraftBlock, head: CorrectionHead, config) -> DraftTree:
    """DARTree (fixed): depth-wise batched expansion with quota ceil(remaining budget / remaining depths)."""
    gamma = block.gamma

    def quota(depth: int, used: int) -> int:
        return math.ceil((config.budget - used) / (gamma - depth + 1))

    return _depthwise_tree(block, head, config, quota)


def dartree_pruned(block: DraftBlock, head: CorrectionHead, config) -> DraftTree:
    """DARTree (pruned): a supertree of width W per depth, then one global top-B by s_beta."""
    return _depthwise_tree(block, head, config, lambda depth, used: config.width, beta=config.beta,
                           budget=config.budget)


def _heap_tree(block: DraftBlock, config, make_expand) -> DraftTree:
    cands = candidates(block, config.topk, config.normalize)
    roots, rows = [], []
    for r in range(block.batch_size):
        root = Node(token=int(block.root[r]), score=0.0, rank_path=())
        rows.append(best_first(root, make_expand(r, cands), config.budget))
        roots.append(root)
    return assemble(roots, rows, block.device)


def ddtree(block: DraftBlock, head: None, config) -> DraftTree:
    """DDTree: best-first over the base marginals; returns the top-B prefixes."""

    def make_expand(r, cands):
        def expand(u: Node) -> list[Node]:
            depth = u.depth + 1
            if depth > block.gamma:
                return []
            return children(u, base_log_q(cands, r, depth), cands.tokens[r, depth - 1].tolist())
        return expand

    return _heap_tree(block, config, make_expand)


def corrected_chain_ddtree(block: DraftBlock, head: CorrectionHead, config) -> DraftTree:
    """Head run along the corrected greedy chain; DDTree's heap over those per-depth distributions."""

    def make_expand(r, cands):
        trace = []
        depthwise(block, r, cands, head, lambda depth, used: 1, 0.0, trace=trace)

        def expand(u: Node) -> list[Node]:
            depth = u.depth + 1
            if depth > block.gamma:
                return []
            return children(u, trace[depth - 1][0], cands.tokens[r, depth - 1].tolist())
        return expand

    return _heap_tree(block, config, make_expand)


def sequential_heap(block: DraftBlock, head: CorrectionHead, config) -> DraftTree:
    """Exact best-first under corrected scores: pop a node, run the head on it alone, push its children."""

    def make_expand(r, cands):
        one = block.rows(r)

        def expand(u: Node) -> list[Node]:
            if u.parent is None:
                u.state = initial_state(head, one)
            else:
                u.state = advance(head, one, u.depth, u.parent.state[None], [u.token])[0]
            depth = u.depth + 1
            if depth > block.gamma:
                return []
            log_q = head_log_q(head, one, cands, r, depth, u.state[None])[0]
            return children(u, log_q, cands.tokens[r, depth - 1].tolist())
        return expand

    return _heap_tree(block, config, make_expand)
