"""How sure a forecast is: prediction intervals for a ratio of sums over prompts (tokens / seconds), and
how many prompts a forecast within a tolerance needs (:meth:`dartree.eval.tune.TuneResult.forecast_interval`)."""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from dartree.arguments import check_int, check_number

__all__ = ["Interval", "t_quantile", "ratio_prediction", "ratio_units_for"]


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
    check_int("df", df)
    check_number("p", p, lambda x: 0.5 <= x < 1, "must be in [0.5, 1)")
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
    """The ratio ``R = sum(num) / sum(den)`` over ``n`` sampled units (prompts), and the interval that holds
    the same ratio over ``new_units`` other units drawn alike with probability ``level`` (``None`` for fewer
    than 2 units).  Delta method: with ``s^2`` the sample variance of the residuals ``num_i - R den_i``, the
    half-width is ``t(n - 1) * sqrt(s^2 (1/n + 1/new_units)) / mean(den)``: both samples' spread is in it.
    """
    check_int("new_units", new_units)
    spread = _ratio_spread(num, den, level)
    if spread is None:
        return None
    n, ratio, variance, mean_den = spread
    half = t_quantile((1 + level) / 2, n - 1) * math.sqrt(variance * (1 / n + 1 / new_units)) / mean_den
    return Interval(ratio, max(0.0, ratio - half), ratio + half, level)


def _ratio_spread(num: Sequence[float], den: Sequence[float], level: float
                  ) -> tuple[int, float, float, float] | None:
    """``(n, R, s^2, mean(den))`` of a ratio estimator's sample, after checking the arguments; ``None`` for
    fewer than 2 units or no positive ``den`` total."""
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
    """How many units each side (calibration and evaluation) needs for :func:`ratio_prediction`'s interval to
    be within ``tolerance`` of the ratio, at this sample's spread: the smallest ``n`` with
    ``t(n - 1) * s * sqrt(2 / n) / mean(den) <= tolerance * R``.  ``None`` for fewer than 2 units.
    """
    check_number("tolerance", tolerance, lambda x: x > 0, "must be a number > 0")
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
