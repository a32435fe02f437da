"""Adaptive budget (the paper's Appendix B): pick the tree budget B and width W for *this* machine,
or plain AR when no tree pays here.

A bigger tree is accepted further (tau grows with B) but costs more to verify, and how much more
depends on the hardware: on a GPU a forward of 64 tree nodes costs about as much as one of 1 node,
on a CPU it costs far more.  The tuner therefore measures both sides on the running machine, in two
steps: a cost model ranks every setting cheaply, then the best-ranked few are decoded for real.

1. verify cost ``t_v(n)``: wall time of building the tree inputs and running the target's tree
   forward for trees of ``n`` nodes after a prefix of typical length (:func:`measure_verify_cost`);
2. acceptance: tau and the tree sizes of every (B, W) on the grid, plus the draft and build time per
   round, by replaying rounds on the calibration prompts (:mod:`dartree.eval.simulate`), whose
   references are made at the temperature being tuned for (with ``beta=auto``, each (B, W) is
   replayed at every beta of :data:`DEFAULT_BETAS` and keeps the one of highest tau); every setting's
   replay of a prompt reads the drafter blocks drafted once for that prompt
   (:class:`~dartree.eval.simulate.ReplayBlocks`: 13.5 s instead of 54.3 s for the demo's 60 settings
   on 4 prompts, cProfile, 2026-12-02);
3. a per-round overhead (the acceptance walk, sampling included at T>0, and the commit: KV-cache
   compaction and the drafter's context update), measured from one real decode;

and scores each candidate with the cost model (the expected tokens per second)::

    round_s(B, W)    = draft_s + build_s(B, W) + mean over rounds of v(tree_size + 1, tau(B, W)) + overhead_s
    v(n, tau)        = t_v(n)                                     (every node scored in the forward)
                     | t_root(n) + (tau - 1) * row_s              (when walk_pays(n, tau), on the CPU)

(``draft_s``: the drafter's forward, the same for every setting, pooled over all replays: the median;
``v``: :meth:`VerifyCost.round_s`, the choice single-request decoding makes (:class:`dartree.rounds.WalkRows`):
on the CPU the forward may score the root only and the walk then runs one LM-head row, ``row_s``
(about 0.2 ms on the zoo), per accepted node; that pays only for short walks)
    tokens_per_s     = tau(B, W) / round_s(B, W)

4. the ``finalists`` best-ranked settings (the best of each budget first: :func:`pick_finalists`) and
   AR are then decoded for real on every calibration prompt, interleaved, timed as the benchmark times
   them (:func:`measure_settings`).  The fastest measured setting is chosen and its measured rate is
   the **forecast**; when it does not beat AR's rate by ``min_speedup``, ``budget=auto`` resolves to
   plain AR (:func:`choose`).
5. how sure the forecast is: a prediction interval for the rate (and the speedup over AR) that a run
   decoding ``n`` other prompts should measure (:meth:`TuneResult.forecast_interval`,
   :func:`ratio_prediction`), from the spread of the chosen setting's per-prompt times.  It covers both
   samples, the calibration prompts and the evaluated ones: on the zoo tau per prompt ranges 2-13, so
   8 evaluation prompts of a dataset measure a rate about 20% from the dataset's (the sums of 8
   prompts' rounds were 65-116 over four blocks of HumanEval, 77-124 of stdlib; 2026-12-02), and no
   number of calibration prompts forecasts such a run within 15% every time.  With 48 + 48 HumanEval
   prompts the forecast was within 4% (``results/tuner/run_forecast.sh``).  How many it takes: with a
   perfect cost model and an idle machine, n + n prompts drawn at random agree within 15% in 51% /
   68% / 83% of draws for n = 8 / 16 / 32 on HumanEval and 33% / 46% for n = 8 / 16 on stdlib, which
   has 33 prompts (``benchmarks/prompt_spread.py``, 2026-12-02); :meth:`TuneResult.prompts_for` says
   it per run, from the calibration prompts' own spread.  For ``make demo``'s split (the first 8
   prompts evaluated, calibration after them) the rounds alone put a perfect cost model's forecast at
   -23% / +24% (HumanEval / stdlib) with 8 calibration prompts and -10% / +5% with 16, which the demo
   now uses (``benchmarks/forecast_proxies.py``).  Nothing read from a prompt before decoding it
   predicts its tau on the zoo: the drafter's tau replayed over the prompt's own last 64 tokens
   correlates +0.09 / -0.44 with the decode's, the target's top-1 accuracy on them +0.07 / -0.56; the
   tau of the first 16 new tokens does (+0.88 / +0.95), so the spread is the continuation's.

Why step 4: the cost model alone forecast 166 tok/s for the B=32 W=8 it chose in ``make demo``
(2026-12-01 04:57) and the run measured 96.  Measured causes, in order: tau on 2 calibration
prompts (8.0) against 5.3 / 6.6 on the evaluation prompts (per-prompt tau ranges 2.4-12.8 on this
zoo, so a couple of prompts cannot pin it); a round 16% longer than modelled (the synthetic tree
forward 24.3 ms vs 30.0 ms in decoding, accept + commit 1.7 vs 2.8 ms); the prefill (5-8% of the
call) outside the model; and, at T=1, greedy references (tau 8 instead of 1.5).  Real decodes of the
finalists carry every term at the chosen size, whatever the decoding loop, the head or the builder
cost today.  Ties go to the smaller budget, then the smaller width, so the choice is deterministic
for a given set of measurements.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
    measure_verify_cost,
    replay_settings,
    replay_stats,
)
from dartree.eval.simulate import Reference
from dartree.models.target import HFTarget
from dartree.rounds import VERIFIERS

__all__ = ["VerifyCost", "ConfigStats", "Candidate", "Measurement", "TuneResult", "measure_verify_cost",
           "replay_stats", "replay_settings", "score_candidates", "score_at_concurrency", "pick_best", "choose",
           "measure_settings",
           "tune", "measure_overhead", "setting_text", "pick_finalists", "DEFAULT_BUDGETS", "DEFAULT_WIDTHS",
           "DEFAULT_BETAS", "DEFAULT_FINALISTS", "DEFAULT_MIN_SPEEDUP", "Interval", "ratio_prediction",
           "ratio_units_for", "t_quantile"]

DEFAULT_BUDGETS: tuple[int, ...] = (4, 8, 16, 32, 64)
#: Widths tried by ``width=auto`` (or an unset width): 12 is ``dartree-pruned``'s default, so a tuning
#: can always choose the setting an untuned run uses (without it the demo's tuner chose among 4, 8 and
#: 16 and lost to the untuned B=16 W=12 on a dataset).
DEFAULT_WIDTHS: tuple[int, ...] = (4, 8, 12, 16)
#: Depth penalties tried when ``beta=auto`` (explicitly: an unset beta keeps the builder's default).
#: On the zoo, B=16, the best of them accepted 2-3% more than -0.2 (32 held-out prompts, 2026-12-01, the
#: head before run 4).
DEFAULT_BETAS: tuple[float, ...] = (0.0, -0.1, -0.2)
#: Settings the cost model ranks best that are then decoded for real on the calibration prompts.
DEFAULT_FINALISTS = 3
#: A tree is chosen only when its measured calibration rate is at least this times AR's: a tree
#: within noise of AR is not worth its risk (timings on a shared machine move by a few percent).
DEFAULT_MIN_SPEEDUP = 1.03


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
                    verifier: str | None = None) -> Measurement | None:
        """The real-decode measurement of a setting (``budget=None``: AR), if the tuner took one: with
        ``verifier``, that verifier's; without, the fastest of the verifiers measured."""
        found = [m for m in self.measured if (m.budget, m.width) == (budget, width)
                 and (verifier is None or m.verifier == verifier)]
        return max(found, key=lambda m: m.tokens_per_s, default=None)

    @property
    def chosen(self) -> Measurement | None:
        """The measurement behind the choice: AR's when ``use_ar``, else the chosen tree's."""
        if self.use_ar:
            return self.measurement(None)
        return self.measurement(self.best.budget, self.best.width, self.verifier)

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
        """``ar``, or ``B=.. W=..`` of the chosen tree."""
        if self.use_ar:
            return "ar"
        text = setting_text(self.best.budget, self.best.width, self.best.beta)
        return text + (f" {self.verifier}" if self.verifier is not None else "")

    def resolve(self, method: MethodSpec) -> MethodSpec:
        """``method`` with its ``auto`` fields replaced by the choice (and at T>0 the chosen verifier):
        plain AR (label kept) when ``use_ar``."""
        if self.use_ar:
            return MethodSpec(AR, label=method.label)
        return dataclasses.replace(method.with_settings(**self.settings()), verifier=self.verifier or method.verifier)


