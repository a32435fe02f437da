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


def chain(block: DraftBlock, head: None, config) -> DraftTree:
    """DFlash: the argmax of the base logits at every depth (gamma draft nodes)."""
    return ops.builders(block.logits).chain(block, head, config)


def corrected_chain(block: DraftBlock, head: CorrectionHead, config) -> DraftTree:
    """Domino: a greedy chain, each depth re-scored by the head along the chain's own path."""
    return ops.builders(block.logits).corrected_chain(block, head, config)


def ddtree(block: DraftBlock, head: None, config) -> DraftTree:
    """DDTree: the top-B prefixes of the candidate trie under the base marginals."""
    return ops.builders(block.logits).ddtree(block, head, config)


def corrected_chain_ddtree(block: DraftBlock, head: CorrectionHead, config) -> DraftTree:
    """Head run along the corrected greedy chain; the DDTree top-B over those per-depth distributions."""
    return ops.builders(block.logits).corrected_chain_ddtree(block, head, config)


def dartree_fixed(block: DraftBlock, head: CorrectionHead, config) -> DraftTree:
    """DARTree (fixed): depth-wise batched expansion with quota ceil(remaining budget / remaining depths)."""
    return ops.builders(block.logits).dartree_fixed(block, head, config)


def dartree_pruned(block: DraftBlock, head: CorrectionHead, config) -> DraftTree:
    """DARTree (pruned): a supertree of width W per depth, then one global top-B by s_beta."""
    return ops.builders(block.logits).dartree_pruned(block, head, config)
