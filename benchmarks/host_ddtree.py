"""The ``host`` provider of the ``ddtree`` benchmark groups: DDTree's published best-first builder.

A plain ``heapq`` + numpy implementation of the algorithm as DDTree's authors publish it (about 60
lines): float32 ``topk`` and ``logsumexp`` in torch, the top-K log-probabilities moved to numpy, a
best-first heap with lazy sibling pushing whose scores are Python floats, and the tree attention
mask built row by row from the parent's row.  It is the strongest simple baseline for the same
algorithm on the same device; the benchmarks check that it builds the same tree as ours.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

import numpy as np
import torch


class HostTree(NamedTuple):
    """Draft nodes in pop order (root excluded) and the ``[n + 1, n + 1]`` ancestor-or-self mask."""

    tokens: np.ndarray
    parents: np.ndarray  # parent node index, root = 0
    depths: np.ndarray
    mask: np.ndarray


def build_ddtree(draft_logits: torch.Tensor, budget: int, topk: int) -> HostTree:
    """DDTree best-first over one row's ``[gamma, V]`` logits: the top-``budget`` prefixes and their mask."""
    depth_limit = draft_logits.shape[0]
    logits = draft_logits.float()
    top_logits, top_token_ids = torch.topk(logits, k=topk, dim=-1)
    log_z = torch.logsumexp(logits, dim=-1, keepdim=True)
    top_log_probs = (top_logits - log_z).numpy()
    top_token_ids_np = top_token_ids.numpy()

    first = float(top_log_probs[0, 0])
    heap = [(-first, (0,), 0, 1, 0, first)]  # (-logw, rank path, parent index, depth, rank, logw)
    node_token_ids = np.empty(budget, dtype=np.int64)
    node_depths = np.empty(budget, dtype=np.int64)
    parents = np.empty(budget + 1, dtype=np.int64)
    parents[0] = -1
    node_count = 0
    while heap and node_count < budget:
        _, ranks, parent_index, depth, rank, logw = heapq.heappop(heap)
        current = node_count + 1
        node_token_ids[node_count] = top_token_ids_np[depth - 1, rank]
        node_depths[node_count] = depth
        parents[current] = parent_index
        node_count += 1
        if rank + 1 < topk:
            sibling = logw - float(top_log_probs[depth - 1, rank]) + float(top_log_probs[depth - 1, rank + 1])
            heapq.heappush(heap, (-sibling, ranks[:-1] + (rank + 1,), parent_index, depth, rank + 1, sibling))
        if depth < depth_limit:
            child = logw + float(top_log_probs[depth, 0])
            heapq.heappush(heap, (-child, ranks + (0,), current, depth + 1, 0, child))

    n = node_count + 1
    mask = np.zeros((n, n), dtype=bool)
    mask[0, 0] = True
    for i in range(1, n):
        mask[i] = mask[parents[i]]
        mask[i, i] = True
    return HostTree(tokens=node_token_ids[:node_count], parents=parents[1:n], depths=node_depths[:node_count],
                    mask=mask)
