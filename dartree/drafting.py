"""Stages 1 and 2 of a round, draft and build, behind one interface: :class:`Drafting`.

``draft(roots)``: the drafter's block, or an earlier one that still serves (:class:`BlockReuse`: a static
shape, a head and one live row; the head proposes along the committed path until fewer than
``SequoiaConfig.reuse_depths`` depths are left, docs/verification.md).  ``build(block, roots, target)``: the
builder's tree (checked, cut to what the model holds), or a Sequoia builder's static shape with the
verifier's draws when the verifier redraws every token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dartree.block import DraftBlock
from dartree.builders import checked_tree, shape_of
from dartree.rounds import check_block, fit_tree
from dartree.tree import PAD, DraftTree
from dartree.verifiers import Verifier
from dartree.verify.rejection import HEAD_DEPTHS, SampledTree

__all__ = ["Drafting", "BlockReuse"]


class BlockReuse:
    """A drafted block kept across rounds of one live row (``None``: the next round drafts), the tokens committed
    ``since`` its root, and ``carry``: the head's state after the root and the first ``folded`` of them (lazily)."""

    def __init__(self, head, depths: int) -> None:
        self.head, self.depths = head, depths
        self.block: DraftBlock | None = None
        self.since: list[int] = []
        self.carry: Tensor | None = None
        self.folded = 0
        self.sampled: SampledTree | None = None     # the round's sampled tree (its head states along the path)

    def reusable(self, rows: int) -> DraftBlock | None:
        """The kept block if the next round (of ``rows`` live rows) reuses it, else ``None``."""
        block = self.block
        if block is None or rows != 1 or block.gamma - len(self.since) < self.depths:
            return None
        return block

    def keep(self, block: DraftBlock, rows: int) -> None:
        """A freshly drafted block: kept when one row is live."""
        if rows == 1:
            self.block, self.since, self.carry, self.folded = block, [], None, 0

    def drop(self) -> None:
        self.block, self.sampled = None, None

    def offset(self, block: DraftBlock) -> int:
        """Committed tokens between ``block``'s root and this round's root (0 for a fresh block)."""
        return len(self.since) if block is self.block else 0

    def carried(self, block: DraftBlock, offset: int) -> Tensor:
        """The head's state after the kept block's root and the ``offset`` tokens committed since ([1, S])."""
        head = self.head
        if self.carry is None:
            self.carry = head.initial_state(block)
        device = self.carry.device
        while self.folded < offset:
            token = torch.full((1, 1), self.since[self.folded], dtype=torch.int64, device=device)
            self.carry = head.advance(block, self.folded + 1, self.carry[:, None], token)[:, 0]
            self.folded += 1
        return self.carry

    def drew(self, sampled: DraftTree | SampledTree) -> None:
        """The round's tree, kept while a block is (its head states serve :meth:`committed`)."""
        self.sampled = sampled if self.block is not None and isinstance(sampled, SampledTree) else None

    def committed(self, accepted: list[int], kept: list[int], rows: int) -> None:
        """After the round: ``accepted`` the path's nodes, root first (then ``PAD``), ``kept`` the tokens committed;
        ``rows`` live rows (more than one: the block is dropped)."""
        if self.block is None:
            return
        if rows != 1:
            self.drop()
            return
        self._adopt(accepted, len(kept))
        self.since += kept

    def _adopt(self, accepted: list[int], kept: int) -> None:
        """Take the head's state after the deepest committed node of the round's path that has one (the sampled
        tree made it for that node's children) as the carried state: fewer ``advance`` calls in :meth:`carried`."""
        sampled, before = self.sampled, len(self.since)
        if sampled is None or sampled.states is None:
            return
        path = [u for u in accepted if u != PAD]
        made = sampled.host_lists()
        stated = sampled.stated[0].tolist() if made is None else made.stated[0]     # perf: no host read when made
        for j in range(min(len(path) - 1, kept), -1, -1):      # node path[j]'s state: after j committed tokens
            if before + j > self.folded and stated[path[j]]:
                self.carry, self.folded = sampled.states[0, path[j]][None].clone(), before + j
                return


class Drafting:
    """The draft and build stages of a speculative engine (module docstring).

    Args:
        drafter: the engine's batch drafter.
        builder, head: the tree builder and the timed head proxy it is given (``None`` without).
        verifier: the decode's verifier; one that redraws the tokens uses only a tree's shape (a trusted Sequoia
            builder's static shape, :func:`dartree.builders.shape_of`) and, with a head, block reuse.
    """

    def __init__(self, drafter, builder, head, verifier: Verifier) -> None:
        self.drafter, self.builder, self.head, self.verifier = drafter, builder, head, verifier
        config = getattr(builder, "config", None)
        # where the head proposes under a redrawing verifier: a Sequoia config says, else HEAD_DEPTHS
        self.head_depths = getattr(config, "head_depths", HEAD_DEPTHS)
        # the proposal's temperature over the run's under a redrawing verifier: a Sequoia config says, else the run's
        self.proposal_temperature = getattr(config, "proposal_temperature", 1.0)
        self.shape = shape_of(builder) if verifier.redraws else None
        depths = getattr(config, "reuse_depths", 0) if self.shape is not None and head is not None else 0
        self.reuse = BlockReuse(head, depths) if depths else None

    def draft(self, roots: Tensor, vocab_size: int) -> DraftBlock:
        """Stage 1: the block for every live row (``roots`` int64 ``[b]``): a kept one, or the drafter's (checked
        against the roots it was given)."""
        rows = roots.shape[0]
        if self.reuse is not None:
            block = self.reuse.reusable(rows)
            if block is not None:
                return block
        block = self.drafter.draft_rows(roots)
        check_block(block, roots, vocab_size, rows=rows)
        if self.reuse is not None:
            self.reuse.keep(block, rows)
        return block

    def build(self, block: DraftBlock, roots: Tensor, target) -> DraftTree | SampledTree:
        """Stage 2: the tree for ``block`` (a user builder's tree checked before the target sees it), cut to what
        the model can hold, with the verifier's draws."""
        reuse = self.reuse
        offset = reuse.offset(block) if reuse is not None else 0
        if self.shape is not None:
            tree = self.shape(block, block.gamma - offset, roots)
        else:
            tree = checked_tree(self.builder, self.builder.build(block, self.head), block)
        tree = fit_tree(tree, block.gamma - offset, target)
        if not self.verifier.redraws:
            return tree
        carry = reuse.carried(block, offset) if offset else None
        drawn = self.verifier.draw(tree, block, self.head, head_depths=self.head_depths, offset=offset,
                                   root_state=carry, proposal_temperature=self.proposal_temperature)
        if reuse is not None:
            reuse.drew(drawn)
        return drawn

    def committed(self, accepted: list[int], kept: list[int], rows: int) -> None:
        """One row's outcome of the round (``rows`` live rows): block reuse's bookkeeping."""
        if self.reuse is not None:
            self.reuse.committed(accepted, kept, rows)

    def new_rows(self) -> None:
        """Rows joined: the next round drafts."""
        if self.reuse is not None:
            self.reuse.drop()
