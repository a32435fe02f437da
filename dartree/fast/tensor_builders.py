"""Fast builders on every device but a CPU with ``dartree._native``, tensorized over rows and nodes, with no
host sync inside a build (deferred checks: :mod:`dartree.fast.checks`); the same trees as
:mod:`dartree.ref.builders`.

- ``chain`` / ``corrected-chain``: :func:`dartree.fast.core.expand` with width 1.
- ``ddtree`` / ``corrected-chain-ddtree``: a best-first heap over branch-independent per-depth distributions
  pops the global top-B of the candidate trie, which lies inside the supertree of widths ``B - d + 1``
  (:func:`dartree.fast.widths.beam_widths`): a depth-wise expansion plus one global top-B, no heap.
- ``dartree-fixed`` / ``dartree-pruned``: DARTree's Algorithm 1, one fused head call per depth.
"""

from __future__ import annotations

from dartree.block import DraftBlock
from dartree.fast.core import assemble, candidate_set, expand
from dartree.fast.widths import beam_widths, pruned_widths, quota_widths
from dartree.protocols import CorrectionHead
from dartree.tree import DraftTree

__all__ = ["chain", "ddtree", "corrected_chain", "corrected_chain_ddtree", "dartree_fixed", "dartree_pruned"]


def chain(block: DraftBlock, head: None, config) -> DraftTree:
    """DFlash: the argmax of the base logits at every depth (gamma draft nodes)."""
    cands = candidate_set(block, config.topk, config.normalize)
    return assemble(block, expand(block, cands, [1] * block.gamma, words=False), None, path=True)


def corrected_chain(block: DraftBlock, head: CorrectionHead, config) -> DraftTree:
    """Domino: a greedy chain, each depth re-scored by the head along the chain's own path."""
    cands = candidate_set(block, config.topk, config.normalize)
    return assemble(block, expand(block, cands, [1] * block.gamma, head=head, words=False), None,
                    path=True)


def ddtree(block: DraftBlock, head: None, config) -> DraftTree:
    """DDTree: the top-B prefixes of the candidate trie under the base marginals."""
    cands = candidate_set(block, config.topk, config.normalize)
    widths = beam_widths(config.budget, config.topk, block.gamma)
    return assemble(block, expand(block, cands, widths), config.budget)


def corrected_chain_ddtree(block: DraftBlock, head: CorrectionHead, config) -> DraftTree:
    """Head run along the corrected greedy chain; the DDTree top-B over those per-depth distributions."""
    cands = candidate_set(block, config.topk, config.normalize)
    chain_log_q = expand(block, cands, [1] * block.gamma, head=head, trace=True, words=False).log_q
    widths = beam_widths(config.budget, config.topk, block.gamma)
    return assemble(block, expand(block, cands, widths, log_q=chain_log_q), config.budget)


def dartree_fixed(block: DraftBlock, head: CorrectionHead, config) -> DraftTree:
    """DARTree (fixed): depth-wise batched expansion with quota ceil(remaining budget / remaining depths)."""
    cands = candidate_set(block, config.topk, config.normalize)
    widths = quota_widths(config.budget, config.topk, block.gamma)
    return assemble(block, expand(block, cands, widths, head=head), None)


def dartree_pruned(block: DraftBlock, head: CorrectionHead, config) -> DraftTree:
    """DARTree (pruned): a supertree of width W per depth, then one global top-B by s_beta."""
    cands = candidate_set(block, config.topk, config.normalize)
    widths = pruned_widths(config.width, config.topk, block.gamma)
    bound = config.budget if config.bound else None
    return assemble(block, expand(block, cands, widths, head=head, beta=config.beta, bound=bound), config.budget)
