"""Parameter sweeps (the paper's Figures 4 and 6): width, budget, depth penalty beta, top-K, each point replayed
(exact acceptance, no target forward) and priced by the tuner's cost model."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dartree.eval.bundles import Bundle
from dartree.eval.costmodel import VerifyCost, score_candidates
from dartree.eval.methods import MethodSpec
from dartree.eval.probes import measure_overhead, probe_verify_cost, replay_settings
from dartree.eval.report import markdown_table
from dartree.eval.simulate import Reference

__all__ = ["SWEEP_PARAMS", "DEFAULT_VALUES", "SweepPoint", "SweepResult", "check_sweep_values", "run_sweep",
           "sweep_table"]

SWEEP_PARAMS: tuple[str, ...] = ("width", "budget", "beta", "topk")
DEFAULT_VALUES: dict[str, tuple[float, ...]] = {
    "width": (1, 2, 4, 8, 12, 16),
    "budget": (4, 8, 16, 32, 64, 128),
    "beta": (0.0, -0.1, -0.2, -0.4, -0.8),
    "topk": (2, 4, 8, 16, 32, 64),
}


@dataclass(frozen=True)
class SweepPoint:
    """One method at one value of the swept parameter."""

    method: str
    value: float
    tau: float
    mean_tree_size: float
    draft_ms: float
    build_ms: float
    verify_ms: float
    expected_tokens_per_s: float
    expected_speedup: float


@dataclass(frozen=True)
class SweepResult:
    param: str
    points: tuple[SweepPoint, ...]
    verify_cost: VerifyCost
    overhead_s: float
    ar_tokens_per_s: float

    def series(self) -> dict[str, list[tuple[float, float, float]]]:
        """``{method: [(value, tau, expected speedup), ...]}`` for :func:`dartree.eval.plots.plot_sweep`."""
        out: dict[str, list[tuple[float, float, float]]] = {}
        for p in self.points:
            out.setdefault(p.method, []).append((p.value, p.tau, p.expected_speedup))
        return out


def check_sweep_values(param: str, values: Sequence[float], methods: Sequence[MethodSpec] = ()) -> None:
    """``ValueError`` unless ``values`` are valid for ``param`` (at least one, all distinct; ``beta`` finite
    and <= 0, the others integers >= 1) and every method of ``methods`` has the setting, as a number."""
    if param not in SWEEP_PARAMS:
        raise ValueError(f"param: must be one of {SWEEP_PARAMS}, got {param!r}")
    if not values:
        raise ValueError("values: need at least one value")
    for v in values:
        if not math.isfinite(v):
            raise ValueError(f"values: {param} takes finite numbers, got {v!r}")
        if param == "beta" and v > 0:
            raise ValueError(f"values: beta is a depth penalty and must be <= 0, got {v:g}")
        if param != "beta" and (v != int(v) or v < 1):
            raise ValueError(f"values: {param} takes integers >= 1, got {v:g}")
    repeated = sorted({v for v in values if list(values).count(v) > 1})
    if repeated:
        raise ValueError(f"values: each value must appear once, repeated: {', '.join(f'{v:g}' for v in repeated)}")
    for m in methods:
        if m.is_ar or param not in m.fields():
            raise ValueError(f"methods: {m.label!r} has no setting {param!r}; sweep it on a builder that has one")
        if m.auto_fields:
            raise ValueError(f"methods: {m.label!r} has 'auto' settings; give numbers for a sweep")


def run_sweep(
    bundle: Bundle,
    methods: Sequence[MethodSpec],
    param: str,
    values: Sequence[float],
    refs: Sequence[Reference],
    backend: str = "auto",
    verify_cost: VerifyCost | None = None,
    progress: Callable[[str], None] | None = None,
) -> SweepResult:
    """Sweep ``param`` over ``values`` for every method that has that setting."""
    check_sweep_values(param, values, methods)
    if not refs:
        raise ValueError("refs: need at least one calibration reference")
    cast = float if param == "beta" else int
    if verify_cost is None:
        largest = max((int(v) if param == "budget" else int(m.config.get("budget", 64))) for v in values
                      for m in methods)
        verify_cost = probe_verify_cost(bundle, int(sum(r.sequence.shape[1] for r in refs) / len(refs)), largest)
    overhead_s = measure_overhead(bundle, methods[0], refs[0], backend)
    ar_rate = sum(r.new_tokens for r in refs) / sum(r.ar_seconds for r in refs)
    points = []
    for m in methods:
        if progress is not None:
            progress(f"{m.label}: {param} = {', '.join(f'{v:g}' for v in values)}")
        settings = [m.with_settings(**{param: cast(v)}) for v in values]
        for v, concrete, stats in zip(values, settings, replay_settings(bundle, settings, refs, backend), strict=True):
            c = score_candidates({(int(concrete.config.get("budget", 0)), None): stats}, verify_cost, overhead_s)[0]
            points.append(SweepPoint(m.label, float(v), stats.tau, stats.mean_tree_size, 1000 * stats.draft_s,
                                     1000 * stats.build_s, 1000 * c.verify_s, c.tokens_per_s,
                                     c.tokens_per_s / ar_rate))
    return SweepResult(param, tuple(points), verify_cost, overhead_s, ar_rate)


def sweep_table(result: SweepResult) -> str:
    """One row per (method, value)."""
    rows = [[p.method, f"{p.value:g}", f"{p.tau:.2f}", f"{p.mean_tree_size:.1f}", f"{p.draft_ms:.2f}",
             f"{p.build_ms:.2f}", f"{p.verify_ms:.2f}", f"{p.expected_tokens_per_s:.1f}", f"{p.expected_speedup:.2f}x"]
            for p in result.points]
    header = ["method", result.param, "tau", "tree size", "draft ms", "build ms", "verify ms (model)",
              "expected tok/s", "expected speedup"]
    return markdown_table(header, rows)

