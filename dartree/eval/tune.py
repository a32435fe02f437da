"""Adaptive budget (the paper's Appendix B): the tree budget B and width W that pay on *this* machine, or
plain AR; for ``auto`` the builder and verifier too (the steps: docs/internals.md, "The budget tuner")."""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dartree.arguments import check_int
from dartree.builders import registered
from dartree.eval.bundles import Bundle
from dartree.eval.costmodel import (
    Candidate,
    ConfigStats,
    VerifyCost,
    pick_best,
    pick_finalists,
    score_candidates,
    setting_text,
)
from dartree.eval.forecast import Interval, ratio_prediction, ratio_units_for
from dartree.eval.methods import AR, AUTO, MethodSpec
from dartree.eval.probes import (
    Measurement,
    concrete,
    measure_overhead,
    measure_specs,
    measure_verify_cost,
    probe_verify_cost,
    replay_settings,
    screen_decodes,
)
from dartree.eval.simulate import Reference
from dartree.rounds import DEFAULT_VERIFIER, SAMPLED_VERIFIERS

__all__ = ["TuneResult", "choose", "tune", "AUTO_BUILDERS", "DEFAULT_AUTO_FINALISTS", "DEFAULT_SCREEN_PROMPTS",
           "DEFAULT_BUDGETS", "DEFAULT_WIDTHS", "DEFAULT_BETAS", "DEFAULT_FINALISTS", "DEFAULT_MIN_SPEEDUP",
           "measure_verify_cost"]      # the prepared device run (gpu_steps) imports it from here

#: Budgets tried by ``budget=auto`` and ``auto``.  3 as well as 4: on one CPU thread the target's forward of a tree
#: of 4 nodes is markedly cheaper than of 5, and at T=1 corrected-sequoia B=3 beat B=4 measured side by side
#: (docs/results.md, the section on issue 44 item 3, third pass).
DEFAULT_BUDGETS: tuple[int, ...] = (3, 4, 8, 16, 32, 64)
#: Widths tried by ``width=auto`` (or an unset width): 12 is ``dartree-pruned``'s default, so a tuning
#: can always choose the setting an untuned run uses (without it the demo's tuner chose among 4, 8 and
#: 16 and lost to the untuned B=16 W=12 on a dataset).
DEFAULT_WIDTHS: tuple[int, ...] = (4, 8, 12, 16)
#: Depth penalties tried when ``beta=auto`` (explicitly: an unset beta keeps the builder's default).
#: The grid includes the builders' default (-0.2), and on the zoo its best beta accepted a little more than
#: the default alone (figures: docs/results.md, "Measurements behind design choices in the code").
DEFAULT_BETAS: tuple[float, ...] = (0.0, -0.1, -0.2)
#: Settings the cost model ranks best that are then decoded for real on the calibration prompts.
DEFAULT_FINALISTS = 3
#: A tree is chosen only when its measured calibration rate is at least this times AR's: a tree
#: within noise of AR is not worth its risk (timings on a shared machine move by a few percent).
DEFAULT_MIN_SPEEDUP = 1.03
#: The builders ``auto`` searches (each at every budget of the grid, its width and beta at their defaults):
#: the best-first heap, DARTree's pruned tree and the rank-optimal sampled shape with the head, which is
#: the one that pays at T=1 on the zoo (issue 44: tau 2.3-2.5 with rejection at B=4).
AUTO_BUILDERS: tuple[str, ...] = ("ddtree", "dartree-pruned", "corrected-sequoia")
#: Finalists of ``auto`` decoded for real: the best under each verifier, then of each builder and verifier.
DEFAULT_AUTO_FINALISTS = 4
#: Calibration prompts on which settings are decoded with the rejection verifier to rank them (its tau
#: cannot be replayed), taken in turn from each dataset.
DEFAULT_SCREEN_PROMPTS = 4


