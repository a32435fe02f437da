"""A distribution check of sampled decodes: randomized PIT values of the tokens under the target's warped law,
tested for uniformity by a chi-square (sampled-tree verifiers are lossless in law, not token for token; the
derivation: docs/verification.md, "The law check")."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from dartree.verify.warp import Warp

__all__ = ["ALPHA", "BINS", "LawCheck", "pit_values", "chi_square_uniform", "law_check"]

#: false-alarm rate of one check: a lossless decoder's tokens fail it with this probability
ALPHA = 1e-3
#: equal-width bins of the uniformity test (at the demo's 500-700 tokens a check, 50-70 expected per bin)
BINS = 10


@dataclass(frozen=True)
class LawCheck:
    """The uniformity test of pooled PIT values of one method at one temperature.

    tokens: tokens tested; statistic / df / p_value: the chi-square over :data:`BINS` bins; impossible:
    tokens of probability 0 under the warped law (any fails the check); alpha: the false-alarm rate.
    """

    method: str
    temperature: float
    tokens: int
    statistic: float
    df: int
    p_value: float
    impossible: int = 0
    alpha: float = ALPHA

    @property
    def passed(self) -> bool:
        return self.impossible == 0 and self.tokens > 0 and self.p_value >= self.alpha

    @property
    def text(self) -> str:
        """What the lossless column says, e.g. ``in law p=0.42 n=630`` (``FAILS`` when it fails)."""
        bad = "" if self.passed else "FAILS "
        extra = f" {self.impossible} impossible" if self.impossible else ""
        return f"{bad}in law p={self.p_value:.2g} n={self.tokens}{extra}"


@torch.no_grad()
def pit_values(model: torch.nn.Module, sequence: Tensor, first: int, warp: Warp,
               generator: torch.Generator) -> tuple[list[float], int]:
    """Randomized PIT values of tokens ``sequence[0, first:]`` under ``warp`` applied to ``model``'s logits.

    Shape:
        sequence: int64 ``[1, L]`` (prompt and output); ``1 <= first <= L``.
    Returns the ``u`` per tested token and how many tested tokens have probability 0 under the warped law.
    ``generator``: a CPU ``torch.Generator`` for the jitter ``V``.
    """
    length = sequence.shape[1]
    if not 1 <= first <= length:
        raise ValueError(f"first: need 1 <= first <= {length}, got {first}")
    if first == length:
        return [], 0
    logits = model(input_ids=sequence).logits[0, first - 1: length - 1]        # [m, V]: predicts first..L-1
    probs = warp.probs(logits.double()).double().cpu()
    tokens = sequence[0, first:].cpu()
    p = probs.gather(1, tokens[:, None])                                        # [m, 1]
    ids = torch.arange(probs.shape[1])[None, :]
    before = (probs > p) | ((probs == p) & (ids < tokens[:, None]))             # ordered before the token
    below = (probs * before).sum(dim=1)
    jitter = torch.rand(tokens.shape[0], generator=generator, dtype=torch.float64)
    u = (below + jitter * p[:, 0]).clamp(0.0, 1.0)
    return u.tolist(), int((p[:, 0] <= 0).sum())


def chi_square_uniform(u: Sequence[float], bins: int = BINS) -> tuple[float, int, float]:
    """Pearson's chi-square of ``u`` against Uniform(0, 1) over ``bins`` equal bins: (statistic, df, p-value)."""
    n = len(u)
    if n == 0:
        return 0.0, bins - 1, 1.0
    counts = [0] * bins
    for x in u:
        counts[min(bins - 1, max(0, int(x * bins)))] += 1
    expected = n / bins
    stat = sum((c - expected) ** 2 for c in counts) / expected
    df = bins - 1
    p = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                      torch.tensor(stat / 2, dtype=torch.float64)))
    return stat, df, p if math.isfinite(p) else 0.0


def law_check(method: str, temperature: float, u: Sequence[float], impossible: int = 0,
              alpha: float = ALPHA) -> LawCheck:
    """The :class:`LawCheck` of pooled PIT values ``u``."""
    stat, df, p = chi_square_uniform(u)
    return LawCheck(method, temperature, len(u), stat, df, p, impossible, alpha)
