"""The fast backend: the registry's fast builders (:mod:`dartree.fast.builders`) and the hot operations
with their one dispatch point (:mod:`dartree.fast.ops`).  See docs/kernels.md."""
