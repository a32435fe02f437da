"""Adaptive budget (the paper's Appendix B): pick the tree budget B and width W for *this* machine,
or plain AR when no tree pays here.

A bigger tree is accepted further (tau grows with B) but costs more to verify, and how much more
depends on the hardware, so the tuner measures both sides on the running machine: a cost model
(:mod:`dartree.eval.costmodel`) ranks every setting cheaply from a verify-cost probe, replayed acceptance
and a per-round overhead; the best-ranked few are then decoded for real beside AR, the fastest measured
is chosen, and its measured rate is the forecast, with a prediction interval.

Entry points: :func:`tune` (one builder's budget and width), :func:`tune_auto` (``auto``: builders x
budgets x verifiers), :func:`choose`, :class:`TuneResult`.  The steps, where each cost term is measured,
the cost model's formula, how sure the forecast is and why the finalists are decoded for real:
docs/internals.md, "The budget tuner".
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dartree.builders import builder_spec, registered
from dartree.eval.bundles import Bundle
from dartree.eval.costmodel import (
    Candidate,
    ConfigStats,
    VerifyCost,
    pick_best,
    pick_finalists,
    score_at_concurrency,
    score_candidates,
    setting_text,
)
from dartree.eval.forecast import Interval, ratio_prediction, ratio_units_for, t_quantile
from dartree.eval.methods import AR, AUTO, MethodSpec
from dartree.eval.probes import (
    Measurement,
    concrete,
    measure_overhead,
    measure_settings,
    measure_specs,
    measure_verify_cost,
    replay_settings,
    replay_stats,
    screen_decodes,
)
from dartree.eval.simulate import Reference
from dartree.models.target import HFTarget
from dartree.rounds import DEFAULT_VERIFIER, SAMPLED_VERIFIERS

__all__ = ["VerifyCost", "ConfigStats", "Candidate", "Measurement", "TuneResult", "measure_verify_cost",
           "replay_stats", "replay_settings", "score_candidates", "score_at_concurrency", "pick_best", "choose",
           "measure_settings",
           "tune", "tune_auto", "AUTO_BUILDERS", "DEFAULT_AUTO_FINALISTS", "DEFAULT_SCREEN_PROMPTS",
           "measure_overhead", "setting_text", "pick_finalists", "DEFAULT_BUDGETS", "DEFAULT_WIDTHS",
           "DEFAULT_BETAS", "DEFAULT_FINALISTS", "DEFAULT_MIN_SPEEDUP", "Interval", "ratio_prediction",
           "ratio_units_for", "t_quantile"]

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

    candidates: every setting scored by the cost model (the ranking).  measured: plain AR, then the
    ``finalists`` best-ranked settings decoded for real on the calibration prompts (empty when the
    tuner ran without real decodes).  best: the chosen tree (the fastest measured finalist; the cost
    model's best without measurements).  use_ar: no tree is forecast to beat AR by ``min_speedup``,
    so ``budget=auto`` resolves to plain AR.  ar_tokens_per_s: AR's measured rate on the same prompts.
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
        """The chosen tree's config fields (``budget``, ``width`` when the builder has one, ``beta`` when
        it was searched)."""
        out: dict[str, int | float] = {"budget": self.best.budget}
        if self.best.width is not None:
            out["width"] = self.best.width
        if self.best.beta is not None:
            out["beta"] = self.best.beta
        return out

    def measurement(self, budget: int | None, width: int | None = None,
                    verifier: str | None = None, builder: str | None = None) -> Measurement | None:
        """The real-decode measurement of a setting (``budget=None``: AR), if the tuner took one: with
        ``verifier``, that verifier's; without, the fastest of the verifiers measured; with ``builder``, that
        builder's (``auto`` measures several)."""
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
        """What the run should measure for the resolved method: the chosen setting's calibration rate."""
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
        """Prediction intervals ``(tokens/s, speedup over AR)`` for the resolved method decoding
        ``prompts`` other prompts of calibration set ``label`` (``None``: all sets pooled), drawn like
        the calibration prompts (:func:`ratio_prediction` over the chosen setting's per-prompt times,
        paired with AR's on the same prompts for the speedup).

        What they cover: which prompts are drawn (tau per prompt ranges 2-13 on the zoo), in the
        calibration sample and in the evaluation one.  What they do not: the machine's speed moving
        between the two phases, which moves tokens/s but not the speedup (both over AR timed in the same
        window).  ``None`` where it cannot be given: no per-prompt times (an older result or no real
        decodes), fewer than 2 prompts of the set, or the speedup of a choice of AR (AR against itself).
        """
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
        """Prompts of calibration set ``label`` (``None``: all pooled) that calibration and evaluation would
        each need for the tokens/s interval of :meth:`forecast_interval` to be within ``tolerance``, at
        the spread the chosen setting showed (:func:`ratio_units_for`); ``None`` where that has no
        interval (the same cases as :meth:`forecast_interval`'s)."""
        if self.forecast_interval(label, 1)[0] is None:
            return None
        rows = [(t, sec) for lab, t, sec in self.chosen.per_prompt if label is None or lab == label]
        return ratio_units_for([t for t, _ in rows], [sec for _, sec in rows], tolerance, level)

    @property
    def choice_text(self) -> str:
        """``ar``, or ``B=.. W=..`` of the chosen tree (its builder first when ``auto`` chose it), then its
        verifier at T>0."""
        if self.use_ar:
            return "ar"
        text = setting_text(self.best.budget, self.best.width, self.best.beta)
        if self.builder == AUTO:
            text = f"{self.best.builder} {text}"
        return text + (f" {self.verifier}" if self.verifier is not None else "")

    def resolve(self, method: MethodSpec) -> MethodSpec:
        """``method`` with its ``auto`` fields replaced by the choice (and at T>0 the chosen verifier):
        plain AR (label kept) when ``use_ar``; for ``auto``, the chosen builder with its settings."""
        if self.use_ar:
            return MethodSpec(AR, label=method.label)
        if method.is_auto:
            head = (method.head or "gru") if builder_spec(self.best.builder).needs_head else None
            return MethodSpec(self.best.builder, tuple(sorted(self.settings().items())), head, method.label,
                              self.verifier or method.verifier, method.drafter)
        return dataclasses.replace(method.with_settings(**self.settings()), verifier=self.verifier or method.verifier)


