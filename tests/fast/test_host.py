"""The host (CPU) path of the fast backend: exact candidate selection, the vocabulary normaliser, and
the host ops against the torch twins."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dartree.fast import host, twins
from dartree.scoring import rest_logsumexp


def stable_topk(x: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    values, tokens = torch.sort(x, dim=-1, descending=True, stable=True)
    return tokens[..., :topk], values[..., :topk]


@settings(max_examples=60, deadline=None)
@given(vocab=st.integers(1, 5000), topk_frac=st.floats(0, 1), seed=st.integers(0, 2**16),
       kind=st.sampled_from(["normal", "ties", "masked"]))
def test_select_equals_a_stable_sort(vocab: int, topk_frac: float, seed: int, kind: str) -> None:
    """Two-stage selection == the reference's stable sort: ties by token id, -inf never before a finite
    logit, any vocabulary size (groups that do not divide V, K close to V)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, vocab, generator=g) * 2
    if kind == "ties":
        x = torch.randint(0, 3, x.shape, generator=g).float()
    topk = max(1, int(topk_frac * vocab))
    if kind == "masked":
        masked = torch.rand(x.shape, generator=g) < 0.5
        masked[..., :topk] = False  # keep at least K finite logits per position
        x = x.masked_fill(masked, float("-inf"))
    tokens, values = host.select(x, topk)
    ref_tokens, ref_values = stable_topk(x, topk)
    assert np.array_equal(tokens, ref_tokens.numpy()) and np.array_equal(values, ref_values.numpy())


def test_select_on_a_large_vocabulary_with_ties_at_the_boundary() -> None:
    x = torch.zeros(1, 2, 151936)
    x[0, 0, ::7] = 1.0  # 21706 tied maxima: the K smallest ids win
    x[0, 1, 151930:] = 5.0  # the best tokens sit in the tail that no group covers
    tokens, _ = host.select(x, 64)
    ref, _ = stable_topk(x, 64)
    assert np.array_equal(tokens, ref.numpy())


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_select_rejects_nan_and_plus_inf_anywhere(bad: float) -> None:
    for pos in (0, 4095, 4099):  # a group, the last group, the tail
        x = torch.randn(1, 2, 4100)
        x[0, 1, pos] = bad
        with pytest.raises(ValueError, match="NaN or \\+inf"):
            host.select(x, 8)


def test_rest_logsumexp_is_the_log_sum_exp_of_the_other_tokens() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, 3000, generator=g) * 4
    x[0, 0, 100:200] = float("-inf")
    tokens, _ = stable_topk(x, 16)
    rest = rest_logsumexp(x, tokens)
    exact = torch.logsumexp(x.double().scatter(-1, tokens, float("-inf")), -1)
    torch.testing.assert_close(rest.double(), exact, rtol=0, atol=2e-6)
    assert torch.equal(rest, rest_logsumexp(x, tokens, x.gather(-1, tokens[..., :1])[..., 0]))
    far = torch.full((1, 1, 10), -200.0)
    far[..., 0] = 0.0
    assert rest_logsumexp(far, torch.zeros(1, 1, 1, dtype=torch.int64)).item() == float("-inf")  # underflow


@pytest.mark.parametrize("vocab_normalize", [True, False])
def test_host_topk_candidates_equals_the_twin(vocab_normalize: bool) -> None:
    x = torch.randint(0, 4, (3, 5, 700), generator=torch.Generator().manual_seed(1)).float()
    a, b = host.topk_candidates(x, 9, vocab_normalize), twins.topk_candidates(x, 9, vocab_normalize)
    for u, v in zip(a, b, strict=True):
        assert u.dtype == v.dtype and torch.equal(u, v)


def test_host_depth_step_and_top_b_equal_the_twins() -> None:
    g = torch.Generator().manual_seed(2)
    parents = -torch.randint(0, 3, (3, 4), generator=g).float()
    log_q = -torch.randint(0, 3, (3, 4, 5), generator=g).float()  # many ties
    for width in (1, 7, 20):
        for x, y in zip(host.depth_step(parents, log_q, -0.2, width), twins.depth_step(parents, log_q, -0.2, width),
                        strict=True):
            assert torch.equal(x, y)
    scores = -torch.randint(0, 4, (3, 30), generator=g).float()
    assert torch.equal(host.top_b(scores, 11), twins.top_b(scores, 11))
