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
import functools
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from dartree.builders import make_builder
from dartree.decode import GenerationResult, generate_ar
from dartree.eval.bundles import Bundle
from dartree.eval.methods import AR, AUTO, MethodSpec, make_decoder, resolve_backend
from dartree.eval.simulate import Reference, ReplayBlocks, simulate
from dartree.models.target import HFTarget
from dartree.rounds import VERIFIERS, walk_pays
from dartree.tree import DraftTree
from dartree.verify.sampling import GeneratorSampler, KeyedSampler

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
class VerifyCost:
    """Measured seconds of one tree verification (inputs + target forward) by tree size.

    sizes: tree nodes, root included, strictly increasing; seconds: median wall time at each size.
    row_s: seconds of the LM head on one node, which the walk runs once per accepted node when the
    forward scored the root only (``logits="root"``); 0 when every node was scored in the forward.
    root_seconds: with ``row_s``, the forward's time at each size when it scores the root only
    (``measure_verify_cost(..., logits="walk")``: ``seconds`` then score every node); empty when the
    decoder never walks lazily here.  :meth:`round_s` picks between the two as the decoder does.
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
        """Seconds of a round's verification of a tree of ``nodes`` nodes when ``committed`` tokens are
        committed a round, as the decoder scores it (:class:`dartree.rounds.WalkRows`): the forward on
        the root only plus one LM-head row per accepted node while that pays (:func:`dartree.rounds.walk_pays`),
        else the forward on every node."""
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
    """Replayed rounds of one configuration over the calibration prompts."""

    tau: float
    mean_tree_size: float
    draft_s: float                 # mean per round
    build_s: float                 # mean per round
    rounds: int
    tree_sizes: tuple[int, ...]
    accepted_lengths: tuple[int, ...]


@dataclass(frozen=True)
class Candidate:
    """One (budget, width) scored by the cost model; ``width`` is ``None`` for builders without one.

    ``beta``: the depth penalty this (budget, width) was replayed with when the tuner searched it
    (``beta=auto``: the one of :data:`DEFAULT_BETAS` of highest replayed tau here), else ``None``.
    """

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


@dataclass(frozen=True)
class Measurement:
    """Real decodes of one setting on the calibration prompts, timed as the benchmark times them
    (the whole ``generate`` call, prefill included), interleaved with AR.

    budget / width: the setting (``budget=None``: plain AR).  per_label: ``(label, tokens, seconds)``
    per calibration set (the dataset a reference came from), in first-seen order.  beta: the depth
    penalty decoded with when the tuner searched it, else ``None``.  per_prompt: ``(label, tokens,
    seconds)`` of every calibration prompt in the order of the references (the same order in every
    measurement of one tuning), for the forecast's prediction interval (:meth:`TuneResult.forecast_interval`).
    """

    budget: int | None
    width: int | None
    tokens: int
    seconds: float
    rounds: int
    per_label: tuple[tuple[str, int, float], ...] = ()
    beta: float | None = None
    per_prompt: tuple[tuple[str, int, float], ...] = ()
    verifier: str | None = None       # how it verified at T>0 ("match" / "rejection"; None: greedy or AR)

    @property
    def is_ar(self) -> bool:
        return self.budget is None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("inf")

    @property
    def tau(self) -> float:
        return self.tokens / max(1, self.rounds)

    def label_tokens_per_s(self) -> dict[str, float]:
        return {label: t / s if s > 0 else float("inf") for label, t, s in self.per_label}


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


@dataclass(frozen=True)
class Interval:
    """An estimate and the interval ``[low, high]`` that holds the predicted value with probability ``level``."""

    estimate: float
    low: float
    high: float
    level: float

    def __contains__(self, value: float) -> bool:
        return self.low <= value <= self.high

    @property
    def text(self) -> str:
        return f"{self.low:.3g}-{self.high:.3g}"


def t_quantile(p: float, df: int) -> float:
    """Student's t distribution's ``p`` quantile with ``df`` degrees of freedom, for ``0.5 <= p < 1``
    (bisection on the CDF, integrated by Simpson's rule; about 6 digits)."""
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"df: must be an integer >= 1, got {df!r}")
    if isinstance(p, bool) or not isinstance(p, int | float) or not 0.5 <= p < 1:
        raise ValueError(f"p: must be in [0.5, 1), got {p!r}")
    return _t_quantile(float(p), df)