def choose(candidates: Sequence[Candidate], ar_tokens_per_s: float, measured: Sequence[Measurement] = (),
           min_speedup: float = 1.0) -> tuple[Candidate, bool]:
    """The chosen tree and whether plain AR is used instead: ``(best, use_ar)``.

    With ``measured`` (real decodes of some candidates), the best is the fastest measured candidate
    (ties to the smaller budget, then width) and its forecast is that measurement; without, the cost
    model's best (:func:`pick_best`).  ``use_ar`` when that forecast is below ``min_speedup`` times
    ``ar_tokens_per_s``: ``budget=auto`` never picks a tree that is not forecast to beat AR.
    """
    if not candidates:
        raise ValueError("candidates: need at least one candidate")
    if isinstance(min_speedup, bool) or not min_speedup >= 0:
        raise ValueError(f"min_speedup: must be a number >= 0 (0: never AR), got {min_speedup!r}")
    rates: dict[tuple[int | None, int | None], float] = {}
    for m in measured:                       # a setting measured with several verifiers: its fastest
        if not m.is_ar:
            rates[(m.budget, m.width)] = max(rates.get((m.budget, m.width), 0.0), m.tokens_per_s)
    finalists = [c for c in candidates if (c.budget, c.width) in rates]
    if finalists:
        best = min(finalists, key=lambda c: (-rates[(c.budget, c.width)], c.budget, c.width or 0))
        forecast = rates[(best.budget, best.width)]
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
    finalists: int = DEFAULT_FINALISTS,
    min_speedup: float = DEFAULT_MIN_SPEEDUP,
    labels: Sequence[str] | None = None,
    betas: Sequence[float] = DEFAULT_BETAS,
) -> TuneResult:
    """Choose ``budget`` (and ``width`` when ``method``'s builder has one) for this machine, or plain AR.

    Fields of ``method`` already set to a number stay fixed; those set to ``"auto"`` (or unset) are
    searched over ``budgets`` / ``widths``.  ``beta`` is searched over ``betas`` only when set to
    ``"auto"``: each (budget, width) is replayed with every beta and keeps the one with the highest
    replayed tau (ties: the first of ``betas``).  Beta changes what is accepted; what it changes in a
    round's cost (the bound stops a head step earlier or later) is below the timing noise, and
    choosing by the replay's measured times would make the choice depend on that noise.  The ranking,
    the real decodes and the choice are then per (budget, width) as without it.  ``refs`` are calibration references
    (:func:`dartree.eval.simulate.reference`) made at ``temperature`` with ``seed`` (at T>0 the replay
    accepts against the sampled continuation), disjoint from the prompts the result is reported on;
    ``labels`` name the set (dataset) of each, for per-set forecasts.

    The cost model (module docstring) ranks every setting; the ``finalists`` best-ranked are then
    decoded for real on every calibration prompt, interleaved with AR (:func:`measure_settings`), and
    the fastest measured one is chosen: its measured rate is the forecast, every cost term measured at
    the chosen size (prefill, head, sampling and all).  When that forecast is below ``min_speedup``
    times AR's measured rate, the result says ``use_ar``.  ``finalists=0`` skips the real decodes
    (choice and forecast from the cost model alone, against the references' AR timing).
    On the CPU the verify probe times the forward both ways, on every node and on the root only, and
    one LM-head row (:attr:`HFTarget.scores_rows_apart`), for the choice decoding makes between them
    (:class:`dartree.rounds.WalkRows`).
    """
    if method.is_ar:
        raise ValueError("method: 'ar' has no budget to tune")
    fields = method.fields()
    if "budget" not in fields:
        raise ValueError(f"method: {method.builder!r} has no budget to tune (fields: {fields})")
    if not refs:
        raise ValueError("refs: need at least one calibration reference")
    if isinstance(finalists, bool) or not isinstance(finalists, int) or finalists < 0:
        raise ValueError(f"finalists: must be an integer >= 0, got {finalists!r}")
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
    gamma = int(getattr(bundle.drafter, "gamma", 15))
    if verify_cost is None:
        prefix_len = int(sum(r.sequence.shape[1] for r in refs) / len(refs))
        largest = max(budget_grid) + 1
        sizes = sorted({1, 2, 4, 8, 16, 32, 64, 128, largest} & set(range(1, largest + 1)) | {largest})
        # the decoder may walk lazily at T=0 and with the keyed sampler the tuner decodes with at T>0
        lazy = HFTarget(bundle.target).scores_rows_apart
        verify_cost = measure_verify_cost(bundle.target, bundle.drafter.target_layer_ids, prefix_len, sizes, gamma,
                                          logits="walk" if lazy else "all")
    probe = concrete(method, min(budget_grid), min(width_grid) if has_width else None, beta_grid[0])
    overhead_s = measure_overhead(bundle, probe, refs[0], backend, temperature, seed)
    stats = {}
    chosen_beta: dict[tuple[int, int | None], float | None] = {}
    grid = [(budget, width, beta) for budget in budget_grid for width in width_grid for beta in beta_grid]
    if progress is not None:
        progress(f"{method.builder}: replaying {len(grid)} settings on {len(refs)} calibration prompts")
    replays = replay_settings(bundle, [concrete(method, *g) for g in grid], refs, backend, progress)
    best_tau: dict[tuple[int, int | None], float] = {}
    for (budget, width, beta), replayed in zip(grid, replays, strict=True):
        # one replay each; the setting keeps the beta accepted furthest (ties: the first beta of the grid)
        key = (budget, width)
        if key not in best_tau or replayed.tau > best_tau[key]:
            best_tau[key], stats[key], chosen_beta[key] = replayed.tau, replayed, beta
    # the drafter's forward is the same work whatever the setting: one pooled time (the median over the
    # replays), so that load moving between replays does not rank the settings (it moved 3.0-5.7 ms
    # between the settings of one `make demo` tuning on a shared machine, 18:41 UTC 2026-12-01)
    draft_s = statistics.median(st.draft_s for st in stats.values())
    stats = {key: dataclasses.replace(st, draft_s=draft_s) for key, st in stats.items()}
    candidates = tuple(dataclasses.replace(c, beta=chosen_beta[(c.budget, c.width)])
                       for c in score_candidates(stats, verify_cost, overhead_s))
    measured: tuple[Measurement, ...] = ()
    if finalists:
        ranked = pick_finalists(candidates, finalists)
        if progress is not None:
            progress(f"{method.builder}: decoding AR and " + ", ".join(
                setting_text(c.budget, c.width, c.beta) for c in ranked)
                + f" for real on {len(refs)} calibration prompts")
        # at T>0 every finalist is decoded with both verifiers (unless the method fixes one): the tuner ranks
        # verifiers and builders alike, on real decodes (a rejection decode cannot be replayed from a reference)
        verifiers = ((method.verifier,) if method.verifier else VERIFIERS) if temperature > 0 else (None,)
        measured = measure_settings(bundle, method, [(c.budget, c.width) for c in ranked], refs, backend,
                                    temperature, seed, labels, [c.beta for c in ranked], verifiers)
        ar_rate = measured[0].tokens_per_s
    else:
        ar_seconds = sum(r.ar_seconds for r in refs)
        ar_rate = sum(r.new_tokens for r in refs) / ar_seconds if ar_seconds > 0 else float("inf")
    best, use_ar = choose(candidates, ar_rate, measured, min_speedup)
    fastest = max((m for m in measured if (m.budget, m.width) == (best.budget, best.width)),
                  key=lambda m: m.tokens_per_s, default=None)
    return TuneResult(method.label, method.builder, candidates, best, verify_cost, overhead_s, ar_rate, measured,
                      use_ar, temperature, min_speedup, len(refs), None if fastest is None else fastest.verifier)
