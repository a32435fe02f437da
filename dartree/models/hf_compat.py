"""The KV-cache keyword across transformers 5.x: ``cache=`` (5.2x on; ``past_key_values`` is its deprecated alias
there) or ``past_key_values=`` (earlier 5.x releases, e.g. 5.17, which the GPU image ships: docs/gpu-check.md)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["cache_kwargs", "parameters"]


@functools.lru_cache(maxsize=64)
def _parameters(fn: Callable) -> frozenset[str] | None:
    try:
        return frozenset(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def parameters(fn: Callable) -> frozenset[str] | None:
    """The parameter names of ``fn`` (a bound method: its function's), cached; ``None`` without a signature."""
    return _parameters(getattr(fn, "__func__", fn))


def cache_kwargs(fn: Callable, cache: Any) -> dict[str, Any]:
    """``{"cache": cache}`` or ``{"past_key_values": cache}``: what ``fn`` (a model's ``forward``, or
    ``create_causal_mask``) takes (no signature: the current name)."""
    params = parameters(fn) or frozenset()
    return {"cache" if "cache" in params or "past_key_values" not in params else "past_key_values": cache}