@functools.cache
def _t_quantile(p: float, df: int) -> float:
    scale = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(x: float, steps: int = 2048) -> float:
        h = x / steps
        ys = [scale * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(steps + 1)]
        return 0.5 + h / 3 * (ys[0] + ys[-1] + 4 * sum(ys[1:-1:2]) + 2 * sum(ys[2:-1:2]))

    low, high = 0.0, 1.0
    while cdf(high) < p:
        low, high = high, 2 * high
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < p else (low, mid)
    return (low + high) / 2


def ratio_prediction(num: Sequence[float], den: Sequence[float], new_units: int, level: float = 0.9
                     ) -> Interval | None:
    """The ratio ``sum(num) / sum(den)`` over ``n`` sampled units (prompts), and the interval that holds
    the same ratio over ``new_units`` other units drawn alike with probability ``level``: ``None`` for
    fewer than 2 units.

    A prediction interval for a ratio estimator (delta method): with residuals ``e_i = num_i - R den_i``
    of sample variance ``s^2``, the new sample's ratio differs from ``R`` by about the difference of the
    two samples' mean residuals over the mean ``den``, of variance ``s^2 (1/n + 1/new_units) / mean(den)^2``;
    the half-width is Student's t quantile (``n - 1`` degrees of freedom) times its square root.  Both
    samples' spread is in it: a forecast for a few evaluation prompts cannot be surer than those
    prompts are alike, however many prompts it was calibrated on.
    """
    if isinstance(new_units, bool) or not isinstance(new_units, int) or new_units < 1:
        raise ValueError(f"new_units: must be an integer >= 1, got {new_units!r}")
    spread = _ratio_spread(num, den, level)
    if spread is None:
        return None
    n, ratio, variance, mean_den = spread
    half = t_quantile((1 + level) / 2, n - 1) * math.sqrt(variance * (1 / n + 1 / new_units)) / mean_den
    return Interval(ratio, max(0.0, ratio - half), ratio + half, level)


def _ratio_spread(num: Sequence[float], den: Sequence[float], level: float
                  ) -> tuple[int, float, float, float] | None:
    """``(n, R, s^2, mean(den))`` of a ratio estimator's sample (``s^2``: the sample variance of the
    residuals ``num_i - R den_i``), after checking the arguments; ``None`` for fewer than 2 units or no
    positive ``den`` total."""
    n = len(num)
    if n != len(den):
        raise ValueError(f"den: need one per num ({n}), got {len(den)}")
    if not 0 < level < 1:
        raise ValueError(f"level: must be in (0, 1), got {level!r}")
    if n < 2 or not sum(den) > 0:
        return None
    ratio = sum(num) / sum(den)
    variance = sum((a - ratio * b) ** 2 for a, b in zip(num, den, strict=True)) / (n - 1)
    return n, ratio, variance, sum(den) / n