def choose(candidates: Sequence[Candidate], ar_tokens_per_s: float, measured: Sequence[Measurement] = (),
           min_speedup: float = 1.0) -> tuple[Candidate, bool]:
    """The chosen tree and whether plain AR is used instead: ``(best, use_ar)``.

    With ``measured`` (real decodes of some candidates), the best is the fastest measured candidate
    (ties to the smaller budget, then width) and its forecast is that measurement (a candidate ranked
    under a verifier is matched with that verifier's measurement; one ranked without, at T=0 or by an
    older caller, with the fastest of its setting's); without, the cost model's best (:func:`pick_best`).
    ``use_ar`` when that forecast is below ``min_speedup`` times ``ar_tokens_per_s``: ``auto`` never picks a
    tree that is not measured to beat AR.
    """
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
    """Choose ``budget`` (and ``width`` when ``method``'s builder has one) for this machine, or plain AR;
    for the method ``auto``, the builder too (:func:`tune_auto`, over ``builders``).

    Fields of ``method`` already set to a number stay fixed; those set to ``"auto"`` (or unset) are
    searched over ``budgets`` / ``widths``.  ``beta`` is searched over ``betas`` only when set to
    ``"auto"``: each (budget, width) is replayed with every beta and keeps the one with the highest
    replayed tau (ties: the first of ``betas``).  Beta changes what is accepted; what it changes in a
    round's cost (the bound stops a head step earlier or later) is below the timing noise, and
    choosing by the replay's measured times would make the choice depend on that noise.  The ranking,
    the real decodes and the choice are then per (budget, width) as without it.  ``refs`` are calibration references
    (:func:`dartree.eval.simulate.reference`) made at ``temperature`` with ``seed`` (at T>0 the replay
    accepts against the sampled continuation), disjoint from the prompts the result is reported on;
    ``labels`` name the set (dataset) of each, for per-set forecasts.  ``warps``: the target-side warpers
    (``top_k`` / ``top_p`` / ``min_p``) the references were made with, which every decode then uses.

    At T>0 settings are ranked under each verifier the method may use (its own ``verifier=``, else both):
    under ``match`` by the replay and the cost model; under ``rejection`` by real decodes with that verifier
    on ``screen_prompts`` of the references (spread over their sets), acceptance and round time measured
    (a rejection round's path is a draw, which no replay of a reference gives).

    The ``finalists`` best-ranked (default :data:`DEFAULT_FINALISTS`, the best of each verifier and of
    each budget first) are then decoded for real on every calibration prompt, interleaved with AR
    (:func:`dartree.eval.probes.measure_specs`), and the fastest measured one is chosen: its measured rate
    is the forecast, every cost term measured at the chosen size (prefill, head, sampling and all).  When
    that forecast is below ``min_speedup`` times AR's measured rate, the result says ``use_ar``.
    ``finalists=0`` skips the real decodes (choice and forecast from the ranking alone, against the
    references' AR timing).  On the CPU the verify probe times the forward both ways, on every node and on
    the root only, and one LM-head row (:attr:`HFTarget.scores_rows_apart`), for the choice decoding makes
    between them (:class:`dartree.rounds.WalkRows`).
    """
    if method.is_auto:
        return tune_auto(bundle, method, refs, backend, budgets, verify_cost, progress, temperature, seed,
                         DEFAULT_AUTO_FINALISTS if finalists is None else finalists, min_speedup, labels, builders,
                         screen_prompts, warps)
    finalists = DEFAULT_FINALISTS if finalists is None else finalists
    if method.is_ar:
        raise ValueError("method: 'ar' has no budget to tune")
    fields = method.fields()
    if "budget" not in fields:
        raise ValueError(f"method: {method.builder!r} has no budget to tune (fields: {fields})")
    _check_common(refs, finalists, screen_prompts)
    config = method.config
    budget_grid = tuple(budgets) if config.get("budget", AUTO) == AUTO else (config["budget"],)
    has_width = "width" in fields
    width_grid: tuple[int | None, ...] = (None,)
    if has_width:
        width_grid = tuple(widths) if config.get("width", AUTO) == AUTO else (config["width"],)
    for name, grid in (("budgets", budget_grid), ("widths", width_grid if has_width else (1,))):
        if not grid or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in grid):
            raise ValueError(f"{name}: need integers >= 1, got {grid}")
    beta_grid: tuple[float | None, ...] = (None,)
    if config.get("beta") == AUTO:
        beta_grid = tuple(betas)
        if not beta_grid or any(isinstance(v, bool) or not isinstance(v, int | float) or not v <= 0
                                for v in beta_grid):
            raise ValueError(f"betas: need numbers <= 0 (depth penalties), got {beta_grid}")
    verify_cost = verify_cost or _probe_verify_cost(bundle, refs, max(budget_grid))
    verifiers = _verifiers(method, temperature)
    candidates, overhead_s = _rank(bundle, method, refs, backend, budget_grid, width_grid, beta_grid, verify_cost,
                                   temperature, seed, verifiers, _screen(refs, labels, screen_prompts), progress, warps)
    return _decide(bundle, method, candidates, verify_cost, {method.builder: overhead_s}, refs, backend, temperature,
                   seed, finalists, min_speedup, labels, progress, (lambda c: c.verifier,), warps)


