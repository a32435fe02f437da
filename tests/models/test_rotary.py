"""The compiled rotary embedding (dartree.models.rotary): torch's ops' bits and strides, and where it declines."""

import pytest
import torch

from dartree import native
from dartree.models.lean import _rotate
from dartree.models.rotary import rotate_heads

pytestmark = pytest.mark.skipif(native.lib() is None, reason="dartree._native is not built")


def torch_rotate(x, cos, sin):
    return _rotate(x.transpose(1, 2), cos.unsqueeze(1), sin.unsqueeze(1))


@pytest.mark.parametrize("b,m,heads,d", [(1, 17, 6, 64), (1, 1, 6, 64), (2, 5, 6, 64), (1, 200, 4, 128),
                                         (3, 1, 1, 8), (1, 33, 3, 2)])
def test_same_bits_and_strides_as_torch(b, m, heads, d):
    gen = torch.Generator().manual_seed(b * 1000 + m * 10 + d)
    x = torch.randn(b, m, heads, d, generator=gen) * 30
    cos, sin = torch.randn(b, m, d, generator=gen), torch.randn(b, m, d, generator=gen)
    want, got = torch_rotate(x, cos, sin), rotate_heads(x, cos, sin)
    assert got is not None and torch.equal(got, want) and got.stride() == want.stride() and got.shape == want.shape


def test_special_values_round_as_torch():
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 3.4e38, -3.4e38, 1e-45, -1e-45,
                             1.17e-38, 1.0, -1.0, 65504.0, 1e-20, 7.0, -2.5])
    d = specials.numel()
    x = torch.stack([specials.roll(i) for i in range(d)]).reshape(1, d, 1, d)     # every pair of values meets
    cos = torch.stack([specials.roll(3 * i + 1) for i in range(d)]).reshape(1, d, d)
    sin = torch.stack([specials.roll(5 * i + 2) for i in range(d)]).reshape(1, d, d)
    want, got = torch_rotate(x, cos, sin), rotate_heads(x, cos, sin)
    assert torch.equal(got.isnan(), want.isnan())
    same = got.isnan() | (got == want)
    assert bool(same.all()) and torch.equal(torch.signbit(got[~got.isnan()]), torch.signbit(want[~want.isnan()]))


def test_declines_what_it_does_not_compute():
    x, cos, sin = torch.randn(1, 4, 2, 8), torch.randn(1, 4, 8), torch.randn(1, 4, 8)
    assert rotate_heads(x.double(), cos.double(), sin.double()) is None                 # float32 only
    assert rotate_heads(x.transpose(1, 2).contiguous().transpose(1, 2), cos, sin) is None   # not contiguous
    assert rotate_heads(torch.randn(1, 4, 2, 7), torch.randn(1, 4, 7), torch.randn(1, 4, 7)) is None   # odd d
    assert rotate_heads(x, cos.unsqueeze(1), sin.unsqueeze(1)) is None                    # not one row per position
    assert rotate_heads(x, cos.double(), sin) is None
    assert rotate_heads(x[0], cos, sin) is None
    with torch.enable_grad():
        assert rotate_heads(x.requires_grad_(), cos, sin) is None                         # autograd keeps torch's ops
    with native.disabled():
        assert rotate_heads(x.detach(), cos, sin) is None
