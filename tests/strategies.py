"""The project's hypothesis strategies: the installed kit (:mod:`dartree.testing.strategies`)."""

from dartree.testing.strategies import blocks, config_for, heads, random_logits, trees

__all__ = ["blocks", "config_for", "heads", "random_logits", "trees"]
