"""dartree.models.pointwise: torch's RMSNorm and HF's rotary embedding in fewer ops, bit for bit."""

from __future__ import annotations

import pytest
import torch

from dartree.models.pointwise import rms_norm, rotate, rotate_signed, signed_sin


@pytest.mark.parametrize("shape", [(1, 1, 256), (1, 17, 256), (3, 5, 64), (1, 17, 6, 64), (2, 9, 3, 128), (4, 7)])
@pytest.mark.parametrize("eps", [1e-6, 1e-5])
def test_rms_norm_is_torchs_bit_for_bit(shape, eps):
    g = torch.Generator().manual_seed(sum(shape))
    for scale in (1e-4, 1e-2, 1.0, 50.0, 3e3):
        x = torch.randn(*shape, generator=g) * scale
        w = torch.randn(shape[-1], generator=g)
        heads = torch.randn(*shape[-2:], generator=g)
        with torch.inference_mode():
            assert torch.equal(rms_norm(x, w, eps), torch.rms_norm(x, (shape[-1],), w, eps))
            assert torch.equal(rms_norm(x, heads, eps), torch.rms_norm(x, (shape[-1],), None, eps) * heads)
            assert torch.equal(rms_norm(x, None, eps), torch.rms_norm(x, (shape[-1],), None, eps))
        # non-contiguous input, and outside inference mode
        t = x.transpose(0, -2) if x.dim() > 2 else x.t().contiguous().t()
        assert torch.equal(rms_norm(t, w, eps), torch.rms_norm(t, (shape[-1],), w, eps))


def test_rms_norm_keeps_autograd():
    x = torch.randn(3, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    rms_norm(x, w, 1e-6).sum().backward()
    assert x.grad is not None and w.grad is not None


@pytest.mark.parametrize("shape", [(1, 6, 1, 64), (1, 6, 17, 64), (3, 4, 9, 128), (2, 2, 5, 32)])
def test_rotate_signed_is_hfs_rotation_bit_for_bit(shape):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    b, h, m, d = shape
    g = torch.Generator().manual_seed(sum(shape))
    for scale in (1e-3, 1.0, 100.0):
        x = (torch.randn(b, m, h, d, generator=g) * scale).transpose(1, 2)        # as the forwards pass it
        y = torch.randn(b, h, m, d, generator=g) * scale
        pos = torch.randint(0, 30000, (b, m), generator=g).float()
        angles = pos[..., None] * (1e4 ** (-torch.arange(0, d // 2) * 2 / d))
        emb = torch.cat([angles, angles], -1)
        cos, sin = emb.cos(), emb.sin()
        want_x, want_y = apply_rotary_pos_emb(x, y, cos, sin)
        s = signed_sin(sin)[:, None]
        assert torch.equal(rotate_signed(x, cos[:, None], s), want_x)
        assert torch.equal(rotate_signed(y, cos[:, None], s), want_y)
        assert torch.equal(rotate(x, cos[:, None], sin[:, None]), want_x)
        if m > 1:                                                              # the same layout as HF's
            assert rotate_signed(x, cos[:, None], s).stride() == want_x.stride()
