"""The tuner's cost model: ``tokens_per_s = tau / (draft_s + build_s + verify_s(tree) + overhead_s)`` from
measured parts, and the ranking of settings by it (docs/internals.md, "The budget tuner")."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dartree.arguments import check_int
from dartree.rounds import walk_pays

__all__ = ["VerifyCost", "ConfigStats", "Candidate", "score_candidates", "score_at_concurrency", "pick_best",
           "pick_finalists", "setting_text"]


@dataclass(frozen=True)
class VerifyCost:
    """Measured seconds of one tree verification (inputs + target forward) by tree size.

    sizes: tree nodes, root included, strictly increasing; seconds: median wall time at each size.
    row_s: seconds of the LM head on one node (the walk's, when the forward scored the root only).
    root_seconds: the forward's time scoring the root only (empty when the decoder never walks lazily).
    """

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]
    prefix_len: int = 0
    row_s: float = 0.0
    root_seconds: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if len(self.sizes) < 2 or len(self.sizes) != len(self.seconds):
            raise ValueError(f"sizes: need >= 2 sizes with one time each, got {len(self.sizes)} sizes and "
                             f"{len(self.seconds)} times")
        if any(b <= a for a, b in zip(self.sizes[:-1], self.sizes[1:], strict=True)) or self.sizes[0] < 1:
            raise ValueError(f"sizes: must be strictly increasing integers >= 1, got {self.sizes}")
        if any(not s >= 0 for s in self.seconds):
            raise ValueError(f"seconds: must be finite and >= 0, got {self.seconds}")
        if not self.row_s >= 0:
            raise ValueError(f"row_s: must be finite and >= 0, got {self.row_s}")
        if self.root_seconds and (len(self.root_seconds) != len(self.sizes)
                                  or any(not s >= 0 for s in self.root_seconds)):
            raise ValueError(f"root_seconds: need one finite time >= 0 per size, got {self.root_seconds}")

    def at(self, nodes: float) -> float:
        """Seconds for a tree of ``nodes`` nodes: piecewise linear, extrapolated linearly past the ends."""
        return _interpolate(self.sizes, self.seconds, nodes)

    def round_s(self, nodes: float, committed: float) -> float:
        """Seconds of a round's verification of ``nodes`` nodes committing ``committed`` tokens, scored as
        the decoder scores it (:class:`dartree.rounds.WalkRows`)."""
        rows = max(0.0, committed - 1) * self.row_s
        if not self.root_seconds:           # one way measured: ``row_s`` is 0 unless it scored the root only
            return self.at(nodes) + rows
        if walk_pays(round(nodes), committed):
            return _interpolate(self.sizes, self.root_seconds, nodes) + rows
        return self.at(nodes)


def _interpolate(xs: Sequence[int], ys: Sequence[float], x: float) -> float:
    """``ys`` at ``x``: piecewise linear over ``xs``, extrapolated linearly past the ends, never below 0."""
    i = 1
    while i < len(xs) - 1 and x > xs[i]:
        i += 1
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclass(frozen=True)
class ConfigStats:
    """Replayed (or decoded) rounds of one configuration over the calibration prompts; ``verify_s`` /
    ``overhead_s`` are measured when the rounds were real decodes, and then priced as measured."""

    tau: float
    mean_tree_size: float
    draft_s: float                 # mean per round
    build_s: float                 # mean per round
    tree_sizes: tuple[int, ...]
    verify_s: float | None = None  # mean per round (mask + target forward) of real decodes
    overhead_s: float | None = None  # mean per round (acceptance walk + commit) of real decodes


@dataclass(frozen=True)
class Candidate:
    """One (budget, width) scored by the cost model; ``width`` is ``None`` for builders without one,
    ``beta`` the depth penalty kept when the tuner searched it."""

    budget: int
    width: int | None
    tau: float
    mean_tree_size: float
    draft_s: float
    build_s: float
    verify_s: float
    overhead_s: float
    round_s: float
    tokens_per_s: float
    beta: float | None = None
    builder: str = ""                  # the registry name (``auto`` searches several; "" where one is tuned)
    verifier: str | None = None        # the T>0 acceptance rule its tau was measured under (None: T=0)


def score_candidates(stats: dict[tuple[int, int | None], ConfigStats], cost: VerifyCost,
                     overhead_s: float) -> tuple[Candidate, ...]:
    """Apply the cost model (module docstring) to every measured (budget, width)."""
    out = []
    for (budget, width), s in sorted(stats.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        sizes = s.tree_sizes or (round(s.mean_tree_size),)
        # the forward, plus the walk's LM-head rows (one per accepted node) when it scores the root only;
        # decoded rounds (rejection's screen) bring their own verify and overhead times
        verify_s = sum(cost.round_s(size + 1, s.tau) for size in sizes) / len(sizes) if s.verify_s is None \
            else s.verify_s
        extra_s = overhead_s if s.overhead_s is None else s.overhead_s
        round_s = s.draft_s + s.build_s + verify_s + extra_s
        out.append(Candidate(budget, width, s.tau, s.mean_tree_size, s.draft_s, s.build_s, verify_s, extra_s,
                             round_s, s.tau / round_s if round_s > 0 else float("inf")))
    return tuple(out)


def score_at_concurrency(stats: dict[tuple[int, int | None], ConfigStats], cost: VerifyCost, rows: int,
                         draft_s: float, commit_s: float, build_scale: float | None = None) -> tuple[Candidate, ...]:
    """The cost model of a batched round with ``rows`` requests in flight, for every (budget, width)::

        round_s       = draft_s + build_scale * build_s(B, W) + E[t_v(q + 1)] + commit_s
        tokens_per_s  = rows * tau(B, W) / round_s          (all requests together)

    ``stats``: single-request replays; ``cost``: the verify cost at batch ``rows``; ``q``: the largest of
    ``rows`` draws from the replayed tree sizes (a batched forward is as wide as its largest tree);
    ``build_scale``: building ``rows`` trees in single builds (default ``rows``; batched heads make it less).
    """
    check_int("rows", rows)
    scale = float(rows) if build_scale is None else build_scale
    if not scale > 0:
        raise ValueError(f"build_scale: must be > 0, got {build_scale!r}")
    out = []
    for (budget, width), s in sorted(stats.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        sizes = sorted(s.tree_sizes or (round(s.mean_tree_size),))
        n = len(sizes)        # P(largest of `rows` draws is the i-th smallest) = (i/n)^rows - ((i-1)/n)^rows
        verify_s = sum(cost.at(size + 1) * ((i / n) ** rows - ((i - 1) / n) ** rows)
                       for i, size in enumerate(sizes, start=1))
        build_s = scale * s.build_s
        round_s = draft_s + build_s + verify_s + commit_s
        out.append(Candidate(budget, width, s.tau, s.mean_tree_size, draft_s, build_s, verify_s, commit_s, round_s,
                             rows * s.tau / round_s if round_s > 0 else float("inf")))
    return tuple(out)


def pick_best(candidates: Sequence[Candidate]) -> Candidate:
    """Highest expected tokens per second; ties to the smaller budget, then the smaller width."""
    if not candidates:
        raise ValueError("candidates: need at least one candidate")
    return min(candidates, key=lambda c: (-c.tokens_per_s, c.budget, c.width or 0))


def pick_finalists(candidates: Sequence[Candidate], count: int,
                   groups: Sequence[Callable[[Candidate], object]] = ()) -> list[Candidate]:
    """The ``count`` settings to decode for real: in the cost model's order, the best of each group first
    (``groups`` in turn, e.g. the verifier, then the builder; the budget always last), then the next best.
    One per budget because the model's error is mostly per tree size (one probe per size); one per verifier
    because replayed and decoded estimates are not comparable, only measurable (docs/results.md).
    """
    def order(c: Candidate) -> tuple:
        return (-c.tokens_per_s, c.budget, c.width or 0, c.builder, c.verifier or "")

    ranked = sorted(candidates, key=order)
    first: list[Candidate] = []
    for key in (*groups, lambda c: c.budget):
        for c in ranked:
            if len(first) < count and all(c is not f for f in first) and all(key(c) != key(f) for f in first):
                first.append(c)
    rest = [c for c in ranked if all(c is not f for f in first)]
    return sorted(first + rest[: max(0, count - len(first))], key=order)


def setting_text(budget: int, width: int | None, beta: float | None = None) -> str:
    """``B=.. W=.. beta=..`` (the parts a setting has)."""
    return f"B={budget}" + ("" if width is None else f" W={width}") + ("" if beta is None else f" beta={beta:g}")
