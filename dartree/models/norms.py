"""perf (CPU): float32 RMSNorm as one compiled call (``dartree._native.rms_norm``), bit for bit
``torch.rms_norm``.

On one CPU thread ``torch.rms_norm`` is about nine ATen ops (``x * x``, a sum, ``/ d``, ``+ eps``, the
reciprocal square root, two products): 13.5 us hot on 17 x 256 floats, about 20 us inside a decode,
where a zoo round runs some 30 of them (19 in a target forward, the rest in the drafter's).  The compiled
call computes the same IEEE operations in the same order, the sum as ATen's cascade sum does it
(``aten/src/ATen/native/cpu/SumKernel.cpp``) with its vector width.  Which width ATen's sum kernel has
on this CPU (8 lanes on the AVX-512 machines here: the sum is not dispatched to AVX-512) is not assumed:
:func:`lanes` compares both widths with ``torch.rms_norm`` once per process on rows of 16 to 5120
floats, with and without a weight, and the compiled call is used only with a width that gives its bits
on every probe (none: ``torch.rms_norm`` runs).

Which path this serves: the CPU only (float32, contiguous rows, nothing autograd tracks).  Other devices
and dtypes keep their ops.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dartree import native

__all__ = ["lanes", "rms_norm"]

#: row lengths the probe compares (short rows, one and several cascade levels, a scalar tail)
_PROBE_DIMS = (16, 64, 100, 128, 256, 1000, 2048, 5120)
_LANES: list[int | None] = []


def lanes() -> int | None:
    """The vector width with which the compiled RMSNorm gives ``torch.rms_norm``'s bits on this CPU
    (probed once per process), or ``None`` (not built, or neither width does)."""
    if not _LANES:
        lib = native.lib()
        found = None
        if lib is not None and hasattr(lib, "rms_norm"):
            gen = torch.Generator().manual_seed(20261201)
            with torch.no_grad():
                for width in (8, 16):
                    ok = True
                    for d in _PROBE_DIMS:
                        x = torch.randn(3, d, generator=gen) * 3
                        w = torch.randn(d, generator=gen)
                        for weight in (w, None):
                            out = torch.empty_like(x)
                            lib.rms_norm(x.numpy(), None if weight is None else weight.numpy(), out.numpy(), 3, d, 1,
                                         1e-6, width)
                            ok = ok and torch.equal(out, torch.rms_norm(x, (d,), weight, 1e-6))
                    if ok:
                        found = width
                        break
        _LANES.append(found)
    return _LANES[0]


def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor | None:
    """``torch.rms_norm(x, (d,), weight, eps)`` with ``weight`` ``[d]``, or ``torch.rms_norm(x, (d,), None,
    eps) * weight`` with ``weight`` ``[h, d]`` over the last two dims of ``x`` (per-head q / k norms);
    ``None`` where the compiled call does not apply (the caller runs torch's ops).

    perf: a few attribute reads and three numpy views around the C call (about 5 us hot on one thread;
    torch's ops are 12-16 us hot and about twice that inside a decode)."""
    width = _LANES[0] if _LANES else lanes()
    lib = native.lib()
    if width is None or lib is None or x.dtype != _F32 or x.device.type != "cpu" or not x.is_contiguous():
        return None
    shape = x.shape
    d = shape[-1] if shape else 0
    if d < width or torch.is_grad_enabled() and (x.requires_grad or weight is not None and weight.requires_grad):
        return None
    w_rows, w = 1, None
    if weight is not None:
        if weight.dtype != _F32 or weight.device.type != "cpu" or not weight.is_contiguous():
            return None
        w_shape = weight.shape
        if len(w_shape) == 2 and len(shape) >= 2 and w_shape == shape[-2:]:
            w_rows = w_shape[0]
        elif w_shape != (d,):
            return None
        w = weight.detach().numpy()
    out = torch.empty(shape, dtype=_F32)
    lib.rms_norm(x.numpy(), w, out.numpy(), x.numel() // d, d, w_rows, eps, width)
    return out


_F32 = torch.float32
