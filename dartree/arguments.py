"""Argument values as plain Python numbers: what every public check reads before it validates."""

from __future__ import annotations

import operator
from collections.abc import Callable

import numpy as np
import torch

__all__ = ["check_int", "check_number", "index_arg", "plain_scalar"]


def plain_scalar(value: object) -> object:
    """A numpy scalar or a 0-d tensor as the Python ``int`` / ``float`` it holds (a bool stays a bool, and is
    refused by the checks that follow, as Python's ``True`` is); anything else unchanged."""
    if isinstance(value, torch.Tensor) and value.ndim == 0:
        return value.item()
    if isinstance(value, np.generic) and not isinstance(value, np.bool_):
        return value.item()
    return value


def index_arg(name: str, value: object) -> int:
    """``operator.index(value)`` (Python, numpy and 0-d integer tensor integers), never a bool."""
    if isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        raise ValueError(f"{name}: expected an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name}: expected an integer, got {type(value).__name__} {value!r}") from None


def check_int(name: str, value: object, low: int = 1, high: int | None = None, optional: bool = False) -> None:
    """``ValueError`` naming ``name`` unless ``value`` is a Python int (never a bool) in ``[low, high]``
    (``optional``: or ``None``): the one message of the library's integer arguments."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        span = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name}: expected an int {span}{' or None' if optional else ''}, got {value!r}")


def check_number(name: str, value: object, ok: Callable[[int | float], bool], expected: str) -> None:
    """``ValueError`` "``name``: ``expected``, got ``value``" unless ``value`` is an int or float (never a bool)
    with ``ok(value)`` (write ``ok`` so that NaN fails it): the one check of the library's number arguments."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not ok(value):
        raise ValueError(f"{name}: {expected}, got {value!r}")
