"""Deferred input checks of the fast builders on devices where reading a flag is a host sync.

A CUDA build must not sync per depth, yet NaN from a head or too few finite logits must still be an error:
checks :func:`defer` a bool tensor (True = bad) and a message, and ``TreeBuilder.build`` reads all flags of a
build in ONE sync at its end (:func:`collect`), raising the first message set.  Outside a scope (a builder
function called directly, e.g. to prove a build makes no sync) the flags are dropped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor

__all__ = ["collect", "defer"]

_scopes: list[list[tuple[Tensor, str]]] = []


def defer(flag: Tensor, message: str) -> None:
    """Record ``flag`` (a bool tensor; any True means bad) to be checked at the end of the build."""
    if _scopes:
        _scopes[-1].append((flag.reshape(-1).any(), message))


@contextlib.contextmanager
def collect() -> Iterator[None]:
    """Run a build; at its end read every deferred flag at once and raise ``ValueError`` if one is set."""
    scope: list[tuple[Tensor, str]] = []
    _scopes.append(scope)
    try:
        yield
    finally:
        _scopes.pop()
    if scope:
        bad = torch.stack([f for f, _ in scope]).tolist()  # sync, once per build (see the module doc)
        for (_, message), hit in zip(scope, bad, strict=True):
            if hit:
                raise ValueError(message)