@dataclass(frozen=True)
class TuneResult:
    """The tuner's measurements and choice for one method at one temperature.

    candidates: every setting scored by the cost model.  measured: AR, then the finalists decoded for real
    (empty without real decodes).  best: the chosen tree.  use_ar: no tree beat AR by ``min_speedup``.
    """

    method: str
    builder: str
    candidates: tuple[Candidate, ...]
    best: Candidate
    verify_cost: VerifyCost
    overhead_s: float
    ar_tokens_per_s: float
    measured: tuple[Measurement, ...] = ()
    use_ar: bool = False
    temperature: float = 0.0
    min_speedup: float = 1.0
    calibration_prompts: int = 0
    verifier: str | None = None       # the chosen tree's verifier at T>0 (the faster measured one)

    def settings(self) -> dict[str, int | float]:
        """The chosen tree's config fields (``budget``, and ``width`` / ``beta`` where it has them)."""
        best = self.best
        return {k: v for k, v in (("budget", best.budget), ("width", best.width), ("beta", best.beta)) if v is not None}

    def measurement(self, budget: int | None, width: int | None = None,
                    verifier: str | None = None, builder: str | None = None) -> Measurement | None:
        """The real-decode measurement of a setting (``budget=None``: AR), if taken; the fastest of its
        verifiers unless ``verifier`` names one, of ``builder`` when given."""
        found = [m for m in self.measured if (m.budget, m.width) == (budget, width)
                 and (verifier is None or m.verifier == verifier)
                 and (builder is None or budget is None or m.builder == builder)]
        return max(found, key=lambda m: m.tokens_per_s, default=None)

    @property
    def chosen(self) -> Measurement | None:
        """The measurement behind the choice: AR's when ``use_ar``, else the chosen tree's."""
        if self.use_ar:
            return self.measurement(None)
        return self.measurement(self.best.budget, self.best.width, self.verifier, self.best.builder)

    @property
    def forecast_tokens_per_s(self) -> float:
        """The chosen setting's calibration rate."""
        m = self.chosen
        if m is not None:
            return m.tokens_per_s
        return self.ar_tokens_per_s if self.use_ar else self.best.tokens_per_s

    def forecast_by_label(self) -> dict[str, float]:
        """The forecast per calibration set (dataset); empty without measurements."""
        m = self.chosen
        return {} if m is None else m.label_tokens_per_s()

    def forecast_interval(self, label: str | None, prompts: int, level: float = 0.9
                          ) -> tuple[Interval | None, Interval | None]:
        """Prediction intervals ``(tokens/s, speedup over AR)`` for decoding ``prompts`` other prompts of
        calibration set ``label`` (``None``: all pooled), by :func:`ratio_prediction` over the chosen
        setting's per-prompt times (paired with AR's for the speedup).  ``None`` without per-prompt times,
        with fewer than 2 prompts, or for the speedup of a choice of AR (docs/internals.md, step 5)."""
        m, ar = self.chosen, self.measurement(None)
        if m is None or ar is None or len(m.per_prompt) != len(ar.per_prompt):
            return None, None
        pairs = [(a, b) for a, b in zip(m.per_prompt, ar.per_prompt, strict=True) if label is None or a[0] == label]
        if len(pairs) < 2:
            return None, None
        rate = ratio_prediction([t for (_, t, _), _ in pairs], [s for (_, _, s), _ in pairs], prompts, level)
        if self.use_ar:
            return rate, None
        # per prompt: AR's seconds for the method's tokens over the method's seconds
        speedup = ratio_prediction([sa * tm / ta for (_, tm, _), (_, ta, sa) in pairs],
                                   [sm for (_, _, sm), _ in pairs], prompts, level)
        return rate, speedup

    def prompts_for(self, label: str | None, tolerance: float = 0.15, level: float = 0.9) -> int | None:
        """Prompts each side would need for :meth:`forecast_interval`'s tokens/s interval to be within
        ``tolerance`` (:func:`ratio_units_for`); ``None`` where there is no interval."""
        if self.forecast_interval(label, 1)[0] is None:
            return None
        rows = [(t, sec) for lab, t, sec in self.chosen.per_prompt if label is None or lab == label]
        return ratio_units_for([t for t, _ in rows], [sec for _, sec in rows], tolerance, level)

    def forecast_text(self, prompts: int) -> str:
        """The forecast in words, with its 90% interval for ``prompts`` other prompts where there is one."""
        rate, speedup = self.forecast_interval(None, prompts)
        spread = "" if rate is None else f"; 90% interval for {prompts} other prompts: {rate.text} tokens/s" + (
            "" if speedup is None else f", {speedup.text}x AR") + \
            f"; within 15% would need about {self.prompts_for(None)} prompts each side"
        return (f"(forecast {self.forecast_tokens_per_s:.1f} tokens/s = "
                f"{self.forecast_tokens_per_s / self.ar_tokens_per_s:.2f}x AR, measured on {self.calibration_prompts} "
                f"calibration prompts{spread}{'; no tree is forecast to beat AR' if self.use_ar else ''})")

    @property
    def choice_text(self) -> str:
        """``ar``, or ``[builder] B=.. W=.. [verifier]`` of the chosen tree."""
        if self.use_ar:
            return "ar"
        text = setting_text(self.best.budget, self.best.width, self.best.beta)
        if self.builder == AUTO:
            text = f"{self.best.builder} {text}"
        return text + (f" {self.verifier}" if self.verifier is not None else "")

    def resolve(self, method: MethodSpec) -> MethodSpec:
        """``method`` with its ``auto`` fields replaced by the choice (plain AR, label kept, when ``use_ar``)."""
        if self.use_ar:
            return MethodSpec(AR, label=method.label)
        if method.is_auto:
            return method.member(self.best.builder, self.settings(), self.verifier)
        return dataclasses.replace(method.with_settings(**self.settings()), verifier=self.verifier or method.verifier)


