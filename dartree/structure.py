"""What verification derives from a tree's parents: ancestor mask, positions, sibling links.

The ground floor under :class:`dartree.tree.DraftTree` and :mod:`dartree.fast.ops` (which adds the Triton
kernel for CUDA).  :func:`tree_structure` is pointer doubling in torch (no host sync); :func:`ancestor_mask`, on the
decoder's path every round, runs in numpy on CPU tensors (a dozen calls beat ~40 small torch ops) and checks the
parents (a broken parent is an error, not a wrong mask).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

__all__ = ["PAD", "TreeStructure", "ancestor_mask", "tree_structure"]

PAD = -1


class TreeStructure(NamedTuple):
    """What verification derives from a tree's parents.

    Shape:
        mask:         bool ``[b, n, n]`` ``mask[r, i, j]`` iff node j is node i or an ancestor of it.
        positions:    int64 ``[b, n]`` ``prefix_len + depth`` (padding: ``prefix_len``).
        first_child:  int64 ``[b, n]`` smallest child index, -1 if none.
        next_sibling: int64 ``[b, n]`` next larger index with the same parent, -1 if none.
    """

    mask: Tensor
    positions: Tensor
    first_child: Tensor
    next_sibling: Tensor


def ancestor_mask(parents: Tensor, num_nodes: Tensor) -> Tensor:
    """bool ``[b, n, n]``: ``mask[r, i, j]`` iff node j is node i or an ancestor of it (the ``mask`` of
    :func:`tree_structure` alone: numpy on the host for CPU tensors, torch elsewhere)."""
    if parents.device.type != "cpu":
        return tree_structure(parents, num_nodes).mask
    par, counts = parents.numpy(), num_nodes.numpy()
    n = par.shape[1]
    bad = np.flatnonzero((counts < 0) | (counts > n))
    if bad.size:
        raise ValueError(f"num_nodes: row {bad[0]} has {int(counts[bad[0]])}, outside 0..{n}")
    return torch.from_numpy(_host_mask(par, np.arange(n)[None, :] < counts[:, None]))


def _host_mask(par: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Pointer doubling on the host, stopping once every jump reached a root (``ceil(log2 D)`` steps for depth D).  A
    parent outside the row's nodes, or a cycle, is an error (not a wrong mask or an endless loop)."""
    b, n = par.shape
    idx = np.arange(n)
    child = valid & (idx[None, :] > 0)
    outside = child & ((par < 0) | (par >= valid.sum(1, keepdims=True)))
    jump = np.where(child & ~outside, par, idx[None, :])  # the root and padding point to themselves
    rows = np.arange(b)[:, None]
    mask = np.zeros((b, n, n), dtype=bool)
    mask[rows, idx[None, :], idx[None, :]] = valid
    mask[rows, idx[None, :], jump] |= valid
    for _ in range(_doubling_steps(n) + 2):
        nxt = jump[rows, jump]
        if np.array_equal(nxt, jump):
            break
        mask |= mask[rows, jump]
        jump = nxt
    broken = outside | (child & (jump != 0))     # every ancestor walk of a tree ends at the root (a cycle never)
    if not broken.any():
        return mask
    r, i = np.argwhere(broken)[0]
    raise ValueError(f"parents: row {r} node {i}: its parent {int(par[r, i])} is not a node of the row "
                     f"(0..{int(valid[r].sum()) - 1}) or its ancestors do not reach the root")


def _doubling_steps(n: int) -> int:
    """Jumps of 1, 2, 4, ... that cover every ancestor distance up to ``n - 1``."""
    return max(n - 2, 0).bit_length()


def tree_structure(parents: Tensor, num_nodes: Tensor, prefix_len: int | Tensor = 0) -> TreeStructure:
    """Ancestor mask, positions and links from parents by pointer doubling; no host sync (the steps depend
    only on ``n``).  Shape: parents int64 ``[b, n]``; num_nodes int64 ``[b]``; prefix_len int or int64 ``[b]``."""
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
