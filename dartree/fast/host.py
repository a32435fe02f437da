"""The greedy walk of verification on CPU tensors: a walk down a dict of (parent, token) -> child.

On one CPU thread every torch op costs microseconds of dispatch however small its tensor, so for CPU
tensors :mod:`dartree.fast.ops` runs this instead of the pointer-doubling torch twin (same outputs).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from dartree.fast.results import GreedyWalk
from dartree.structure import PAD

__all__ = ["greedy_walk"]


def greedy_walk(tokens: Tensor, parents: Tensor, num_nodes: Tensor, picks: Tensor) -> GreedyWalk:
    """Host version of :func:`dartree.fast.twins.greedy_walk` (identical outputs)."""
    tok, par, pick, count = tokens.numpy(), parents.numpy(), picks.numpy(), num_nodes.tolist()
    b, n = tok.shape
    accepted = np.full((b, n), PAD, dtype=np.int64)
    length = np.zeros(b, dtype=np.int64)
    bonus = np.zeros(b, dtype=np.int64)
    for r in range(b):
        kids: dict[tuple[int, int], int] = {(int(par[r, i]), int(tok[r, i])): i for i in range(1, count[r])}
        node, path = 0, [0]
        while (node, int(pick[r, node])) in kids:
            node = kids[(node, int(pick[r, node]))]
            path.append(node)
        accepted[r, : len(path)] = path
        length[r], bonus[r] = len(path) - 1, pick[r, node]
    return GreedyWalk(accepted=torch.from_numpy(accepted), accepted_length=torch.from_numpy(length),
                      bonus=torch.from_numpy(bonus))
