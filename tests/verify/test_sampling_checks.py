"""What a custom sampler returns is checked where it enters; the temperature rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dartree.verify import GeneratorSampler, KeyedSampler, verify_sampled
from dartree.verify.sampling import MAX_TEMPERATURE, MIN_TEMPERATURE, check_temperature, sample_checked
from dartree.verify.warp import Warp
from tests.verify.helpers import make_tree

V = 7
TREE = make_tree([([3, 1, 2], [-1, 0, 0])])


class Returns:
    def __init__(self, value) -> None:
        self.value = value

    def sample(self, logits, positions):
        return self.value


@pytest.mark.parametrize("value,message", [
    (torch.tensor([[1, 7, 0]]), r"returned token ids \[7\] outside the vocabulary \[0, 7\)"),
    (torch.tensor([[1, -2, 0]]), r"returned token ids \[-2\] outside the vocabulary"),
    ([[1, 2, 0]], r"returned list, expected an int64 tensor of shape \[1, 3\]"),
    (torch.tensor([1, 2, 0]), r"returned shape \[3\], expected \[1, 3\]"),
    (torch.tensor([[1.0, 2.0, 0.0]]), r"returned a torch.float32 tensor, expected integer token ids"),
    (torch.tensor([[True, False, True]]), r"returned a torch.bool tensor"),
    (torch.tensor([[1, 2, 0]], device="meta"), r"returned a tensor on meta, logits are on cpu"),
])
def test_bad_sampler_output_is_refused(value, message: str) -> None:
    with pytest.raises(ValueError, match=rf"^sampler: Returns.sample {message}"):
        verify_sampled(TREE, torch.randn(1, 3, V), 1.0, Returns(value))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32])
def test_small_integer_ids_are_compared_with_the_vocabulary_in_int64(dtype) -> None:
    """In uint8 / int16, ``ids >= V`` would wrap V (4098 is 2 in uint8): a valid id was refused."""
    vocab = 40000 if dtype != torch.uint8 else 4098
    ok = 200 if dtype == torch.uint8 else 25000
    out = sample_checked(Returns(torch.tensor([[ok]], dtype=dtype)), torch.randn(1, 1, vocab), torch.zeros(1, 1))
    assert out.dtype == torch.int64 and out.tolist() == [[ok]]
    if dtype != torch.uint8:
        with pytest.raises(ValueError, match=r"returned token ids \[-3\] outside the vocabulary"):
            sample_checked(Returns(torch.tensor([[-3]], dtype=dtype)), torch.randn(1, 1, vocab), torch.zeros(1, 1))


def test_good_custom_output_is_accepted_and_widened() -> None:
    out = sample_checked(Returns(torch.tensor([[1, 6, 0]], dtype=torch.int32)), torch.randn(1, 3, V),
                         torch.zeros(1, 3, dtype=torch.int64))
    assert out.dtype == torch.int64 and out.tolist() == [[1, 6, 0]]
    res = verify_sampled(TREE, torch.randn(1, 3, V), 1.0, Returns(torch.tensor([[2, 5, 0]], dtype=torch.int32)))
    assert res.tokens[0, :2].tolist() == [2, 0]      # root pick 2 -> node 2, its pick 0 is the bonus


def test_builtin_samplers_pass_through() -> None:
    logits = torch.randn(2, 3, V)
    positions = torch.arange(6).reshape(2, 3)
    keyed = KeyedSampler(3)
    assert torch.equal(sample_checked(keyed, logits, positions), keyed.sample(logits, positions))
    assert sample_checked(GeneratorSampler(torch.Generator().manual_seed(0)), logits, positions).shape == (2, 3)


@pytest.mark.parametrize("t", [0, 0.0, MIN_TEMPERATURE, 0.7, 1, MAX_TEMPERATURE, np.float32(0.5), torch.tensor(2.0)])
def test_allowed_temperatures(t) -> None:
    assert check_temperature(t) == float(t)
    assert isinstance(check_temperature(t), float)


@pytest.mark.parametrize("t", [1e300, 1e5, 2**20])
def test_a_temperature_where_float32_logits_tie_is_refused(t) -> None:
    """At T=1e300 ``logits / T`` is 0 everywhere: top-k kept every token (rank 4005 drawn with top_k=2)."""
    with pytest.raises(ValueError, match=r"^temperature: .* above the largest allowed 10000"):
        check_temperature(t)
    with pytest.raises(ValueError, match=r"^temperature:"):
        Warp(t, top_k=2)


@pytest.mark.parametrize("t", [1e-300, 1e-39, 5e-7])
def test_temperature_too_small_is_refused_not_the_lowest_token(t: float) -> None:
    with pytest.raises(ValueError, match=r"^temperature: .* below the smallest allowed 1e-06 .*use 0 for greedy"):
        check_temperature(t)
    with pytest.raises(ValueError, match=r"^temperature:"):
        verify_sampled(TREE, torch.randn(1, 3, V), t, KeyedSampler(0))


@pytest.mark.parametrize("t", [-1.0, float("nan"), float("inf"), "0.5", None, True, 1j, 2**2000, -2**2000])
def test_temperature_of_the_wrong_kind_is_refused(t) -> None:
    with pytest.raises(ValueError, match=r"^temperature: expected 0 \(greedy\) or a finite number >= 1e-06"):
        check_temperature(t)


def test_smallest_temperature_is_greedy_not_the_lowest_id() -> None:
    """At MIN_TEMPERATURE, logits / T stays finite, so sampling picks the argmax (gaps >= 1e-3 here)."""
    logits = torch.tensor([[[0.0, 3.0, 2.999, -1.0, 1.0, 0.5, 2.0], [5.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                            [-3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0]]])
    for sampler in (KeyedSampler(1), GeneratorSampler(torch.Generator().manual_seed(1))):
        picks = sample_checked(sampler, logits.float() / MIN_TEMPERATURE, torch.arange(3)[None])
        assert picks.tolist() == [[1, 0, 6]]
