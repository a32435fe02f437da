"""Fast builders: the registry's nine strategies, each with the signature, config and trees (same nodes, order
and float32 scores) of :mod:`dartree.ref.builders`.  The first six are dispatched by
:func:`dartree.fast.ops.builders` (compiled host builders or tensorized ones); ``sequential-heap``
(:mod:`dartree.fast.heap`: one host round trip per pop) and the Sequoia pair (:mod:`dartree.fast.sequoia`:
a static shape) run on every device."""

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
