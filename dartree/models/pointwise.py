"""perf: RMSNorm and the rotate-half rotary embedding in fewer torch ops, bit for bit torch's own.

On the CPU a small model's norms and rotations are dispatch-bound: ``torch.rms_norm`` dispatches nine ATen
ops and HF's ``x * cos + rotate_half(x) * sin`` five.  :func:`rms_norm` runs the same arithmetic in six (the
square as ``x * x``, mean and epsilon as one ``addcdiv`` from cached 0-dim tensors), :func:`rotate_signed` in
three (``roll`` and the sign folded into :func:`signed_sin`).  Every element sees the same float32 operations
in the same order (no fused multiply-add, whose bits differ), so the bits are equal (tests/models/test_pointwise.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["rms_norm", "rotate", "rotate_signed", "signed_sin"]

_CONSTANTS: dict[tuple, tuple[Tensor, Tensor]] = {}


def _constants(eps: float, n: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """0-dim CPU tensors ``eps`` and ``n`` in ``dtype`` (what ATen's wrapped scalars become), cached."""
    key = (eps, n, dtype)
    found = _CONSTANTS.get(key)
    if found is None:
        if len(_CONSTANTS) >= 256:
            _CONSTANTS.clear()
        found = _CONSTANTS[key] = (torch.tensor(eps, dtype=dtype), torch.tensor(float(n), dtype=dtype))
    return found


def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """``torch.rms_norm(x, (x.shape[-1],), None, eps) * weight`` bit for bit (``weight`` broadcast over the last
    dims, e.g. per-head ``[heads, D]``; ``None``: no scale); with a 1-D ``weight`` also ``torch.rms_norm(x, (D,),
    weight, eps)``.  perf: float32 on the CPU, ATen's composite by hand; elsewhere torch's own call.  No autograd."""
    if x.dtype != torch.float32 or x.device.type != "cpu" or torch.is_grad_enabled() and (
            x.requires_grad or weight is not None and weight.requires_grad):
        if weight is not None and weight.dim() == 1:
            return torch.rms_norm(x, (x.shape[-1],), weight, eps)
        out = torch.rms_norm(x, (x.shape[-1],), None, eps)
        return out if weight is None else out * weight
    e, n = _constants(eps, x.shape[-1], x.dtype)
    scale = torch.addcdiv(e, torch.sum(x * x, -1, keepdim=True), n).rsqrt_()     # rsqrt(mean(x ** 2) + eps)
    out = x * scale
    return out if weight is None else out.mul_(weight)


def signed_sin(sin: Tensor) -> Tensor:
    """``sin`` with its first half negated: the table :func:`rotate_signed` takes."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def rotate_signed(x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
    """``x * cos + rotate_half(x) * sin`` (HF's ``apply_rotary_pos_emb``) bit for bit, given
    ``sin_signed = signed_sin(sin)``: ``rotate_half(x) = cat(-x2, x1)``, and ``-x2 * s1 = x2 * -s1``
    exactly, so ``rotate_half(x) * sin`` is ``roll(x, D / 2) * sin_signed``; the sum is formed as HF's
    (``x * cos`` plus that product; fp addition commutes bit for bit).  Without autograd only."""
    return (x * cos).add_(x.roll(x.shape[-1] // 2, -1).mul_(sin_signed))


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x * cos + rotate_half(x) * sin`` as HF computes it (any autograd, any device)."""
    half = x.shape[-1] // 2
    return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)
