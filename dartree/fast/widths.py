"""Width schedules of the depth-wise builders: how many nodes each depth keeps (Python ints).

Every depth keeps the same number of nodes in every row (it depends only on the budget, the width,
K and the depth), so rows never need padding and no schedule reads the device.
"""

from __future__ import annotations

__all__ = ["pruned_widths", "beam_widths", "quota_widths", "trie_size"]


def trie_size(topk: int, gamma: int, cap: int) -> int:
    """Draft nodes of the full candidate trie (``K + K^2 + ... + K^gamma``), capped at ``cap``
    (computed without ever exceeding ``cap * K``, so huge tries cost nothing)."""
    total, level = 0, 1
    for _ in range(gamma):
        level *= topk
        total += level
        if total >= cap:
            return cap
    return total


def pruned_widths(width: int, topk: int, gamma: int) -> list[int]:
    """``min(width, kept nodes of the previous depth * K)`` at every depth."""
    out, prev = [], 1
    for _ in range(gamma):
        prev = min(width, prev * topk)
        out.append(prev)
    return out


def beam_widths(budget: int, topk: int, gamma: int) -> list[int]:
    """Widths whose supertree holds the global top-``budget`` of the whole candidate trie: a top-B node at depth d
    has its d-1 ancestors before it, so at most ``B - d + 1`` of depth d are in the top-B, and they are among the
    best ``B - d + 1`` children of depth d-1's kept nodes."""
    out, prev = [], 1
    for depth in range(1, gamma + 1):
        prev = min(budget - depth + 1, prev * topk)
        if prev <= 0:
            break
        out.append(prev)
    return out


def quota_widths(budget: int, topk: int, gamma: int) -> list[int]:
    """DARTree (fixed): ``ceil(remaining budget / remaining depths)`` per depth, capped by the children."""
    out, prev, used = [], 1, 0
    for depth in range(1, gamma + 1):
        quota = -(-(budget - used) // (gamma - depth + 1))
        if quota <= 0:
            break
        prev = min(quota, prev * topk)
        out.append(prev)
        used += prev
    return out
