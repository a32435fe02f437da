"""Fast builders: the registry's nine strategies, the first seven dispatched per device by :mod:`dartree.fast.ops`.

Same signature, config and output as :mod:`dartree.ref.builders` (``fn(block, head, config) ->
DraftTree``); the trees are identical (same nodes, same order, same float32 scores).  Inputs are
validated by :class:`dartree.builders.TreeBuilder`.

- CPU tensors: :mod:`dartree.fast.host_builders` (numpy and a Python heap on the host);
- every other device, or a forced kernel backend: :mod:`dartree.fast.tensor_builders` (tensorized,
  no host synchronisation inside a build);
- ``sequential-heap``: :mod:`dartree.fast.heap` on every device (sequential by nature: one host
  round trip per pop).
- ``sequoia`` / ``corrected-sequoia``: :mod:`dartree.fast.sequoia` on every device (a static shape: one
  gather; with a head, one head call, one sort and one advance per depth, batched over rows and nodes).
"""

from __future__ import annotations

from dartree.block import DraftBlock
from dartree.fast import ops
from dartree.fast.heap import sequential_heap
from dartree.fast.sequoia import corrected_sequoia, sequoia
from dartree.protocols import CorrectionHead
from dartree.tree import DraftTree

__all__ = ["chain", "ddtree", "corrected_chain", "corrected_chain_ddtree", "sequential_heap", "dartree_fixed",
           "dartree_pruned", "sequoia", "corrected_sequoia"]


def _dispatched(name: str):
    """The strategy ``name`` of the builder module :func:`dartree.fast.ops.builders` picks for the block's
    logits (one module-level function per strategy: the registry trusts these by identity)."""
    def build(block: DraftBlock, head: CorrectionHead | None, config) -> DraftTree:
        return getattr(ops.builders(block.logits), name)(block, head, config)

    build.__name__ = build.__qualname__ = name
    return build


chain, corrected_chain, ddtree, corrected_chain_ddtree, dartree_fixed, dartree_pruned = (
    _dispatched(name) for name in ("chain", "corrected_chain", "ddtree", "corrected_chain_ddtree", "dartree_fixed",
                                   "dartree_pruned"))