def choose(candidates: Sequence[Candidate], ar_tokens_per_s: float, measured: Sequence[Measurement] = (),
           min_speedup: float = 1.0) -> tuple[Candidate, bool]:
    """``(best, use_ar)``: the fastest measured candidate (ties to the smaller budget, then width; without
    ``measured``, :func:`pick_best`), and whether its rate is below ``min_speedup`` times AR's."""
    if not candidates:
        raise ValueError("candidates: need at least one candidate")
    if isinstance(min_speedup, bool) or not min_speedup >= 0:
        raise ValueError(f"min_speedup: must be a number >= 0 (0: never AR), got {min_speedup!r}")

    def rate(c: Candidate) -> float | None:
        found = [m.tokens_per_s for m in measured if not m.is_ar and (m.budget, m.width) == (c.budget, c.width)
                 and m.builder == c.builder and (c.verifier is None or m.verifier == c.verifier)]
        return max(found, default=None)

    rates = {id(c): r for c in candidates if (r := rate(c)) is not None}
    finalists = [c for c in candidates if id(c) in rates]
    if finalists:
        best = min(finalists, key=lambda c: (-rates[id(c)], c.budget, c.width or 0, c.builder))
        forecast = rates[id(best)]
    else:
        best = pick_best(candidates)
        forecast = best.tokens_per_s
    return best, not forecast >= min_speedup * ar_tokens_per_s