def tune_auto(bundle: Bundle, method: MethodSpec, refs: Sequence[Reference], backend: str = "auto",
              budgets: Sequence[int] = DEFAULT_BUDGETS, verify_cost: VerifyCost | None = None,
              progress: Callable[[str], None] | None = None, temperature: float = 0.0, seed: int = 0,
              finalists: int = DEFAULT_AUTO_FINALISTS, min_speedup: float = DEFAULT_MIN_SPEEDUP,
              labels: Sequence[str] | None = None, builders: Sequence[str] = AUTO_BUILDERS,
              screen_prompts: int = DEFAULT_SCREEN_PROMPTS, warps: dict | None = None) -> TuneResult:
    """``auto``: the method for this machine, temperature and warpers: builders x budgets x verifiers.

    Every builder of ``builders`` (their widths and betas at the builders' defaults) is ranked at every budget
    of ``budgets`` under every verifier the method may use (at T>0 ``match`` and ``rejection`` unless
    ``auto:verifier=...`` fixes one), each by acceptance measured under that verifier (:func:`tune`); the
    ``finalists`` best (the best of each verifier first, then of each builder and verifier, then of each
    budget) are decoded for real beside AR on every calibration prompt and the fastest measured is chosen,
    or plain AR when it does not beat AR by ``min_speedup`` (so never a method measured below AR).
    """
    if not method.is_auto:
        raise ValueError(f"method: tune_auto searches the method 'auto', got {method.label!r}")
    _check_common(refs, finalists, screen_prompts)
    known = registered()
    bad = [b for b in builders if b not in known or "budget" not in MethodSpec(b).fields()]
    if not builders or bad:
        raise ValueError(f"builders: need registered builders with a budget, got {list(builders)} (bad: {bad})")
    budget_grid = tuple(budgets)
    if not budget_grid or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in budget_grid):
        raise ValueError(f"budgets: need integers >= 1, got {budget_grid}")
    verify_cost = verify_cost or _probe_verify_cost(bundle, refs, max(budget_grid))
    verifiers = _verifiers(method, temperature)
    screen = _screen(refs, labels, screen_prompts)
    candidates: list[Candidate] = []
    overheads: dict[str, float] = {}
    for name in builders:
        spec = _auto_member(name, method)
        found, overheads[name] = _rank(bundle, spec, refs, backend, budget_grid, (None,), (None,), verify_cost,
                                       temperature, seed, verifiers, screen, progress, warps)
        candidates += found
    result = _decide(bundle, method, tuple(candidates), verify_cost, overheads, refs, backend, temperature, seed,
                     finalists, min_speedup, labels, progress,
                     (lambda c: c.verifier, lambda c: (c.builder, c.verifier)), warps)
    return result


