"""Selection on a materialised prefix tree: best-first (max-heap) and global top-B.

Lemma 1 of the paper: on any prefix tree whose scores never increase along a path, best-first
search with a max-heap pops exactly the global top-B set under the total order, and that set is
prefix-closed.  These two functions let the lemma be tested on its own, on any ``DraftTree``.
"""

from __future__ import annotations

import heapq

import torch
from torch import Tensor

from dartree.arguments import check_int
from dartree.tree import DraftTree, children_lists, rank_path_key

__all__ = ["best_first_select", "top_b_select"]


def top_b_select(tree: DraftTree, budget: int) -> Tensor:
    """bool ``[b, n]``: the root plus the ``budget`` best draft nodes of each row in the total order (not
    prefix-closed when scores can increase along a path, beta > 0)."""
    check_int("budget", budget, low=0)
    keep = torch.zeros(tree.tokens.shape, dtype=torch.bool)
    for r in range(tree.batch_size):
        scores = tree.scores[r].tolist()
        paths = tree.rank_paths(r)
        order = sorted(range(1, len(paths)), key=lambda i: rank_path_key(scores[i], paths[i]))
        keep[r, [0] + order[:budget]] = True
    return keep.to(tree.device)


def best_first_select(tree: DraftTree, budget: int) -> Tensor:
    """bool ``[b, n]``: the root plus the first ``budget`` nodes popped by best-first search (pop the best node of
    the heap in the total order, push its children)."""
    check_int("budget", budget, low=0)
    keep = torch.zeros(tree.tokens.shape, dtype=torch.bool)
    for r in range(tree.batch_size):
        scores = tree.scores[r].tolist()
        paths = tree.rank_paths(r)
        kids = children_lists(tree.parents[r, : len(paths)].tolist(), len(paths))
        heap = [(rank_path_key(scores[i], paths[i]), i) for i in kids[0]]
        heapq.heapify(heap)
        keep[r, 0] = True
        taken = 0
        while heap and taken < budget:
            _, i = heapq.heappop(heap)
            keep[r, i] = True
            taken += 1
            for c in kids[i]:
                heapq.heappush(heap, (rank_path_key(scores[c], paths[c]), c))
    return keep.to(tree.device)
