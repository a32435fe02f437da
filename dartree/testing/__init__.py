"""Test utilities for users checking their own drafters, heads and builders the way our tests do.

* :func:`check_builder`: the builder contract (valid, decodable, within budget, deterministic, fast == ref,
  lossless; with ``temperature=1`` the law of sampled decoding) as one call in a pytest test;
* :mod:`dartree.testing.strategies`: the hypothesis strategies of dartree's property tests;
* :class:`OracleDrafter` (the target's own continuation with controllable noise), :class:`SharpDrafter`
  (the target's law, sharpened; batch-native, for law tests);
* :mod:`dartree.testing.law`: exact target laws, one round's law by enumeration, a chi-square test;
* :class:`PathHashHead`, :class:`IdentityHead`: deterministic correction heads.
"""

from dartree.testing.contract import check_builder
from dartree.testing.drafter import OracleDrafter, SharpDrafter
from dartree.testing.heads import IdentityHead, PathHashHead

__all__ = ["IdentityHead", "OracleDrafter", "PathHashHead", "SharpDrafter", "check_builder", "strategies"]


def __getattr__(name: str):
    if name == "strategies":                   # needs hypothesis (the ``test`` extra): imported on first use
        import importlib

        return importlib.import_module("dartree.testing.strategies")
    raise AttributeError(f"module 'dartree.testing' has no attribute {name!r}")