def ratio_units_for(num: Sequence[float], den: Sequence[float], tolerance: float, level: float = 0.9) -> int | None:
    """How many units (prompts) each side needs, calibration and evaluation alike, for the 90% (``level``)
    prediction interval of :func:`ratio_prediction` to be within ``tolerance`` of the ratio (relative),
    at the spread the sample ``num`` / ``den`` shows: the smallest ``n`` with
    ``t(n - 1) * s * sqrt(2 / n) / mean(den) <= tolerance * R``, the half-width :func:`ratio_prediction`
    gives ``n`` units for ``n`` others (``t(n - 1)`` its quantile at ``n - 1`` degrees of freedom; ``s``
    and ``R`` as this sample shows them).  ``None`` for fewer than 2 units; 2 when the sample shows no
    spread.
    """
    if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or not tolerance > 0:
        raise ValueError(f"tolerance: must be a number > 0, got {tolerance!r}")
    sample = _ratio_spread(num, den, level)
    if sample is None or not sample[1] > 0:
        return None
    _, ratio, variance, mean_den = sample
    spread = math.sqrt(variance) / mean_den / (tolerance * ratio)              # relative, per unit

    def fits(units: int) -> bool:
        return t_quantile((1 + level) / 2, units - 1) * spread * math.sqrt(2 / units) <= 1.0

    # the normal quantile's answer is a lower bound (t > z); t falls as the units grow, so count up from it
    z = statistics.NormalDist().inv_cdf((1 + level) / 2)
    units = max(2, math.ceil(2 * (z * spread) ** 2 - 1e-9))
    while not fits(units):
        units += max(1, units // 64)
    while units > 2 and fits(units - 1):
        units -= 1
    return units


def setting_text(budget: int, width: int | None, beta: float | None = None) -> str:
    """``B=.. W=.. beta=..`` (the parts a setting has)."""
    return f"B={budget}" + ("" if width is None else f" W={width}") + ("" if beta is None else f" beta={beta:g}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)   # timing needs the device idle at the boundary


def _synthetic_tree(nodes: int, gamma: int, device: torch.device, rows: int = 1) -> DraftTree:
    """A valid tree of ``nodes`` nodes and depth <= ``gamma`` (w chains of equal length; w minimal),
    repeated in ``rows`` rows."""
    width = max(1, -(-(nodes - 1) // gamma))
    idx = torch.arange(nodes, device=device)
    parents = torch.where(idx > width, idx - width, torch.zeros_like(idx))
    parents[0] = -1
    depths = torch.where(idx > 0, (idx - 1) // width + 1, torch.zeros_like(idx))
    tokens = (idx * 7 + 3) % 97
    ranks = torch.where(idx > 0, (idx - 1) % width, torch.full_like(idx, -1))
    scores = -depths.float()
    def rep(x: torch.Tensor) -> torch.Tensor:
        return x[None].expand(rows, -1).contiguous()

    return DraftTree(rep(tokens), rep(parents), rep(depths), rep(scores), rep(ranks),
                     torch.full((rows,), nodes, dtype=torch.int64, device=device))


@torch.no_grad()
def measure_verify_cost(model: torch.nn.Module, layer_ids: Sequence[int] = (), prefix_len: int = 256,
                        sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128), gamma: int = 15,
                        repeats: int = 5, rows: int = 1, logits: str = "all") -> VerifyCost:
    """Median seconds of tree inputs + tree forward for each tree size in ``sizes`` (root included).

    ``rows > 1`` times one batched forward of ``rows`` trees of that size (an :class:`HFTarget`
    with ``rows`` prefixes): the verify cost of a round at concurrency ``rows``.  ``logits="root"``
    runs the LM head on the roots only, as the batched greedy round on the CPU does (the walk scores
    the accepted nodes afterwards), and times one such row (``row_s``); ``"walk"`` (one request) times
    the forward both ways, every node in ``seconds`` and the root only in ``root_seconds``, interleaved,
    plus ``row_s``: the two ways single-request decoding chooses between (:class:`dartree.rounds.WalkRows`).
    The prefix is random tokens (attention cost depends on its length, not on its content).
    """
    sizes = tuple(sorted(set(int(s) for s in sizes)))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"sizes: need tree sizes >= 1, got {sizes}")
    for name, value in (("repeats", repeats), ("rows", rows)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
    if logits not in ("all", "root", "walk"):
        raise ValueError(f"logits: expected 'all', 'root' or 'walk', got {logits!r}")
    if logits == "walk" and rows != 1:
        raise ValueError(f"logits: 'walk' times single-request rounds; got rows={rows}")
    target = HFTarget(model, layer_ids=tuple(layer_ids))
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, target.vocab_size, (rows, prefix_len), generator=gen).to(target.device)
    target.prefill(list(prefix))
    ways = ("all", "root") if logits == "walk" else (logits,)
    final = None
    trees = [_synthetic_tree(n, gamma, target.device, rows) for n in sizes]
    times: dict[tuple[int, str], list[float]] = {(n, way): [] for n in sizes for way in ways}
    # interleaved, every size and way in each repetition: a machine whose load drifts during the probe
    # charges every size alike (sizes one after another moved 65 nodes from 3.3x to 1.9x one node's time
    # between two runs of `make demo` on a shared machine, 2026-12-01)
    for _ in range(repeats + 1):                           # the first repetition warms up and is dropped
        for n, tree in zip(sizes, trees, strict=True):
            for way in ways:
                _sync(target.device)
                start = time.perf_counter()
                out = target.forward_tree(target.tree_inputs(tree), logits=way)
                final = out.final if out.final is not None else final
                _sync(target.device)
                times[(n, way)].append(time.perf_counter() - start)
                target.rollback()
    seconds = {way: [statistics.median(times[(n, way)][1:]) for n in sizes] for way in ways}
    row_s = 0.0
    if logits != "all" and final is not None:           # the walk's rows: one LM-head row per accepted node
        row = final[:, 0]
        times = []
        for _ in range(repeats + 1):
            _sync(target.device)
            start = time.perf_counter()
            target.head_logits(row)
            _sync(target.device)
            times.append(time.perf_counter() - start)
        row_s = statistics.median(times[1:])
    target.reset()
    if logits == "walk":
        return VerifyCost(sizes, tuple(seconds["all"]), prefix_len, row_s, tuple(seconds["root"]))
    return VerifyCost(sizes, tuple(seconds[logits]), prefix_len, row_s)


def pick_finalists(candidates: Sequence[Candidate], count: int) -> list[Candidate]:
    """The ``count`` settings to decode for real: in the cost model's order (forecast tokens/s, then
    budget, then width), the best of each budget first, then the next best of any budget.

    Why one per budget first: the model's error is mostly per tree size (its verify cost is one probe
    per size), so one noisy probe moves every width of a budget together.  At 23:14 UTC 2026-12-01 a
    probe that timed 65 nodes at 1.9x one (3.3x at 21:13) ranked three B=64 settings first; the real
    decodes then only compared them, and the run measured the tuned method at 0.96x ``ddtree`` B=16.
    """
    ranked = sorted(candidates, key=lambda c: (-c.tokens_per_s, c.budget, c.width or 0))
    first: list[Candidate] = []
    for c in ranked:
        if len(first) < count and all(c.budget != f.budget for f in first):
            first.append(c)
    rest = [c for c in ranked if all(c is not f for f in first)]
    return sorted(first + rest[: max(0, count - len(first))],
                  key=lambda c: (-c.tokens_per_s, c.budget, c.width or 0))


@torch.no_grad()
def measure_overhead(bundle: Bundle, method: MethodSpec, ref: Reference, backend: str, temperature: float = 0.0,
                     seed: int = 0) -> float:
    """Mean seconds per round outside draft, build and the verify probe, from one real decode.

    That is the acceptance walk (``verify_s - target_s``: at T>0 it samples at every node) plus the
    commit (KV compaction, the drafter's context update): the stages the replay does not run.
    """
    sampler = KeyedSampler(seed) if temperature > 0 else None
    decoded = make_decoder(bundle, method, backend).generate(ref.sequence[:, : ref.prompt_len],
                                                             max(1, min(ref.new_tokens, 32)), temperature, sampler)
    return sum(r.commit_s + r.accept_s for r in decoded.rounds) / max(1, decoded.num_rounds)


@torch.no_grad()
def replay_stats(bundle: Bundle, method: MethodSpec, refs: Iterable[Reference], backend: str) -> ConfigStats:
    """Replay ``method`` (concrete settings) on every reference; pooled per-round statistics."""
    return replay_settings(bundle, [method], refs, backend)[0]


def replay_settings(bundle: Bundle, methods: Sequence[MethodSpec], refs: Iterable[Reference], backend: str,
                    progress: Callable[[str], None] | None = None) -> list[ConfigStats]:
    """Replay every method of ``methods`` (concrete settings) on every reference; pooled per-round
    statistics per method, in order.

    perf (both devices): one reference at a time, its drafter blocks drafted once
    (:class:`~dartree.eval.simulate.ReplayBlocks`) and read by every method's replay, which then only
    builds and accepts.  The values equal :func:`replay_stats` of each method alone.
    """
    made = [(make_builder(m.builder, resolve_backend(m.builder, backend), **m.config),
             bundle.heads[m.head] if m.head is not None else None) for m in methods]
    rounds: list[list] = [[] for _ in methods]
    refs = list(refs)
    for i, ref in enumerate(refs):
        if progress is not None:
            progress(f"replaying {len(methods)} settings on calibration prompt {i + 1}/{len(refs)}")
        blocks = ReplayBlocks(bundle.drafter, ref)
        for (builder, head), pooled in zip(made, rounds, strict=True):
            pooled.extend(simulate(bundle, builder, head, ref, blocks=blocks).rounds)
    return [_pooled(r) for r in rounds]


def _pooled(rounds: Sequence) -> ConfigStats:
    n = max(1, len(rounds))
    return ConfigStats(
        tau=sum(r.committed for r in rounds) / n,
        mean_tree_size=sum(r.tree_size for r in rounds) / n,
        draft_s=sum(r.draft_s for r in rounds) / n,
        build_s=sum(r.build_s for r in rounds) / n,
        rounds=len(rounds),
        tree_sizes=tuple(r.tree_size for r in rounds),
        accepted_lengths=tuple(r.accepted_length for r in rounds),
    )


def score_candidates(stats: dict[tuple[int, int | None], ConfigStats], cost: VerifyCost,
                     overhead_s: float) -> tuple[Candidate, ...]:
    """Apply the cost model (module docstring) to every measured (budget, width)."""
    out = []
    for (budget, width), s in sorted(stats.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        sizes = s.tree_sizes or (round(s.mean_tree_size),)
        # the forward, plus the walk's LM-head rows (one per accepted node) when it scores the root only
        verify_s = sum(cost.round_s(size + 1, s.tau) for size in sizes) / len(sizes)
        round_s = s.draft_s + s.build_s + verify_s + overhead_s
        out.append(Candidate(budget, width, s.tau, s.mean_tree_size, s.draft_s, s.build_s, verify_s, overhead_s,
                             round_s, s.tau / round_s if round_s > 0 else float("inf")))
    return tuple(out)


def score_at_concurrency(stats: dict[tuple[int, int | None], ConfigStats], cost: VerifyCost, rows: int,
                         draft_s: float, commit_s: float, build_scale: float | None = None) -> tuple[Candidate, ...]:
    """The cost model of a batched round with ``rows`` requests in flight, for every (budget, width).

    ``stats`` are single-request replays (tau and tree sizes do not depend on the batch), ``cost``
    the verify cost measured at batch ``rows`` (``measure_verify_cost(..., rows=rows)``), ``draft_s``
    and ``commit_s`` one batched round's drafter forward and commit measured at that batch::

        round_s       = draft_s + build_scale * build_s(B, W) + E[t_v(q + 1)] + commit_s
        tokens_per_s  = rows * tau(B, W) / round_s          (all requests together)

    where ``t_v(q + 1)`` is averaged over ``q``, the largest of ``rows`` independent draws from the
    replayed tree sizes (the batched forward is as wide as its largest tree; ``rows = 1`` gives
    :func:`score_candidates`' mean over the sizes).
    ``build_scale`` is what building ``rows`` trees costs in single builds: ``rows`` (the default) for
    builders that work row by row; batched head calls make it smaller, so callers measure it (the
    batched build time of one candidate over its single-request build time).  ``cost.row_s`` (the
    single-request walk's LM-head rows) is not added here: a batched probe scores every node.
    """
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows: must be an integer >= 1, got {rows!r}")
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


@torch.no_grad()
def measure_settings(bundle: Bundle, method: MethodSpec, settings: Sequence[tuple[int, int | None]],
                     refs: Sequence[Reference], backend: str, temperature: float = 0.0, seed: int = 0,
                     labels: Sequence[str] | None = None,
                     betas: Sequence[float | None] | None = None,
                     verifiers: Sequence[str | None] = (None,)) -> tuple[Measurement, ...]:
    """Decode every reference's prompt for real with AR and with each ``(budget, width)`` of ``method``
    (and its ``betas[i]`` when given and not ``None``).

    Timed as :func:`dartree.eval.bench.run_bench` times (the whole call, prefill included), after one
    untimed warm-up each; per prompt AR and the settings run one after the other, the order rotated
    from prompt to prompt so that load drifting over the run penalises none of them more.  At T>0 each
    setting is decoded with every verifier of ``verifiers``: ``match`` (and ``None``) draw with the same
    :class:`~dartree.KeyedSampler` seed as the references, ``rejection`` from a generator seeded per prompt.
    Returns AR's measurement first, then one per setting and verifier, in that order.
    """
    labels = list(labels) if labels is not None else [r.label for r in refs]
    if len(labels) != len(refs):
        raise ValueError(f"labels: need one per reference ({len(refs)}), got {len(labels)}")
    betas = [None] * len(settings) if betas is None else list(betas)
    if len(betas) != len(settings):
        raise ValueError(f"betas: need one per setting ({len(settings)}), got {len(betas)}")
    verifiers = tuple(verifiers) if temperature > 0 else (None,)
    keys: list[tuple[int | None, int | None, str | None]] = [(None, None, None)]
    runners: list[Callable[..., GenerationResult]] = [lambda ids, n, t, smp: generate_ar(bundle.target, ids, n, t, smp)]
    key_betas: list[float | None] = [None]
    for (budget, width), beta in zip(settings, betas, strict=True):
        decoder = make_decoder(bundle, _concrete(method, budget, width, beta), backend)
        for verifier in verifiers:
            keys.append((budget, width, verifier))
            key_betas.append(beta)
            runners.append(lambda ids, n, t, smp, d=decoder, v=verifier: d.generate(ids, n, t, smp, verifier=v))
    first = refs[0].sequence[:, : refs[0].prompt_len]
    for run in runners:                      # first calls allocate caches and pick kernels: untimed
        run(first, max(1, min(8, refs[0].new_tokens)), 0.0, None)
    totals = {k: {} for k in keys}           # key -> label -> [tokens, seconds, rounds]
    per_prompt: dict[tuple[int | None, int | None, str | None], list[tuple[str, int, float]]] = {k: [] for k in keys}
    for i, (ref, label) in enumerate(zip(refs, labels, strict=True)):
        ids = ref.sequence[:, : ref.prompt_len]
        order = list(range(len(keys)))
        order = order[i % len(order):] + order[: i % len(order)]
        for j in order:
            sampler = None
            if temperature > 0:
                sampler = KeyedSampler(seed) if keys[j][2] != "rejection" else GeneratorSampler(
                    torch.Generator(device=ids.device).manual_seed(seed * 1_000_003 + i))
            start = time.perf_counter()
            result = runners[j](ids, ref.new_tokens, temperature, sampler)
            seconds = time.perf_counter() - start
            cell = totals[keys[j]].setdefault(label, [0, 0.0, 0])
            cell[0] += result.tokens.shape[1]
            cell[1] += seconds
            cell[2] += max(1, result.num_rounds)
            per_prompt[keys[j]].append((label, result.tokens.shape[1], seconds))
    out = []
    for key, beta in zip(keys, key_betas, strict=True):
        cells = totals[key]
        out.append(Measurement(key[0], key[1], sum(c[0] for c in cells.values()), sum(c[1] for c in cells.values()),
                               sum(c[2] for c in cells.values()),
                               tuple((label, c[0], c[1]) for label, c in cells.items()), beta,
                               tuple(per_prompt[key]), key[2]))
    return tuple(out)


def _concrete(method: MethodSpec, budget: int, width: int | None, beta: float | None = None) -> MethodSpec:
    """``method`` with these settings (``width`` / ``beta`` only where not ``None``)."""
    extra = ({"width": width} if width is not None else {}) | ({"beta": beta} if beta is not None else {})
    return method.with_settings(budget=budget, **extra)


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
    probe = _concrete(method, min(budget_grid), min(width_grid) if has_width else None, beta_grid[0])
    overhead_s = measure_overhead(bundle, probe, refs[0], backend, temperature, seed)
    stats = {}
    chosen_beta: dict[tuple[int, int | None], float | None] = {}
    grid = [(budget, width, beta) for budget in budget_grid for width in width_grid for beta in beta_grid]
    if progress is not None:
        progress(f"{method.builder}: replaying {len(grid)} settings on {len(refs)} calibration prompts")
    replays = replay_settings(bundle, [_concrete(method, *g) for g in grid], refs, backend, progress)
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
