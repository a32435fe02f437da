"""Warp: transformers' own warpers, bit for bit, in transformers' order; clear errors for bad values."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from dartree.verify.sampling import GeneratorSampler, KeyedSampler
from dartree.verify.warp import Warp


def hf(scores: torch.Tensor, temperature: float, top_k=None, top_p=None, min_p=None) -> torch.Tensor:
    procs = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    if top_k is not None:
        procs.append(TopKLogitsWarper(top_k))
    if top_p is not None and top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p))
    if min_p is not None:
        procs.append(MinPLogitsWarper(min_p))
    return procs(None, scores.float())


SETTINGS = [
    dict(),
    dict(top_k=1), dict(top_k=7), dict(top_k=200),
    dict(top_p=0.9), dict(top_p=0.5), dict(top_p=1.0), dict(top_p=1e-6), dict(top_p=0.0),
    dict(min_p=0.1), dict(min_p=1.0), dict(min_p=0.0),
    dict(top_k=20, top_p=0.8, min_p=0.05),
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "plain")
@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.3])
def test_equals_transformers_warpers(settings, temperature):
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(3, 111, generator=g) * 3
    scores[1, 5:9] = scores[1, 4]                       # ties, at the top-k boundary too
    scores[2] = torch.round(scores[2])                  # many ties
    got = Warp(temperature, **settings).logits(scores)
    assert torch.equal(got, hf(scores, temperature, **settings))
    # leading dimensions: a [b, n, V] block of node logits is warped row by row
    assert torch.equal(Warp(temperature, **settings).logits(scores.reshape(1, 3, 111))[0], got)


@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.95, 0.999])
def test_top_p_mask_equals_the_sorting_one_with_ties_at_the_boundary(top_p):
    """The CPU mask (numpy-sorted values, torch's sort only for a tie across the boundary) is transformers'
    mask bit for bit: random rows, rows of few distinct values, and rows whose boundary falls inside a tie."""
    from dartree.verify.warp import _hf_top_p_drop, _top_p_drop
    g = torch.Generator().manual_seed(5)
    rows = [torch.randn(64, 4098, generator=g) * 3, torch.round(torch.randn(64, 300, generator=g) * 2) / 2]
    # every row's boundary token tied with its neighbour below: the straddling case, exactly
    x = torch.randn(32, 200, generator=g)
    for r in range(32):
        ordered, order = torch.sort(x[r])
        j = int((ordered.softmax(-1).cumsum(-1) <= 1 - top_p).sum())
        if j > 0:
            x[r, order[j - 1]] = ordered[j]
    rows.append(x)
    for scores in rows:
        assert torch.equal(_top_p_drop(scores, top_p), _hf_top_p_drop(scores, top_p))
        for r in (0, 5):                                        # one row alone (AR's draw, one node)
            assert torch.equal(_top_p_drop(scores[r : r + 1], top_p), _hf_top_p_drop(scores[r : r + 1], top_p))
        assert torch.equal(_top_p_drop(scores.reshape(2, -1, scores.shape[-1]), top_p),
                           _hf_top_p_drop(scores, top_p).reshape(2, -1, scores.shape[-1]))


def test_probs_and_filters():
    scores = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    w = Warp(1.0, top_k=2)
    assert w.filters and not Warp(1.0).filters and not Warp(1.0, top_p=1.0, min_p=0.0).filters
    p = w.probs(scores)
    assert p[0, 2:].tolist() == [0.0, 0.0]
    torch.testing.assert_close(p.sum(), torch.tensor(1.0))


def test_keyed_sampler_never_draws_a_dropped_token():
    scores = torch.randn(64, 50, generator=torch.Generator().manual_seed(0))
    warped = Warp(1.0, top_k=3).logits(scores)
    drawn = KeyedSampler(1).sample(warped, torch.arange(64))
    kept = torch.topk(scores, 3, dim=-1).indices
    assert (kept == drawn[:, None]).any(dim=-1).all()


@pytest.mark.parametrize("sampler", [KeyedSampler(1), GeneratorSampler(torch.Generator().manual_seed(1))],
                         ids=["keyed", "generator"])
def test_samplers_draw_only_kept_tokens_of_warped_logits(sampler):
    """Both samplers take warped logits with -inf entries (top-k / top-p / min-p drops) and never draw one."""
    scores = torch.randn(64, 50, generator=torch.Generator().manual_seed(0)) * 2
    for warp in (Warp(1.0, top_k=3), Warp(0.7, top_p=0.5), Warp(1.3, min_p=0.2), Warp(1.0, top_k=5, top_p=0.6)):
        warped = warp.logits(scores)
        for _ in range(5):
            drawn = sampler.sample(warped, torch.arange(64))
            assert torch.isfinite(warped.gather(1, drawn[:, None])).all()


def test_a_warp_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Warp(1.0).top_k = 3


@pytest.mark.parametrize("kwargs, field", [
    (dict(temperature=0), "temperature"), (dict(temperature=-1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_k=0), "top_k"), (dict(top_k=1.5), "top_k"), (dict(top_k=True), "top_k"),
    (dict(top_p=-0.1), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_p=float("nan")), "top_p"),
    (dict(top_p="0.9"), "top_p"),
    (dict(min_p=-0.1), "min_p"), (dict(min_p=2), "min_p"),
])
def test_bad_values_are_named(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Warp(**({"temperature": 1.0} | kwargs))
