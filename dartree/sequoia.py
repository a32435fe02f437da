"""Rank-optimal tree shapes for sampled trees (Sequoia, Chen et al. 2024): the ``sequoia`` builders' shape.

Under the rejection verifier a child is worth what its sibling rank is worth (``P_r``, the accepted-rank
histogram), so the ``budget`` nodes of highest ``prod P_r`` form the best tree of that size: a best-first pop, no
dynamic programme.  The shape depends only on ``(budget, gamma, acceptance)`` and is cached; its nodes come in
every builder's total order (:func:`dartree.tree.rank_path_key`).  The model, why the pop is optimal and why this
shape pays at T>0: docs/builders.md, "Sequoia's rank-optimal shape"; figures: docs/results.md.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from dartree.arguments import plain_scalar
from dartree.tree import rank_path_key

__all__ = ["DEFAULT_ACCEPTANCE", "RankShape", "rank_shape", "check_acceptance", "acceptance_from_walks",
           "MIN_TESTS"]

#: ``P_r``, the probability that the ``r``-th drawn child is the accepted one: the accepted-rank histogram of
#: rejection walks on the zoo at T=1, smoothed to be non-increasing (how it was measured: docs/results.md,
#: "Measurements behind design choices in the code"; the run-6 weights' histogram gives no better shapes:
#: docs/zoo.md).  Its sum, 0.76, is a node's chance that one of its first 8 children is accepted.
DEFAULT_ACCEPTANCE: tuple[float, ...] = (0.48, 0.09, 0.055, 0.04, 0.03, 0.025, 0.02, 0.015)


def check_acceptance(value: object) -> tuple[float, ...]:
    """``value`` as a validated acceptance tuple: a tuple/list of numbers, or a string ``"0.5/0.2/0.1"``.

    Raises ``ValueError`` naming ``acceptance`` and what is allowed.
    """
    allowed = ("expected P_r for r = 0, 1, ...: numbers in (0, 1), non-increasing, summing to at most 1, "
               "as a tuple or as a string like '0.5/0.2/0.1'")
    given = value
    if isinstance(value, str):
        try:
            value = tuple(float(x) for x in value.split("/"))
        except ValueError:
            raise ValueError(f"acceptance: {allowed}; got {given!r}") from None
    if isinstance(value, np.ndarray | torch.Tensor) and value.ndim == 1:
        value = value.tolist()
    if isinstance(value, tuple | list):
        value = tuple(plain_scalar(x) for x in value)
    numbers = isinstance(value, tuple) and value and not any(
        isinstance(x, bool) or not isinstance(x, int | float) for x in value)
    if not numbers or not all(0.0 < x < 1.0 for x in value) \
            or any(b > a for a, b in zip(value, value[1:], strict=False)) or math.fsum(value) > 1.0 + 1e-9:
        raise ValueError(f"acceptance: {allowed}; got {given!r}")
    return tuple(float(x) for x in value)


@dataclass(frozen=True)
class RankShape:
    """A tree shape, root first then draft nodes in the total order.

    parents, depths, ranks: per node (root: ``-1``, ``0``, ``-1``); ranks are sibling ranks (draw order).
    scores: float32 per node, the sum of ``log P_r`` along the path (root ``0.0``).
    """

    parents: tuple[int, ...]
    depths: tuple[int, ...]
    ranks: tuple[int, ...]
    scores: tuple[float, ...]

    @property
    def num_nodes(self) -> int:
        return len(self.parents)


@functools.lru_cache(maxsize=64)
def rank_shape(budget: int, gamma: int, acceptance: tuple[float, ...]) -> RankShape:
    """The ``budget`` draft nodes of highest value (module docstring), at depths ``<= gamma``, at most
    ``len(acceptance)`` children a node.

    A node's score is ``float32(parent + float32(log P_r))``, the float32 arithmetic of every builder's scores.
    """
    logs = np.log(np.asarray(acceptance, dtype=np.float64)).astype(np.float32)
    parents, depths, ranks, paths = [-1], [0], [-1], [()]
    scores: list[float] = [0.0]
    heap: list[tuple[tuple[float, tuple[int, ...]], int, int]] = []     # (key, parent node, rank)

    def push(parent: int, rank: int) -> None:
        if rank < len(logs) and depths[parent] < gamma:
            score = float(np.float32(scores[parent]) + logs[rank])
            heapq.heappush(heap, (rank_path_key(score, paths[parent] + (rank,)), parent, rank))

    push(0, 0)
    while heap and len(parents) <= budget:
        (neg, path), parent, rank = heapq.heappop(heap)
        parents.append(parent)
        depths.append(depths[parent] + 1)
        ranks.append(rank)
        paths.append(path)
        scores.append(-neg)
        push(parent, rank + 1)                  # the next sibling, then the first child
        push(len(parents) - 1, 0)
    return RankShape(tuple(parents), tuple(depths), tuple(ranks), tuple(scores))


#: a rank needs this many tests (nodes that drew it) before :func:`acceptance_from_walks` estimates it
MIN_TESTS = 20


def acceptance_from_walks(walks: Iterable[tuple[int, int | None]], min_tests: int = MIN_TESTS,
                          ranks: int = 8) -> tuple[float, ...]:
    """``P_r`` estimated from rejection walks: one ``(children, accepted rank or None)`` per visited node that
    had children (``None``: every child was rejected).  A node tests its ranks ``0..accepted`` (all of them if
    none was accepted); ``a_r`` = accepted / tested at rank ``r``, ``P_r = (1 - a_0) ... (1 - a_{r-1}) a_r``.

    The vector stops at the first rank tested fewer than ``min_tests`` times, never accepted, or past ``ranks``,
    and is made non-increasing (each ``P_r`` at most the one before; the shape's optimality needs it).
    Raises ``ValueError`` if rank 0 has too few tests or no acceptance.
    """
    tested = [0] * ranks
    accepted = [0] * ranks
    for children, rank in walks:
        last = children - 1 if rank is None else rank
        for r in range(min(last + 1, ranks)):
            tested[r] += 1
        if rank is not None and rank < ranks:
            accepted[rank] += 1
    out: list[float] = []
    reach = 1.0
    for r in range(ranks):
        if tested[r] < min_tests or accepted[r] == 0:
            break
        a = accepted[r] / tested[r]
        value = min(reach * a, out[-1] if out else 1.0, 0.999)
        out.append(value)
        reach *= 1.0 - a
    if not out:
        raise ValueError(f"walks: rank 0 was tested {tested[0]} times and accepted {accepted[0]} times; need at "
                         f"least min_tests={min_tests} tests and one acceptance (decode more prompts or tokens)")
    return tuple(out)
