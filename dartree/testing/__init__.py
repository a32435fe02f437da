"""Test utilities for users checking their own drafters, heads and builders the way our tests do.

* :func:`check_builder`: the builder contract (valid, decodable, within budget, deterministic, fast == ref,
  lossless decoding) as one call, ``check_builder("my-builder")`` in a pytest test;
* :mod:`dartree.testing.strategies`: the hypothesis strategies dartree's property tests draw from;
* :class:`OracleDrafter`: a drafter proposing the target's own continuation with controllable noise;
* :class:`PathHashHead`, :class:`IdentityHead`: deterministic correction heads.
"""

from dartree.testing.contract import check_builder
from dartree.testing.drafter import OracleDrafter
from dartree.testing.heads import IdentityHead, PathHashHead

__all__ = ["IdentityHead", "OracleDrafter", "PathHashHead", "check_builder", "strategies"]


def __getattr__(name: str):
    if name == "strategies":                   # needs hypothesis (the ``test`` extra): imported on first use
        import importlib

        return importlib.import_module("dartree.testing.strategies")
    raise AttributeError(f"module 'dartree.testing' has no attribute {name!r}")
