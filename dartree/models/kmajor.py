"""perf: ``F.linear`` on the CPU from a K-major copy of the weight, from the row count where that is bit-identical
(:func:`exact_from`).  Why and where: docs/verification.md, "The lean forward".
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["KMAJOR_LIMIT_BYTES", "derived", "exact_from", "kmajor_allowed", "kmajor_copy", "kmajor_product", "linear",
           "linear_bytes", "tensor_version"]

#: most bytes of linear weights a model may have for :func:`linear` to keep K-major copies of them
KMAJOR_LIMIT_BYTES = 1 << 30

#: row counts the probe compares (the kernels switch at small counts; larger ones are spot-checked)
_PROBE_ROWS = (*range(1, 33), 40, 48, 64, 96, 128, 192, 256)
_FROM: dict[tuple, int | None] = {}


def exact_from(in_features: int, out_features: int, dtype: torch.dtype, bias: bool = False) -> int | None:
    """Smallest row count from which the K-major product equals ``F.linear`` bit for bit on this CPU (every
    probed count from there on agrees), or ``None``; probed once per shape and dtype with seeded data."""
    key = (in_features, out_features, dtype, bias)
    if key in _FROM:
        return _FROM[key]
    gen = torch.Generator().manual_seed(in_features * 7919 + out_features)
    w = torch.randn(out_features, in_features, generator=gen).to(dtype)
    b = torch.randn(out_features, generator=gen).to(dtype) if bias else None
    x = torch.randn(_PROBE_ROWS[-1], in_features, generator=gen).to(dtype)
    wt = w.t().contiguous()
    start: int | None = None
    with torch.no_grad():
        for rows in _PROBE_ROWS:
            mine = x[:rows] @ wt if b is None else torch.addmm(b, x[:rows], wt)
            if not torch.equal(mine, F.linear(x[:rows], w, b)):
                start = None
            elif start is None:
                start = rows
    _FROM[key] = start
    return start


def linear_bytes(module: nn.Module) -> int:
    """Bytes of the weights of every ``nn.Linear`` in ``module``."""
    return sum(m.weight.numel() * m.weight.element_size() for m in module.modules() if isinstance(m, nn.Linear))


def kmajor_allowed(module: nn.Module, limit: int = KMAJOR_LIMIT_BYTES) -> bool:
    """Whether :func:`linear` should keep K-major copies for ``module``'s weights: on the CPU, and only
    while their bytes stay within ``limit`` (the copies double them)."""
    param = next(module.parameters(), None)
    return param is not None and param.device.type == "cpu" and linear_bytes(module) <= limit


def tensor_version(x: Tensor) -> int | None:
    """``x._version`` (bumped by every in-place write), or ``None`` for an inference tensor (made under
    ``torch.inference_mode``, e.g. weights loaded there), which keeps no counter and cannot be written
    in place outside inference mode: caches keyed on it then rely on identity and storage address."""
    return None if x.is_inference() else x._version


def derived(owner: object, slot: str, sources: list[Tensor | None], build):
    """perf: ``build()`` (a tensor derived from the tensors ``sources``), cached on ``owner`` under
    ``slot`` and rebuilt when any source is replaced, moved, cast or edited in place (checked by
    identity, storage address and version counter; a strong reference is kept, so a new tensor can
    never alias a cached one).  Never registered: state_dicts and checkpoints are unchanged.
    """
    cache = owner.__dict__.get(slot)
    if cache is not None and len(cache[0]) == len(sources):
        # perf: compared in place, no key built for a hit (a build looks up several derived tensors a call); the
        # same tensor (identity) is an inference tensor or not as when held, so a held version of None (an
        # inference tensor) needs no version read, and any other is compared to ``w._version``
        for held, w in zip(cache[0], sources, strict=False):     # the lengths are equal (checked above)
            if held is None:
                if w is not None:
                    break
            elif held[0] is not w or held[1] != w.data_ptr() or (held[2] is not None and held[2] != w._version):
                break
        else:
            return cache[1]
    key = [None if w is None else (w, w.data_ptr(), tensor_version(w)) for w in sources]
    with torch.no_grad():
        value = build()
    owner.__dict__[slot] = (key, value)
    return value


#: id(weight) -> (weakref to it, storage address, version, its K-major copy): one copy per weight in
#: the process, shared by every caller (the target's LM head and the drafter's are one tensor)
_COPIES: dict[int, tuple[weakref.ref, int, int | None, Tensor]] = {}


def kmajor_copy(weight: Tensor) -> Tensor:
    """``weight.t().contiguous()``, made once per weight tensor in the process and shared, rebuilt when
    the weight's storage changes or it is written in place (its version), freed with the weight."""
    key, version = id(weight), tensor_version(weight)
    entry = _COPIES.get(key)
    if entry is not None and entry[0]() is weight and entry[1] == weight.data_ptr() and entry[2] == version:
        return entry[3]
    with torch.no_grad():
        copy = weight.detach().t().contiguous()
    _COPIES[key] = (weakref.ref(weight, lambda _, key=key: _COPIES.pop(key, None)), weight.data_ptr(), version, copy)
    return copy


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, copy: bool = True) -> Tensor:
    """``F.linear(x, weight, bias)`` bit for bit; on the CPU from the K-major copy (:func:`kmajor_copy`) when ``x``
    has enough rows for the same bits (:func:`exact_from`).  ``copy=False``, or autograd, is plain ``F.linear``.
    Shape: x ``[..., in]``; weight ``[out, in]``; bias ``[out]`` -> ``[..., out]``."""
    if not copy or x.device.type != "cpu" or x.dtype != weight.dtype or (
            torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad)):
        return F.linear(x, weight, bias)
    k = x.shape[-1]
    start = exact_from(k, weight.shape[0], weight.dtype, bias is not None)
    if start is None or x.numel() < start * k:
        return F.linear(x, weight, bias)
    return kmajor_product(x, weight, bias)


def kmajor_product(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.t() (+ bias)`` from :func:`kmajor_copy`, unconditionally: the fast path of :func:`linear`,
    for a caller that has made its checks once (bit for bit ``F.linear`` only from :func:`exact_from` rows)."""
    wt = kmajor_copy(weight)
    if bias is None:
        return x @ wt
    return torch.addmm(bias, x.reshape(-1, wt.shape[0]), wt).view(*x.shape[:-1], wt.shape[1])