def _auto_member(builder: str, method: MethodSpec) -> MethodSpec:
    """The member ``builder`` of ``auto``'s search: its budget searched, the head ``auto`` names (default gru)."""
    head = (method.head or "gru") if builder_spec(builder).needs_head else None
    return MethodSpec(builder, (("budget", AUTO),), head, builder, method.verifier, method.drafter)


def _check_common(refs: Sequence[Reference], finalists: object, screen_prompts: object) -> None:
    if not refs:
        raise ValueError("refs: need at least one calibration reference")
    if isinstance(finalists, bool) or not isinstance(finalists, int) or finalists < 0:
        raise ValueError(f"finalists: must be an integer >= 0, got {finalists!r}")
    if isinstance(screen_prompts, bool) or not isinstance(screen_prompts, int) or screen_prompts < 1:
        raise ValueError(f"screen_prompts: must be an integer >= 1, got {screen_prompts!r}")


def _verifiers(method: MethodSpec, temperature: float) -> tuple[str | None, ...]:
    """The verifiers a setting is ranked under: none at T=0; at T>0 the method's own, else matching and the
    default sampled verifier (traversal accepts at least as often as rejection on the same trees:
    docs/verification.md)."""
    if temperature == 0:
        return (None,)
    return (method.verifier,) if method.verifier else ("match", DEFAULT_VERIFIER)


def _screen(refs: Sequence[Reference], labels: Sequence[str] | None, count: int) -> list[Reference]:
    """``count`` references for the rejection screen, taken in turn from each set (dataset)."""
    labels = list(labels) if labels is not None else [r.label for r in refs]
    groups: dict[str, list[Reference]] = {}
    for ref, label in zip(refs, labels, strict=True):
        groups.setdefault(label, []).append(ref)
    out: list[Reference] = []
    depth = 0
    while len(out) < min(count, len(refs)):
        for group in groups.values():
            if depth < len(group) and len(out) < count:
                out.append(group[depth])
        depth += 1
    return out


def _probe_verify_cost(bundle: Bundle, refs: Sequence[Reference], largest_budget: int) -> VerifyCost:
    """The verify-cost probe at the references' mean length, for trees up to ``largest_budget`` draft nodes."""
    gamma = int(getattr(bundle.drafter, "gamma", 15))
    prefix_len = int(sum(r.sequence.shape[1] for r in refs) / len(refs))
    largest = largest_budget + 1
    sizes = sorted({1, 2, 4, 8, 16, 32, 64, 128, largest} & set(range(1, largest + 1)) | {largest})
    # the decoder may walk lazily at T=0 and with the keyed sampler the tuner decodes with at T>0
    lazy = HFTarget(bundle.target).scores_rows_apart
    return measure_verify_cost(bundle.target, bundle.drafter.target_layer_ids, prefix_len, sizes, gamma,
                               logits="walk" if lazy else "all")


