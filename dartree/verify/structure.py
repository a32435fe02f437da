"""Sync-free derived structure of a DraftTree, by pointer doubling.

``DraftTree.ancestor_mask`` walks every node to the root with boolean indexing, which synchronises
with the device once per step.  The decoding hot path uses these equivalents instead: ``ceil(log2 n)``
gathers, no host round trip.  Tests check them against ``DraftTree.ancestor_mask``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dartree.tree import DraftTree

__all__ = ["ancestor_mask", "path_all"]


def _steps(n: int) -> int:
    return max(1, (n - 1).bit_length())


def _parents_or_root(tree: DraftTree) -> Tensor:
    """int64 ``[b, n]``: the parent of each valid draft node; the root and padding point to 0."""
    valid = tree.valid()
    par = torch.where(valid, tree.parents, torch.zeros_like(tree.parents))
    return par.clamp(min=0)


def ancestor_mask(tree: DraftTree) -> Tensor:
    """bool ``[b, n, n]``: ``mask[r, i, j]`` iff node j is node i or one of its ancestors.

    Equal to ``tree.ancestor_mask()`` (padding rows and columns all False), without host syncs.
    """
    b, n = tree.tokens.shape
    valid = tree.valid()
    jump = _parents_or_root(tree)                                   # 2**k-th ancestor (root: itself)
    eye = torch.eye(n, dtype=torch.bool, device=tree.device).expand(b, n, n)
    mask = eye | torch.nn.functional.one_hot(jump, n).bool()       # ancestors within distance 1
    for _ in range(_steps(n)):
        # ancestors within 2d = own ones within d, plus those of the d-th ancestor.
        mask = mask | torch.gather(mask, 1, jump[:, :, None].expand(b, n, n))
        jump = torch.gather(jump, 1, jump)
    return mask & valid[:, :, None] & valid[:, None, :]


def path_all(tree: DraftTree, flags: Tensor) -> Tensor:
    """bool ``[b, n]``: whether ``flags`` holds at every node of the root-to-node path, root excluded.

    The root's own flag is ignored (its result is True); padding gives False.

    Shape:
        flags: bool ``[b, n]``.
    """
    n = tree.max_nodes
    valid = tree.valid()
    root = torch.arange(n, device=tree.device)[None, :] == 0
    ok = (flags | root) & valid
    jump = _parents_or_root(tree)
    for _ in range(_steps(n)):
        ok = ok & torch.gather(ok, 1, jump)
        jump = torch.gather(jump, 1, jump)
    return ok
