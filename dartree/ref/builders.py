"""Reference implementations of the nine tree builders (one row at a time, obviously correct).

Each function has the signature ``build(block, head, config) -> DraftTree`` and is registered in
:mod:`dartree.builders`; inputs are validated there.  See docs/builders.md for pseudo-code.
"""

from __future__ import annotations

import math

import torch

from dartree.block import DraftBlock
from dartree.protocols import CorrectionHead
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
from dartree.sequoia import rank_shape
from dartree.tree import PAD, DraftTree

__all__ = ["chain", "ddtree", "corrected_chain", "corrected_chain_ddtree", "sequential_heap", "dartree_fixed",
           "dartree_pruned", "sequoia", "corrected_sequoia"]


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


def _trie_expand(block: DraftBlock, r: int, cands, log_q_at):
    """Children of a node in the candidate trie of row ``r`` under per-depth log q ``log_q_at(depth)``."""
    def expand(u: Node) -> list[Node]:
        depth = u.depth + 1
        if depth > block.gamma:
            return []
        return children(u, log_q_at(depth), cands.tokens[r, depth - 1].tolist())
    return expand


def ddtree(block: DraftBlock, head: None, config) -> DraftTree:
    """DDTree: best-first over the base marginals; returns the top-B prefixes."""
    return _heap_tree(block, config, lambda r, cands: _trie_expand(block, r, cands,
                                                                   lambda depth: base_log_q(cands, r, depth)))


def corrected_chain_ddtree(block: DraftBlock, head: CorrectionHead, config) -> DraftTree:
    """Head run along the corrected greedy chain; DDTree's heap over those per-depth distributions."""

    def make_expand(r, cands):
        trace = []
        depthwise(block, r, cands, head, lambda depth, used: 1, 0.0, trace=trace)
        return _trie_expand(block, r, cands, lambda depth: trace[depth - 1][0])

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


def _sequoia_tree(block: DraftBlock, head: CorrectionHead | None, config) -> DraftTree:
    """The shape of :func:`dartree.sequoia.rank_shape`, in its order; node ``i``, the ``r``-th child of ``u``,
    gets ``u``'s ``r``-th best candidate: the base one at its depth, or (with a head) under the head's log q
    after ``u``'s path (a stable sort: ties by candidate rank)."""
    cands = candidates(block, config.topk, config.normalize)
    shape = rank_shape(config.budget, block.gamma, config.acceptance[: config.topk])
    n = shape.num_nodes
    tokens, ranks = [], []
    for r in range(block.batch_size):
        one = block.rows(r)
        row_tokens, row_ranks = [int(block.root[r])], [PAD]
        states = {0: initial_state(head, one)} if head is not None else {}
        order: dict[int, list[int]] = {}
        for i in range(1, n):
            u, depth, rank = shape.parents[i], shape.depths[i], shape.ranks[i]
            if u not in order:
                if head is None:
                    order[u] = list(range(config.topk))
                else:
                    q = head_log_q(head, one, cands, r, depth, states[u][None])[0].tolist()
                    order[u] = sorted(range(config.topk), key=lambda k: (-q[k], k))
            k = order[u][rank]
            row_ranks.append(k)
            row_tokens.append(int(cands.tokens[r, depth - 1, k]))
            if head is not None and i in shape.parents:         # a state is for the node's own children
                states[i] = advance(head, one, depth, states[u][None], [row_tokens[-1]])[0]
        tokens.append(row_tokens)
        ranks.append(row_ranks)
    b, device = block.batch_size, block.device
    return DraftTree(
        tokens=torch.tensor(tokens, dtype=torch.int64, device=device),
        parents=torch.tensor([shape.parents] * b, dtype=torch.int64, device=device),
        depths=torch.tensor([shape.depths] * b, dtype=torch.int64, device=device),
        scores=torch.tensor([shape.scores] * b, dtype=torch.float32, device=device),
        ranks=torch.tensor(ranks, dtype=torch.int64, device=device),
        num_nodes=torch.full((b,), n, dtype=torch.int64, device=device),
    )


def sequoia(block: DraftBlock, head: None, config) -> DraftTree:
    """Sequoia: the rank-optimal shape for sampled trees; the r-th child is the r-th base candidate."""
    return _sequoia_tree(block, None, config)


def corrected_sequoia(block: DraftBlock, head: CorrectionHead, config) -> DraftTree:
    """Sequoia's shape; the r-th child of a node is the r-th candidate under the head along its path."""
    return _sequoia_tree(block, head, config)
