"""perf (CPU): the rotary embedding of q and k as one compiled call (``dartree._native.rotate``), bit for
bit torch's ``x * cos + rotate_half(x) * sin``.

On one CPU thread those are five ATen ops (two slices aside: a negation, a concatenation, two products
and a sum), about 25 us on the 17 x 6 x 64 floats of a zoo tree forward and nearly as much on one
token's, where the work is nothing: a dispatch cost paid once per layer and forward.  Each element is
the same three roundings in C (``x * cos``, ``rotate_half(x) * sin``, their sum; the negation is
exact), so there is nothing to probe: the bits are the same by construction (tested on shapes and
special values).  The output is laid out as torch's ops lay it out (a transposed view of a
``[b, m, heads, d]`` tensor; contiguous for one position), so the ops after it see the same strides.

Which path this serves: the CPU only (float32, nothing autograd tracks).  Other devices and dtypes keep
torch's ops.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dartree import native

__all__ = ["rotate_heads"]

_F32 = torch.float32


def rotate_heads(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor | None:
    """``x.transpose(1, 2) * c + rotate_half(x.transpose(1, 2)) * s`` with ``c, s = cos.unsqueeze(1),
    sin.unsqueeze(1)``: the rotated heads ``[b, heads, m, d]``, or ``None`` where the compiled call does
    not apply (the caller runs torch's ops).

    Shape:
        x: ``[b, m, heads, d]`` contiguous (heads of the positions, as the projections give them);
        cos, sin: ``[b, m, d]`` contiguous (one table row per position) -> ``[b, heads, m, d]``.
    """
    lib = native.lib()
    if lib is None or not hasattr(lib, "rotate") or x.dim() != 4 or x.dtype is not _F32 or not x.is_cpu:
        return None
    b, m, heads, d = x.shape
    if d % 2 or cos.shape != (b, m, d) or sin.shape != (b, m, d) or not (
            x.is_contiguous() and cos.is_contiguous() and sin.is_contiguous()) or cos.dtype is not _F32 \
            or sin.dtype is not _F32 or not cos.is_cpu or not sin.is_cpu or x.numel() == 0:
        return None
    if torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad or sin.requires_grad):
        return None
    out = torch.empty_like(x)                   # [b, m, heads, d], contiguous as x is (checked above)
    # every check the C call relies on is above: float32, CPU, these shapes, contiguous (it takes pointers)
    lib.rotate(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), out.data_ptr(), b * m, heads, d)
    # torch's result for one position is contiguous [b, heads, 1, d]; for more, [b, m, heads, d] transposed
    return out.view(b, heads, 1, d) if m == 1 else out.transpose(1, 2)
