"""Checking a sampler's law: the target's exact law by enumeration, and Pearson's chi-square test with a stated
false-alarm rate and a power from the noncentral chi-square law.

    law = target_law(model, prompt, 2, Warp(1.0))            # {(t1, t2): probability}, every outcome
    counts = outcome_counts(decoder, prompt, 2, 4000, warp=Warp(1.0), seed=3)
    check = chi_square(counts, law, alpha=1e-4)               # LawCheck: statistic, df, critical value
    assert check.passed, check

The false-alarm rate is ``alpha`` (cells expected fewer than 5 times pooled into one); with fixed seeds a
passing test stays passing.  Against a sampler of law ``p'`` the statistic is about ``chi2(df, nc)`` with
``nc = draws * sum((p' - p)**2 / p)`` (:func:`power`, :func:`draws_for_power`).  Exact host arithmetic, no
scipy: closed forms for integer ``df``, the noncentral law as a Poisson mixture of central ones.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

__all__ = ["LawCheck", "chi2_sf", "chi2_critical", "ncx2_sf", "power", "draws_for_power", "chi_square",
           "divergence", "target_law", "outcome_counts", "round_law", "continued", "total_variation"]


def chi2_sf(x: float, df: int) -> float:
    """``P(X > x)`` for ``X ~ chi2(df)``, ``df >= 1`` an integer (closed form)."""
    if x <= 0:
        return 1.0
    h = x / 2.0
    if df % 2 == 0:                       # e^-h * sum_{i < df/2} h^i / i!
        term, total = math.exp(-h), 0.0
        for i in range(df // 2):
            total += term
            term *= h / (i + 1)
        return min(1.0, total)
    total = math.erfc(math.sqrt(h))        # df = 1, then sf(k + 2) = sf(k) + h^(k/2) e^-h / Gamma(k/2 + 1)
    for k in range(1, df, 2):
        total += math.exp((k / 2.0) * math.log(h) - h - math.lgamma(k / 2.0 + 1.0))
    return min(1.0, total)


def chi2_critical(df: int, alpha: float) -> float:
    """The ``x`` with ``chi2_sf(x, df) == alpha`` (bisection to 1e-9 relative)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha: expected 0 < alpha < 1, got {alpha!r}")
    lo, hi = 0.0, float(df) + 10.0
    while chi2_sf(hi, df) > alpha:
        hi *= 2.0
    while hi - lo > 1e-9 * hi:
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if chi2_sf(mid, df) > alpha else (lo, mid)
    return hi


def ncx2_sf(x: float, df: int, nc: float) -> float:
    """``P(X > x)`` for a noncentral ``chi2(df, nc)``: the Poisson(``nc / 2``) mixture of ``chi2(df + 2j)``."""
    if nc <= 0:
        return chi2_sf(x, df)
    mean = nc / 2.0
    total = 0.0
    for j in range(int(mean + 12.0 * math.sqrt(mean) + 30) + 1):
        weight = math.exp(j * math.log(mean) - mean - math.lgamma(j + 1.0))
        total += weight * chi2_sf(x, df + 2 * j)
    return min(1.0, total)


def power(divergence_: float, draws: int, df: int, alpha: float) -> float:
    """The probability that the chi-square test at ``alpha`` rejects a law at chi-square divergence
    ``divergence_`` (:func:`divergence`) from the tested one, with ``draws`` draws and ``df`` degrees of freedom."""
    return ncx2_sf(chi2_critical(df, alpha), df, draws * divergence_)


