"""The compiled float32 RMSNorm (:mod:`dartree.models.norms`) against ``torch.rms_norm`` bit for bit."""

from __future__ import annotations

import math

import pytest
import torch

from dartree import native
from dartree.models import norms

needs_native = pytest.mark.skipif(norms.lanes() is None, reason="needs dartree._native with torch's sum width")


@needs_native
@pytest.mark.parametrize("d", [8, 16, 63, 64, 100, 256, 513, 1000, 2048, 4100, 8192])
def test_rows_of_every_length_are_torchs_bit_for_bit(d):
    """Short rows, the scalar tail, several vectors, and the cascade levels of long rows (from 512 floats)."""
    if d < norms.lanes():
        pytest.skip("shorter than a vector: torch's ops run")
    gen = torch.Generator().manual_seed(d)
    for rows in (1, 3, 17):
        x = torch.randn(rows, d, generator=gen) * (1 + d % 7)
        w = torch.randn(d, generator=gen)
        for eps in (1e-6, 1e-5, 0.1):
            assert torch.equal(norms.rms_norm(x, w, eps), torch.rms_norm(x, (d,), w, eps))
            assert torch.equal(norms.rms_norm(x, None, eps), torch.rms_norm(x, (d,), None, eps))


@needs_native
def test_per_head_weights_special_values_and_shapes():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 17, 6, 64, generator=gen)
    w = torch.randn(6, 64, generator=gen)
    assert torch.equal(norms.rms_norm(x, w, 1e-6), torch.rms_norm(x, (64,), None, 1e-6) * w)
    special = torch.randn(5, 256, generator=gen)
    special[0] = 0.0                                                   # sum 0: r = 1 / sqrt(eps)
    special[1, 3] = math.inf
    special[2, 7] = math.nan
    special[3] *= 1e19                                                 # squares overflow to inf
    special[4] *= 1e-23                                                # squares underflow to subnormals / 0
    got, want = norms.rms_norm(special, None, 1e-6), torch.rms_norm(special, (256,), None, 1e-6)
    assert torch.equal(got.nan_to_num(), want.nan_to_num()) and torch.equal(got.isnan(), want.isnan())
    empty = torch.empty(0, 256)
    assert norms.rms_norm(empty, None, 1e-6).shape == (0, 256)


def test_declined_where_it_does_not_apply():
    """Not contiguous, not float32, tracked by autograd, shorter than a vector, a weight of another shape,
    or the extension off: ``None`` (the caller runs torch's ops)."""
    x = torch.randn(4, 64)
    w = torch.randn(64)
    assert norms.rms_norm(x.t(), None, 1e-6) is None
    assert norms.rms_norm(x.double(), None, 1e-6) is None
    assert norms.rms_norm(x, torch.randn(32), 1e-6) is None
    assert norms.rms_norm(x, w[::2].repeat(2)[::1].reshape(2, 32).t(), 1e-6) is None
    assert norms.rms_norm(torch.randn(4, 4), None, 1e-6) is None
    assert norms.rms_norm(x.requires_grad_(), w, 1e-6) is None
    with native.disabled():
        assert norms.rms_norm(torch.randn(4, 64), None, 1e-6) is None
