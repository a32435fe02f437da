"""Test utilities for users checking their own drafters, heads and builders the way our tests do."""

from dartree.testing.drafter import OracleDrafter as OracleDrafter  # re-export
from dartree.testing.heads import IdentityHead, PathHashHead

__all__ = ["IdentityHead", "PathHashHead"]
