"""Fast ``sequoia`` / ``corrected-sequoia`` (:mod:`dartree.sequoia`): tensorized, the same code on every device.

The shape is static (cached per ``(budget, gamma, acceptance)`` and device), so without a head the tree is
one gather of the candidates; with one, each depth is one head ``logits`` call over the depth's parents (all
rows at once), one stable sort of their corrected log q (ties by candidate rank, as the reference) and one
``advance`` call for the children that have children of their own.  No host synchronisation inside a build
(the finite check of the head's logits is deferred, :mod:`dartree.fast.checks`).  Node for node equal to
:func:`dartree.ref.builders.sequoia` / ``corrected_sequoia`` (``tests/fast/test_fast_parity.py``).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from dartree.block import DraftBlock
from dartree.fast.core import candidate_set
from dartree.fast.heads import check_logits_finite
from dartree.protocols import CorrectionHead
from dartree.scoring import log_normalize
from dartree.sequoia import RankShape, rank_shape
from dartree.tree import PAD, DraftTree

__all__ = ["sequoia", "corrected_sequoia", "shape_tree"]


@functools.lru_cache(maxsize=64)
def _layout(shape: RankShape, device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor, list]:
    """The shape's tensors on ``device`` and, per depth, ``(nodes, parent slot, rank, parents, has_kids)``:
    the depth's nodes, the index of each one's parent among the depth's parents, its sibling rank, the
    parents (node ids), and which of the depth's nodes have children (a head state is for those)."""
    parents = torch.tensor(shape.parents, dtype=torch.int64, device=device)
    depths = torch.tensor(shape.depths, dtype=torch.int64, device=device)
    ranks = torch.tensor(shape.ranks, dtype=torch.int64, device=device)
    scores = torch.tensor(shape.scores, dtype=torch.float32, device=device)
    with_kids = set(shape.parents[1:])
    levels = []
    for depth in range(1, max(shape.depths) + 1):
        nodes = [i for i in range(shape.num_nodes) if shape.depths[i] == depth]
        ups = sorted({shape.parents[i] for i in nodes})
        slot = [ups.index(shape.parents[i]) for i in nodes]
        kids = [j for j, i in enumerate(nodes) if i in with_kids]
        as_tensor = functools.partial(torch.tensor, dtype=torch.int64, device=device)
        levels.append((as_tensor(nodes), as_tensor(slot), as_tensor([shape.ranks[i] for i in nodes]), as_tensor(ups),
                       as_tensor(kids)))
    return parents, depths, ranks, scores, levels


@functools.lru_cache(maxsize=64)
def _one_row(shape: RankShape, device: torch.device) -> tuple[Tensor, ...]:
    """perf: a one-row :func:`shape_tree`'s parents, depths, scores and ranks (the views of :func:`_layout`'s
    tensors that ``expand(1, -1).contiguous()`` gives), its node count and its drafted slots' ``PAD`` tokens, made
    once: a sampled round asks for the shape every round (a dozen small ops fewer)."""
    parents, depths, ranks, scores, _ = _layout(shape, device)
    n = shape.num_nodes
    return (parents[None], depths[None], scores[None], ranks[None],
            torch.full((1,), n, dtype=torch.int64, device=device),
            torch.full((1, n - 1), PAD, dtype=torch.int64, device=device))


def _build(block: DraftBlock, head: CorrectionHead | None, config) -> DraftTree:
    b, device = block.batch_size, block.device
    shape = rank_shape(config.budget, block.gamma, config.acceptance[: config.topk])
    parents, depths, ranks, scores, levels = _layout(shape, device)
    cands = candidate_set(block, config.topk, config.normalize)
    n = shape.num_nodes
    if head is None:
        cand = ranks[1:].expand(b, -1)                                            # [b, n-1] candidate index
    else:
        cand = torch.empty(b, n - 1, dtype=torch.int64, device=device)
        states = head.initial_state(block)[:, None]                               # [b, 1, S] the root's
        index = torch.zeros(n, dtype=torch.int64, device=device)                  # node -> row of `states`
        for depth, (nodes, slot, rank, ups, kids) in enumerate(levels, start=1):
            tokens = cands.tokens[:, depth - 1]                                   # [b, K]
            logits = head.logits(block, depth, states[:, index[ups]], tokens)         # [b, m, K]
            check_logits_finite(logits)
            log_q = log_normalize(logits, cands.rest_lse[:, depth - 1, None])
            order = torch.sort(log_q, dim=-1, descending=True, stable=True).indices  # [b, m, K]
            k = order[:, slot, rank]                                              # [b, nodes]
            cand[:, nodes - 1] = k
            if kids.numel():
                index[nodes[kids]] = torch.arange(kids.numel(), device=device)
                states = head.advance(block, depth, states[:, index[ups][slot[kids]]],
                                     torch.gather(tokens, 1, k[:, kids]))
    depth_of = depths[1:].expand(b, -1)
    drafted = cands.tokens[torch.arange(b, device=device)[:, None], depth_of - 1, cand]
    return DraftTree(
        tokens=torch.cat([block.root[:, None].to(torch.int64), drafted], dim=1),
        parents=parents.expand(b, -1).contiguous(), depths=depths.expand(b, -1).contiguous(),
        scores=scores.expand(b, -1).contiguous(),
        ranks=torch.cat([ranks[:1].expand(b, 1), cand], dim=1),
        num_nodes=torch.full((b,), n, dtype=torch.int64, device=device))


def sequoia(block: DraftBlock, head: None, config) -> DraftTree:
    """Sequoia: the rank-optimal shape for sampled trees; the r-th child is the r-th base candidate."""
    return _build(block, None, config)


def corrected_sequoia(block: DraftBlock, head: CorrectionHead, config) -> DraftTree:
    """Sequoia's shape; the r-th child of a node is the r-th candidate under the head along its path."""
    return _build(block, head, config)


def shape_tree(block: DraftBlock, config, gamma: int | None = None, roots: Tensor | None = None) -> DraftTree:
    """The shape alone, for a verifier that redraws every draft token (``rejection``): the root's token, the
    drafted slots ``PAD`` until :func:`~dartree.verify.rejection.sample_tree` draws theirs (``ranks`` are sibling
    ranks).  No candidate selection, no head call.  ``gamma``:
    the depths it may use (default the block's); ``roots``: int64 ``[b]`` root tokens (default the block's).

    Shape: ``[b, n]``, ``n = rank_shape(config.budget, gamma, config.acceptance[:topk]).num_nodes``.
    """
    b, device = block.batch_size, block.device
    shape = rank_shape(config.budget, block.gamma if gamma is None else gamma, config.acceptance[: config.topk])
    if b == 1:
        parents, depths, scores, ranks, count, drafted = _one_row(shape, device)
        root = (block.root if roots is None else roots)[:, None]
        tokens = torch.cat([root if root.dtype == torch.int64 else root.long(), drafted], dim=1)
        return DraftTree(tokens=tokens, parents=parents, depths=depths, scores=scores, ranks=ranks, num_nodes=count)
    parents, depths, ranks, scores, _ = _layout(shape, device)
    n = shape.num_nodes
    tokens = torch.full((b, n), PAD, dtype=torch.int64, device=device)
    tokens[:, 0] = block.root if roots is None else roots
    return DraftTree(tokens=tokens, parents=parents.expand(b, -1).contiguous(),
                     depths=depths.expand(b, -1).contiguous(),
                     scores=scores.expand(b, -1).contiguous(), ranks=ranks.expand(b, -1).contiguous(),
                     num_nodes=torch.full((b,), n, dtype=torch.int64, device=device))
