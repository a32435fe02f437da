"""Argument values as plain Python numbers: what every public check reads before it validates."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["plain_scalar"]


def plain_scalar(value: object) -> object:
    """A numpy scalar or a 0-d tensor as the Python ``int`` / ``float`` it holds (a bool stays a bool, and is
    refused by the checks that follow, as Python's ``True`` is); anything else unchanged."""
    if isinstance(value, torch.Tensor) and value.ndim == 0:
        return value.item()
    if isinstance(value, np.generic) and not isinstance(value, np.bool_):
        return value.item()
    return value
