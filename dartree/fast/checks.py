"""Deferred input checks of the fast builders on devices where reading a flag is a host sync.

A fast build on CUDA must not synchronise per depth, yet NaN from a correction head or too few
finite logits must still be an error.  Such checks call :func:`defer` with a bool tensor (True =
bad) and a message; :meth:`dartree.builders.TreeBuilder.build` opens a :func:`collect` scope around
the build and reads all flags of the build in ONE synchronisation at its end, raising the first
message whose flag is set.  Outside a scope (an internal builder function called directly, e.g. to
prove that a build makes no host sync) the flags are dropped: the checks belong to ``build``.
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