def tune(
    bundle: Bundle,
    method: MethodSpec,
    refs: Sequence[Reference],
    backend: str = "auto",
    budgets: Sequence[int] = DEFAULT_BUDGETS,
    widths: Sequence[int] = DEFAULT_WIDTHS,
    verify_cost: VerifyCost | None = None,
    progress: Callable[[str], None] | None = None,
    temperature: float = 0.0,
    seed: int = 0,
    finalists: int | None = None,
    min_speedup: float = DEFAULT_MIN_SPEEDUP,
    labels: Sequence[str] | None = None,
    betas: Sequence[float] = DEFAULT_BETAS,
    builders: Sequence[str] = AUTO_BUILDERS,
    screen_prompts: int = DEFAULT_SCREEN_PROMPTS,
    warps: dict | None = None,
) -> TuneResult:
    """Choose ``budget`` (and ``width``, ``beta`` when ``auto``) of ``method`` for this machine, or plain AR;
    for ``auto`` the builder too (each of ``builders``).  ``refs``: calibration references made at
    ``temperature`` with ``seed`` and ``warps`` (``labels``: their sets).  The steps: docs/internals.md,
    "The budget tuner"."""
    if not method.is_auto:
        if method.is_ar:
            raise ValueError("method: 'ar' has no budget to tune")
        if "budget" not in method.fields():
            raise ValueError(f"method: {method.builder!r} has no budget to tune (fields: {method.fields()})")
    finalists = (DEFAULT_AUTO_FINALISTS if method.is_auto else DEFAULT_FINALISTS) if finalists is None else finalists
    progress = progress or (lambda text: None)
    if not refs:
        raise ValueError("refs: need at least one calibration reference")
    check_int("finalists", finalists, 0)
    check_int("screen_prompts", screen_prompts)
    groups: tuple[Callable[[Candidate], object], ...] = (lambda c: c.verifier,)
    if method.is_auto:         # every builder at every budget, its width and beta at their defaults
        known = registered()
        bad = [b for b in builders if b not in known or "budget" not in MethodSpec(b).fields()]
        if not builders or bad:
            raise ValueError(f"builders: need registered builders with a budget, got {list(builders)} (bad: {bad})")
        budget_grid = _check_sizes("budgets", tuple(budgets))
        grids = [(method.member(b, {"budget": AUTO}), budget_grid, (None,), (None,)) for b in builders]
        groups += (lambda c: (c.builder, c.verifier),)
    else:
        grids = [(method, *_grids(method, budgets, widths, betas))]
    verify_cost = verify_cost or probe_verify_cost(bundle, int(sum(r.sequence.shape[1] for r in refs) / len(refs)),
                                                   max(max(g[1]) for g in grids))   # at the references' mean length
    verifiers = _verifiers(method, temperature)
    screen = _screen(refs, labels, screen_prompts)
    candidates: list[Candidate] = []
    overheads: dict[str, float] = {}
    for spec, budget_grid, width_grid, beta_grid in grids:
        found, overheads[spec.builder] = _rank(bundle, spec, refs, backend, budget_grid, width_grid, beta_grid,
                                               verify_cost, temperature, seed, verifiers, screen, progress, warps)
        candidates += found
    # the best-ranked candidates decoded for real beside AR, then the choice
    measured: tuple[Measurement, ...] = ()
    if finalists:
        ranked = pick_finalists(candidates, finalists, groups)
        texts = [setting_text(c.budget, c.width, c.beta) + (f" {c.verifier}" if c.verifier else "") for c in ranked]
        progress(f"{method.label}: decoding AR and " + ", ".join(f"{c.builder} {t}" if method.is_auto else t
                                                                 for c, t in zip(ranked, texts, strict=True))
                 + f" for real on {len(refs)} calibration prompts")
        specs = [(concrete(method.member(c.builder, {}) if method.is_auto else method, c.budget, c.width, c.beta),
                  c.verifier, c.beta) for c in ranked]
        measured = measure_specs(bundle, specs, refs, backend, temperature, seed, labels, builders=True, warps=warps)
        ar_rate = measured[0].tokens_per_s
    else:
        ar_seconds = sum(r.ar_seconds for r in refs)
        ar_rate = sum(r.new_tokens for r in refs) / ar_seconds if ar_seconds > 0 else float("inf")
    best, use_ar = choose(candidates, ar_rate, measured, min_speedup)
    return TuneResult(method.label, AUTO if method.is_auto else method.builder, tuple(candidates), best, verify_cost,
                      overheads.get(best.builder, 0.0), ar_rate, measured, use_ar, temperature, min_speedup, len(refs),
                      best.verifier if temperature > 0 else None)


def _grids(method: MethodSpec, budgets: Sequence[int], widths: Sequence[int], betas: Sequence[float]
           ) -> tuple[tuple[int, ...], tuple[int | None, ...], tuple[float | None, ...]]:
    """The budgets, widths and betas searched for ``method``: its ``auto`` (or unset) fields over the grids."""
    config, searched, has_width = method.config, method.searched, "width" in method.fields()
    budget_grid = tuple(budgets) if "budget" in searched else (config["budget"],)
    width_grid: tuple[int | None, ...] = ((tuple(widths) if "width" in searched else (config["width"],)) if has_width
                                          else (None,))
    _check_sizes("budgets", budget_grid)
    _check_sizes("widths", width_grid if has_width else (1,))
    beta_grid: tuple[float | None, ...] = (None,)
    if "beta" in searched:
        beta_grid = tuple(betas)
        if not beta_grid or any(isinstance(v, bool) or not isinstance(v, int | float) or not v <= 0
                                for v in beta_grid):
            raise ValueError(f"betas: need numbers <= 0 (depth penalties), got {beta_grid}")
    return budget_grid, width_grid, beta_grid