def draws_for_power(divergence_: float, df: int, alpha: float, wanted: float = 0.99) -> int:
    """The fewest draws (to 1%) with :func:`power` ``>= wanted``."""
    if divergence_ <= 0:
        raise ValueError(f"divergence: expected > 0, got {divergence_!r}")
    critical, n = chi2_critical(df, alpha), 16
    while ncx2_sf(critical, df, n * divergence_) < wanted:
        n *= 2
    lo, hi = n // 2, n
    while hi - lo > max(1, lo // 100):
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ncx2_sf(critical, df, mid * divergence_) < wanted else (lo, mid)
    return hi


def divergence(law: Mapping, other: Mapping) -> float:
    """Pearson's chi-square divergence ``sum((other - law)**2 / law)``: the noncentrality per draw of a sampler
    of law ``other`` tested against ``law`` (infinite when ``other`` puts mass where ``law`` has none)."""
    if any(v > 0 and law.get(k, 0.0) <= 0 for k, v in other.items()):
        return math.inf
    return sum((other.get(k, 0.0) - p) ** 2 / p for k, p in law.items() if p > 0)


@dataclass(frozen=True)
class LawCheck:
    """One chi-square test of counted outcomes against a law."""

    statistic: float
    df: int
    critical: float         # the statistic's bound at the false-alarm rate alpha
    alpha: float
    draws: int
    impossible: tuple = ()  # outcomes seen that the law gives probability 0 (then the check fails)

    @property
    def passed(self) -> bool:
        return not self.impossible and self.statistic <= self.critical

    @property
    def p_value(self) -> float:
        return 0.0 if self.impossible else chi2_sf(self.statistic, self.df)

    def __str__(self) -> str:
        if self.impossible:
            return (f"{len(self.impossible)} outcome(s) of probability 0 came out of {self.draws} draws, e.g. "
                    f"{self.impossible[0]}")
        return (f"chi-square {self.statistic:.1f} on {self.df} df ({self.draws} draws; bound {self.critical:.1f} at "
                f"false-alarm rate {self.alpha:g}; p-value {self.p_value:.2g})")


def chi_square(counts: Mapping, law: Mapping, alpha: float) -> LawCheck:
    """Pearson's test of ``counts`` (outcome -> times seen) against ``law`` (outcome -> probability, summing to
    1); cells expected fewer than 5 times are pooled into one (the chi-square law is a poor fit for them)."""
    draws = int(sum(counts.values()))
    impossible = tuple(k for k, c in counts.items() if c > 0 and law.get(k, 0.0) <= 0)
    cells = [(draws * p, counts.get(k, 0)) for k, p in law.items() if p > 0]
    big = [(e, o) for e, o in cells if e >= 5]
    small = [(e, o) for e, o in cells if e < 5]
    if small:
        big.append((sum(e for e, _ in small), sum(o for _, o in small)))
    statistic = sum((o - e) ** 2 / e for e, o in big)
    df = max(1, len(big) - 1)
    return LawCheck(statistic, df, chi2_critical(df, alpha), alpha, draws, impossible)


@torch.no_grad()
def target_law(model, prompt: torch.Tensor, length: int, warp) -> dict[tuple[int, ...], float]:
    """The exact law of the ``length`` tokens a causal LM samples after ``prompt`` (int64 ``[L]`` or ``[1, L]``)
    under ``warp``: every outcome of positive probability, one batched forward per position over every prefix
    (``V ** (length - 1)`` rows at the last one: keep the vocabulary tiny)."""
    prompt = prompt.reshape(-1).cpu()
    law: dict[tuple[int, ...], float] = {(): 1.0}
    device = next(model.parameters()).device
    for _ in range(length):
        seqs = list(law)
        ids = torch.stack([torch.cat([prompt, torch.tensor(s, dtype=torch.int64)]) for s in seqs]).to(device)
        p = warp.logits(model(input_ids=ids).logits[:, -1].float()).double().softmax(-1).cpu()
        law = {seq + (v,): law[seq] * float(p[row, v])
               for row, seq in enumerate(seqs) for v in torch.nonzero(p[row]).reshape(-1).tolist()}
    return law


def outcome_counts(decoder, prompt: torch.Tensor, length: int, draws: int, *, temperature: float = 1.0,
                   seed: int = 0, rows: int = 1000, **options) -> dict[tuple[int, ...], int]:
    """How often each ``length``-token output came out of ``draws`` seeded decodes of ``prompt``: batches of
    ``rows`` independent copies through ``decoder.generate_batch`` (``options``: its keywords), one seeded
    ``torch.Generator``."""
    from dartree.arguments import check_int
    from dartree.verify import GeneratorSampler

    check_int("draws", draws, low=0)
    check_int("rows", rows)
    sampler = GeneratorSampler(torch.Generator().manual_seed(seed))
    prompt = prompt.reshape(-1)
    counts: dict[tuple[int, ...], int] = {}
    for done in range(0, draws, rows):
        take = min(rows, draws - done)
        for out in decoder.generate_batch([prompt] * take, length, temperature, sampler, **options):
            key = tuple(out.tokens[0].tolist())
            counts[key] = counts.get(key, 0) + 1
    return counts


def round_law(parents: list[int], target, proposal, step=None, stored=None) -> dict[tuple[int, ...], float]:
    """The exact law of the tokens one round of the rejection verifier commits (accepted drafts, then the bonus) on
    a tree of shape ``parents`` (children in index order are the sibling order), every draw without replacement
    and every acceptance outcome enumerated; a node keeps ``min(children, tokens of positive q)`` children.

    ``target(path)`` / ``proposal(path)``: float64 ``[V]`` numpy laws (``p``, and the ``q`` the children are drawn
    from) at the node below the root whose tokens are ``path``.  ``step(r, s, x) -> (accept, r_next, s_next)``:
    one sibling's test, by default the verifier's own ``accept_step`` looked up at call time (a patched rule is
    the one enumerated).  ``stored(path)``: the ``q`` the verifier tests the draws against, by default
    ``proposal`` (another one is a verifier told a wrong proposal).
    """
    import itertools

    import numpy as np

    from dartree.tree import children_lists

    if step is None:
        from dartree.verify import rejection

        step = rejection.accept_step
    kids = children_lists(parents, len(parents))
    memo: dict = {}

    def merge(out: dict, key: tuple, value: float) -> None:
        out[key] = out.get(key, 0.0) + value

    def node(u: int, path: tuple[int, ...]) -> dict:
        if (u, path) in memo:
            return memo[u, path]
        p = np.asarray(target(path), dtype=np.float64)
        out: dict = {}
        if not kids[u]:
            out = {(v,): float(p[v]) for v in np.flatnonzero(p > 0)}
            memo[u, path] = out
            return out
        q = np.asarray(proposal(path), dtype=np.float64)
        q = q / q.sum()
        told = q if stored is None else np.asarray(stored(path), dtype=np.float64) / np.sum(stored(path))
        support = [int(v) for v in np.flatnonzero(q > 0)]
        m = min(len(kids[u]), len(support))
        for seq in itertools.permutations(support, m):
            pr, left = 1.0, q.copy()
            for x in seq:
                pr *= left[x] / left.sum()
                left[x] = 0.0

            def stage(i: int, r, s, pr: float, seq=seq) -> None:
                if i == len(seq):                      # every child rejected: the bonus ~ the residual
                    for v in np.flatnonzero(r > 0):
                        merge(out, (int(v),), pr * float(r[v]))
                    return
                a, r2, s2 = step(r, s, seq[i])
                if a > 0:
                    for tail, t in node(kids[u][i], path + (seq[i],)).items():
                        merge(out, (seq[i],) + tail, pr * a * t)
                if a < 1:
                    stage(i + 1, r2, s2, pr * (1 - a))

            stage(0, p, told, pr)
        memo[u, path] = out
        return out

    return node(0, ())


def continued(law: Mapping, target, length: int) -> dict[tuple[int, ...], float]:
    """``law`` (outcome -> probability, outcomes of any lengths) with every outcome continued by ``target``'s
    exact sampling to ``length`` tokens (``target(path)``: float64 ``[V]``) and cut there."""
    out: dict[tuple[int, ...], float] = {}
    stack = list(law.items())
    while stack:
        seq, pr = stack.pop()
        if len(seq) >= length:
            out[seq[:length]] = out.get(seq[:length], 0.0) + pr
            continue
        p = target(seq)
        stack.extend((seq + (int(v),), pr * float(p[v])) for v in range(len(p)) if p[v] > 0)
    return out


def total_variation(law: Mapping, other: Mapping) -> float:
    """``sum |law - other| / 2`` over the union of outcomes."""
    return 0.5 * sum(abs(law.get(k, 0.0) - other.get(k, 0.0)) for k in set(law) | set(other))
