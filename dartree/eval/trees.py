"""Trees of real rounds, for pictures: one round's verification tree and node-depth distributions."""

from __future__ import annotations

from collections.abc import Sequence

from dartree.eval.bundles import Bundle
from dartree.eval.methods import MethodSpec, make_method_builder
from dartree.eval.simulate import Reference, SimulatedRound, simulate

__all__ = ["recorded_rounds", "depth_counts"]


def recorded_rounds(bundle: Bundle, method: MethodSpec, ref: Reference, backend: str) -> tuple[SimulatedRound, ...]:
    """Every round of decoding ``ref`` with ``method``, each with its tree and accepted node indices."""
    head = bundle.heads[method.head] if method.head is not None else None
    return simulate(bundle, make_method_builder(method, backend), head, ref, record=True).rounds


def depth_counts(rounds: Sequence[SimulatedRound], gamma: int) -> list[float]:
    """Mean number of draft nodes at depth 1..gamma per tree over ``rounds`` (the paper's Figure 7)."""
    if not rounds:
        raise ValueError("rounds: need at least one recorded round")
    totals = [0.0] * gamma
    for r in rounds:
        if r.tree is None:
            raise ValueError("rounds: recorded rounds needed (simulate(..., record=True))")
        n = int(r.tree.num_nodes[0])
        for d in r.tree.depths[0, 1:n].tolist():
            totals[d - 1] += 1
    return [t / len(rounds) for t in totals]