def _rank(bundle: Bundle, method: MethodSpec, refs: Sequence[Reference], backend: str,
          budget_grid: tuple[int, ...], width_grid: tuple[int | None, ...], beta_grid: tuple[float | None, ...],
          verify_cost: VerifyCost, temperature: float, seed: int, verifiers: tuple[str | None, ...],
          screen: Sequence[Reference], progress: Callable[[str], None] | None,
          warps: dict | None = None) -> tuple[list[Candidate], float]:
    """Every (budget, width) of ``method`` scored under every verifier of ``verifiers``, and the per-round
    overhead the cost model charged the replayed ones."""
    grid = [(budget, width, beta) for budget in budget_grid for width in width_grid for beta in beta_grid]
    out: list[Candidate] = []
    overhead_s = 0.0
    chosen_beta: dict[tuple[int, int | None], float | None] = {(b, w): beta_grid[0] for b, w, _ in grid}
    if any(v not in SAMPLED_VERIFIERS for v in verifiers):   # greedy (T=0) or matching: replays price every setting
        probe = concrete(method, min(budget_grid), width_grid[0] if width_grid[0] is None else min(width_grid),
                         beta_grid[0])
        overhead_s = measure_overhead(bundle, probe, refs[0], backend, temperature, seed, warps)
        if progress is not None:
            progress(f"{method.builder}: replaying {len(grid)} settings on {len(refs)} calibration prompts")
        replays = replay_settings(bundle, [concrete(method, *g) for g in grid], refs, backend, progress)
        stats: dict[tuple[int, int | None], ConfigStats] = {}
        best_tau: dict[tuple[int, int | None], float] = {}
        for (budget, width, beta), replayed in zip(grid, replays, strict=True):
            # one replay each; the setting keeps the beta accepted furthest (ties: the first beta of the grid)
            key = (budget, width)
            if key not in best_tau or replayed.tau > best_tau[key]:
                best_tau[key], stats[key], chosen_beta[key] = replayed.tau, replayed, beta
        # the drafter's forward is the same work whatever the setting: one pooled time (the median over the
        # replays), so that load moving between replays does not rank the settings (on a shared machine it
        # nearly doubled the drafter's time between the settings of one tuning; figures:
        # docs/results.md, "Measurements behind design choices in the code")
        draft_s = statistics.median(st.draft_s for st in stats.values())
        stats = {key: dataclasses.replace(st, draft_s=draft_s) for key, st in stats.items()}
        for v in verifiers:
            if v not in SAMPLED_VERIFIERS:
                out += [dataclasses.replace(c, beta=chosen_beta[(c.budget, c.width)], builder=method.builder,
                                            verifier=v) for c in score_candidates(stats, verify_cost, overhead_s)]
    for v in (v for v in verifiers if v in SAMPLED_VERIFIERS):   # sampled trees: real decodes on the screen prompts
        keys = list(dict.fromkeys((b, w) for b, w, _ in grid))
        if progress is not None:
            progress(f"{method.builder}: decoding {len(keys)} settings with {v} on {len(screen)} prompts")
        decoded = screen_decodes(bundle, [concrete(method, b, w, chosen_beta[(b, w)]) for b, w in keys], screen,
                                 backend, temperature, seed, v, warps=warps)
        stats = dict(zip(keys, decoded, strict=True))
        out += [dataclasses.replace(c, beta=chosen_beta[(c.budget, c.width)], builder=method.builder,
                                    verifier=v) for c in score_candidates(stats, verify_cost, overhead_s)]
    return out, overhead_s


def _decide(bundle: Bundle, method: MethodSpec, candidates: tuple[Candidate, ...], verify_cost: VerifyCost,
            overheads: dict[str, float], refs: Sequence[Reference], backend: str, temperature: float, seed: int,
            finalists: int, min_speedup: float, labels: Sequence[str] | None,
            progress: Callable[[str], None] | None, groups: Sequence[Callable[[Candidate], object]],
            warps: dict | None = None) -> TuneResult:
    """Decode the best-ranked candidates for real beside AR, choose, and say what was measured."""
    measured: tuple[Measurement, ...] = ()
    if finalists:
        ranked = pick_finalists(candidates, finalists, groups)
        if progress is not None:
            progress(f"{method.label}: decoding AR and " + ", ".join(_candidate_text(c, method) for c in ranked)
                     + f" for real on {len(refs)} calibration prompts")
        specs = [(_candidate_spec(c, method), c.verifier, c.beta) for c in ranked]
        measured = measure_specs(bundle, specs, refs, backend, temperature, seed, labels, builders=True, warps=warps)
        ar_rate = measured[0].tokens_per_s
    else:
        ar_seconds = sum(r.ar_seconds for r in refs)
        ar_rate = sum(r.new_tokens for r in refs) / ar_seconds if ar_seconds > 0 else float("inf")
    best, use_ar = choose(candidates, ar_rate, measured, min_speedup)
    return TuneResult(method.label, AUTO if method.is_auto else method.builder, candidates, best, verify_cost,
                      overheads.get(best.builder, 0.0), ar_rate, measured, use_ar, temperature, min_speedup, len(refs),
                      best.verifier if temperature > 0 else None)


def _candidate_spec(c: Candidate, method: MethodSpec) -> MethodSpec:
    """The concrete method a candidate decodes as (for ``auto``, its builder's)."""
    base = _auto_member(c.builder, method) if method.is_auto else method
    return concrete(base, c.budget, c.width, c.beta)


def _candidate_text(c: Candidate, method: MethodSpec) -> str:
    text = setting_text(c.budget, c.width, c.beta) + (f" {c.verifier}" if c.verifier else "")
    return f"{c.builder} {text}" if method.is_auto else text