def _check_sizes(name: str, grid: tuple) -> tuple:
    if not grid or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in grid):
        raise ValueError(f"{name}: need integers >= 1, got {grid}")
    return grid


def _verifiers(method: MethodSpec, temperature: float) -> tuple[str | None, ...]:
    """The verifiers a setting is ranked under: none at T=0; at T>0 the method's own, else matching and the
    default sampled verifier."""
    return (None,) if temperature == 0 else (method.verifier,) if method.verifier else ("match", DEFAULT_VERIFIER)


def _screen(refs: Sequence[Reference], labels: Sequence[str] | None, count: int) -> list[Reference]:
    """``count`` references for the rejection screen, taken in turn from each set (dataset)."""
    labels = list(labels) if labels is not None else [r.label for r in refs]
    groups: dict[str, list[Reference]] = {}
    for ref, label in zip(refs, labels, strict=True):
        groups.setdefault(label, []).append(ref)
    return [r for tier in itertools.zip_longest(*groups.values()) for r in tier if r is not None][:count]


def _rank(bundle: Bundle, method: MethodSpec, refs: Sequence[Reference], backend: str,
          budget_grid: tuple[int, ...], width_grid: tuple[int | None, ...], beta_grid: tuple[float | None, ...],
          verify_cost: VerifyCost, temperature: float, seed: int, verifiers: tuple[str | None, ...],
          screen: Sequence[Reference], progress: Callable[[str], None],
          warps: dict | None = None) -> tuple[list[Candidate], float]:
    """Every (budget, width) of ``method`` scored under every verifier, and the per-round overhead charged."""
    grid = [(budget, width, beta) for budget in budget_grid for width in width_grid for beta in beta_grid]
    scored: list[tuple[str | None, dict[tuple[int, int | None], ConfigStats]]] = []     # (verifier, stats)
    overhead_s = 0.0
    chosen_beta: dict[tuple[int, int | None], float | None] = {(b, w): beta_grid[0] for b, w, _ in grid}
    if any(v not in SAMPLED_VERIFIERS for v in verifiers):   # greedy (T=0) or matching: replays price every setting
        probe = concrete(method, min(budget_grid), width_grid[0] if width_grid[0] is None else min(width_grid),
                         beta_grid[0])
        overhead_s = measure_overhead(bundle, probe, refs[0], backend, temperature, seed, warps)
        progress(f"{method.builder}: replaying {len(grid)} settings on {len(refs)} calibration prompts")
        replays = replay_settings(bundle, [concrete(method, *g) for g in grid], refs, backend, progress)
        stats: dict[tuple[int, int | None], ConfigStats] = {}
        best_tau: dict[tuple[int, int | None], float] = {}
        for (budget, width, beta), replayed in zip(grid, replays, strict=True):
            # one replay each; the setting keeps the beta accepted furthest (ties: the first beta of the grid)
            key = (budget, width)
            if key not in best_tau or replayed.tau > best_tau[key]:
                best_tau[key], stats[key], chosen_beta[key] = replayed.tau, replayed, beta
        # the drafter's forward is the same work whatever the setting: one pooled (median) time, so that load
        # moving between replays does not rank the settings (docs/results.md, "Measurements behind design choices")
        draft_s = statistics.median(st.draft_s for st in stats.values())
        stats = {key: dataclasses.replace(st, draft_s=draft_s) for key, st in stats.items()}
        scored += [(v, stats) for v in verifiers if v not in SAMPLED_VERIFIERS]
    for v in (v for v in verifiers if v in SAMPLED_VERIFIERS):   # sampled trees: real decodes on the screen prompts
        keys = list(dict.fromkeys((b, w) for b, w, _ in grid))
        progress(f"{method.builder}: decoding {len(keys)} settings with {v} on {len(screen)} prompts")
        decoded = screen_decodes(bundle, [concrete(method, b, w, chosen_beta[(b, w)]) for b, w in keys], screen,
                                 backend, temperature, seed, v, warps=warps)
        scored.append((v, dict(zip(keys, decoded, strict=True))))
    return [dataclasses.replace(c, beta=chosen_beta[(c.budget, c.width)], builder=method.builder, verifier=v)
            for v, stats in scored for c in score_candidates(stats, verify_cost, overhead_s)], overhead_s

