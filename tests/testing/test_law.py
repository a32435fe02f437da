"""dartree.testing.law: the chi-square law, its quantiles and the noncentral power in closed form (checked against
known values and a simulation), and the test's pooling and impossible outcomes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dartree.testing.law import (
    chi2_critical,
    chi2_sf,
    chi_square,
    divergence,
    draws_for_power,
    ncx2_sf,
    power,
    round_law,
    total_variation,
)


@pytest.mark.parametrize("df,alpha,value", [(1, 0.05, 3.841459), (2, 0.05, 5.991465), (5, 0.05, 11.070498),
                                            (10, 1e-3, 29.588298), (21, 1e-5, 60.70)])
def test_chi_square_quantiles_match_the_tables(df, alpha, value):
    assert chi2_critical(df, alpha) == pytest.approx(value, abs=0.01)
    assert chi2_sf(chi2_critical(df, alpha), df) == pytest.approx(alpha, rel=1e-6)


def test_the_noncentral_law_matches_a_simulation():
    draws = np.random.default_rng(0).noncentral_chisquare(10, 10.0, 200_000)
    critical = chi2_critical(10, 0.05)
    assert ncx2_sf(critical, 10, 10.0) == pytest.approx(float((draws > critical).mean()), abs=0.005)
    assert ncx2_sf(critical, 10, 0.0) == pytest.approx(0.05, rel=1e-6)


def test_power_grows_with_draws_and_draws_for_power_reaches_it():
    assert power(0.025, 1000, 21, 1e-5) < power(0.025, 3000, 21, 1e-5) < power(0.025, 4000, 21, 1e-5)
    n = draws_for_power(0.025, 21, 1e-5, 0.99)
    assert power(0.025, n, 21, 1e-5) >= 0.99 > power(0.025, int(n * 0.95), 21, 1e-5)


def test_chi_square_pools_small_cells_and_fails_on_impossible_outcomes():
    law = {(0,): 0.5, (1,): 0.49, (2,): 0.01}
    check = chi_square({(0,): 50, (1,): 49, (2,): 1}, law, 1e-3)
    assert check.passed and check.df == 2 and check.statistic == pytest.approx(0.0)   # (2,): a pool, expected 1
    bad = chi_square({(0,): 50, (1,): 49, (3,): 1}, law, 1e-3)
    assert not bad.passed and bad.impossible == ((3,),) and "probability 0" in str(bad)
    assert not chi_square({(0,): 90, (1,): 10}, law, 1e-3).passed
    assert divergence(law, {(3,): 1.0}) == math.inf
    assert total_variation(law, {(0,): 1.0}) == pytest.approx(0.5)


def test_round_law_of_a_chain_is_the_target_and_a_biased_step_is_not():
    p = lambda path: np.array([0.7, 0.2, 0.1]) if not path else np.array([0.1, 0.3, 0.6])  # noqa: E731
    q = lambda path: np.array([0.95, 0.05, 0.0])                                           # noqa: E731
    law = round_law([-1, 0], p, q)
    truth = {(a, b): p(())[a] * p((a,))[b] for a in range(3) for b in range(3)}
    got: dict = {}
    for k, v in law.items():                 # a one-token outcome (the root's bonus) continued by the target
        for key, w in ([(k, v)] if len(k) == 2 else [(k + (b,), v * p(k)[b]) for b in range(3)]):
            got[key] = got.get(key, 0.0) + w
    assert max(abs(got[k] - truth[k]) for k in truth) < 1e-12

    def step(r, s, x):                       # accept 5% too often
        from dartree.verify.rejection import accept_step

        a, r2, s2 = accept_step(r, s, x)
        return (1.0 if s[x] <= 0 else min(1.0, 1.05 * r[x] / s[x])), r2, s2

    biased = round_law([-1, 0], p, q, step=step)
    assert biased[(0, 0)] + biased[(0, 1)] + biased[(0, 2)] == pytest.approx(0.735)          # 1.05 * 0.7
