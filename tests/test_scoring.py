"""The score formula is bit-identical however the branches are batched."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from dartree.scoring import log_normalize, pairwise_sum


@given(m=st.integers(1, 40), k=st.integers(1, 70), seed=st.integers(0, 10**6), ties=st.booleans())
def test_log_normalize_is_batch_invariant(m: int, k: int, seed: int, ties: bool) -> None:
    g = torch.Generator().manual_seed(seed)
    z = torch.randint(0, 3, (m, k), generator=g).float() if ties else torch.randn(m, k, generator=g) * 3
    rest = torch.randn(m, generator=g)
    whole = log_normalize(z, rest)
    rows = torch.stack([log_normalize(z[i], rest[i]) for i in range(m)])
    assert torch.equal(whole, rows)
    assert bool((whole <= 0).all())
    torch.testing.assert_close(whole, torch.log_softmax(torch.cat([z, rest[:, None]], 1), 1)[:, :k])


def test_pairwise_sum_matches_sum() -> None:
    x = torch.rand(3, 5, 13)
    torch.testing.assert_close(pairwise_sum(x), x.sum(-1))
    assert pairwise_sum(torch.tensor([[2.0]])).tolist() == [2.0]
