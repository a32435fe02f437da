"""The KV-cache keyword across transformers 5.x: ``cache=`` (5.2x on; ``past_key_values`` is its deprecated alias
there) or ``past_key_values=`` (earlier 5.x releases, e.g. 5.17, which the GPU image ships: docs/gpu-check.md)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["cache_kwargs"]


@functools.lru_cache(maxsize=64)
def _keyword(fn: Callable) -> str:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):           # no signature: the current name
        return "cache"
    return "cache" if "cache" in params or "past_key_values" not in params else "past_key_values"


def cache_kwargs(fn: Callable, cache: Any) -> dict[str, Any]:
    """``{"cache": cache}`` or ``{"past_key_values": cache}``: what ``fn`` (a model's ``forward``, or
    ``create_causal_mask``) takes."""
    return {_keyword(getattr(fn, "__func__", fn)): cache}
