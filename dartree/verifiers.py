"""How a decode accepts draft tokens: one :class:`Verifier`, chosen once per decode (:func:`make_verifier`), owns
its acceptance rule and its draws: :class:`Greedy` (T=0), :class:`Match` (target-sample matching), :class:`Rejection`
and :class:`Traversal` (trees drawn from known proposals).  A round calls :meth:`Verifier.draw` (end of build) and
:meth:`Verifier.accept`, and asks :attr:`Verifier.walk` which logits the tree forward computes; the AR step calls
:meth:`Verifier.next_token`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

from dartree.block import DraftBlock
from dartree.models.target import HFTarget, TargetOutput
from dartree.rounds import VERIFIERS, Request, WalkRows, scored_rows
from dartree.tree import DraftTree
from dartree.verify.accept import (
    VerifyResult,
    verify_greedy,
    verify_sampled,
    walk_greedy,
    walk_sampled,
)
from dartree.verify.rejection import SampledTree, sample_tree, verify_rejection
from dartree.verify.sampling import GeneratorSampler, KeyedSampler, Sampler, sample_checked
from dartree.verify.traversal import verify_traversal
from dartree.verify.warp import Warp

__all__ = ["Verifier", "Greedy", "Match", "Rejection", "Traversal", "make_verifier"]

#: (rows, nodes) -> the target's logits at those nodes (the LM head run on demand, or a read of all logits)
NodeRows = Callable[[list[int], list[int]], Tensor]


class Verifier:
    """The acceptance rule of a decode and the draws it needs (module docstring)."""

    name: str = ""
    #: whether the tree's draft tokens are redrawn by :meth:`draw` (only the builder's shape is used)
    redraws: bool = False

    def __init__(self, walk: WalkRows | None = None) -> None:
        #: which logits the next tree forward computes ("root": the walk runs the LM head on the nodes it visits)
        self.walk = WalkRows(False) if walk is None else walk

    def draw(self, tree: DraftTree, block: DraftBlock, head=None, *, head_depths: int | None = None,
             offset: int = 0, root_state: Tensor | None = None,
             proposal_temperature: float = 1.0) -> DraftTree | SampledTree:
        """The tree the target verifies (build work): ``tree`` itself unless the verifier draws its tokens (at the
        run's temperature times ``proposal_temperature``)."""
        return tree

    def accept(self, drafted: DraftTree | SampledTree, scored: TargetOutput, prefix,
               rows: NodeRows | None = None) -> VerifyResult:
        """The accepted path and the committed tokens; ``prefix``: each row's root position (int or int64
        ``[b]``); ``rows``: the walk's node logits when the forward scored only the root."""
        raise NotImplementedError

    def next_token(self, logits: Tensor, positions: Tensor) -> Tensor:
        """The AR step's token per row from the next-token logits ``[b, V]`` at ``positions`` ``[b]``."""
        raise NotImplementedError


class Greedy(Verifier):
    """T=0: argmax acceptance (the walk reads only the visited nodes' logits when ``walks``)."""

    name = "greedy"

    def __init__(self, walk: WalkRows | None = None, walks: bool = False) -> None:
        super().__init__(walk)
        self.walks = walks

    def accept(self, drafted, scored, prefix, rows=None) -> VerifyResult:
        if rows is not None or self.walks:
            return walk_greedy(drafted, scored.logits[:, 0], rows or scored_rows(scored.logits))
        return verify_greedy(drafted, scored.logits.to(drafted.device))

    def next_token(self, logits: Tensor, positions: Tensor) -> Tensor:
        return logits.argmax(dim=-1)


class Match(Verifier):
    """T>0, target-sample matching: a node is accepted when the target's draw there is its token.

    The target's logits are warped first (temperature, top-k, top-p, min-p), then drawn at temperature 1:
    ``x / 1.0`` is ``x``, so the draws are AR's to the bit."""

    name = "match"

    def __init__(self, sampler: Sampler, warp: Warp, walk: WalkRows | None = None, walks: bool = False) -> None:
        super().__init__(walk)
        self.sampler, self.warp, self.walks = sampler, warp, walks

    def accept(self, drafted, scored, prefix, rows=None) -> VerifyResult:
        warp = self.warp.logits
        if self.walks:
            node_rows = rows or scored_rows(scored.logits)
            return walk_sampled(drafted, warp(scored.logits[:, 0]), lambda r, n: warp(node_rows(r, n)), 1.0,
                                self.sampler, prefix)
        return verify_sampled(drafted, warp(scored.logits.to(drafted.device)), 1.0, self.sampler, prefix)

    def next_token(self, logits: Tensor, positions: Tensor) -> Tensor:
        return sample_checked(self.sampler, self.warp.logits(logits), positions).to(torch.int64)


class Rejection(Match):
    """T>0, recursive rejection sampling over a tree whose tokens were drawn from known proposals: the
    builder's shape, tokens from the head's warped distribution at depths ``<= head_depths`` along the sampled
    path (builders with a head), else from the drafter's (:func:`~dartree.verify.rejection.sample_tree`), at the
    run's temperature times the builder's ``proposal_temperature`` (the run's filters kept).  Draws come from the
    sampler's ``torch.Generator`` (``None``: torch's global one)."""

    name = "rejection"
    redraws = True

    def __init__(self, sampler: Sampler, warp: Warp) -> None:
        super().__init__(sampler, warp)
        self.generator: torch.Generator | None = sampler.generator     # a GeneratorSampler (Sampling checks it)
        self.proposals = {1.0: warp}          # proposal_temperature -> the warp the tree's tokens are drawn from

    def draw(self, tree, block, head=None, *, head_depths=None, offset=0, root_state=None,
             proposal_temperature=1.0) -> SampledTree:
        # the stored proposal is the draws' own: sample_tree keeps the q it drew from, whatever its warp
        warp = self.proposals.get(proposal_temperature)
        if warp is None:
            temperature = self.warp.temperature * proposal_temperature
            try:
                warp = self.proposals[proposal_temperature] = dataclasses.replace(self.warp, temperature=temperature)
            except ValueError as e:
                raise ValueError(f"proposal_temperature: {proposal_temperature!r} times the run's temperature "
                                 f"{self.warp.temperature!r} is {temperature!r}, not a temperature to sample at "
                                 f"({e})") from None
        return sample_tree(tree, block, head, warp, self.generator, head_depths=head_depths, offset=offset,
                           root_state=root_state)

    def accept(self, drafted, scored, prefix, rows=None) -> VerifyResult:
        return verify_rejection(drafted, scored.logits.to(drafted.tree.device), self.warp, self.generator)


class Traversal(Rejection):
    """T>0, Traversal Verification (Weng et al. 2025) of the trees :class:`Rejection` draws: sequence-level
    acceptance from the leaves to the root, the same law and at least as many accepted tokens on a tree."""

    name = "traversal"

    def accept(self, drafted, scored, prefix, rows=None) -> VerifyResult:
        return verify_traversal(drafted, scored.logits.to(drafted.tree.device), self.warp, self.generator)


def make_verifier(options: Request | None, target: HFTarget, speculative: bool = True) -> Verifier:
    """The decode's verifier from its checked options (``None`` or no sampler: :class:`Greedy`).

    On the CPU, with greedy or with keyed / ``torch.Generator`` draws (a node's draw depends on nothing else:
    ``walk_sampled`` equals ``verify_sampled``), the walk draws only at the nodes it visits, and while walks
    are short the LM head runs only there too (``WalkRows``; ``scores_rows_apart``: probed once per target);
    a custom sampler draws at every node.
    """
    sampler = None if options is None else options.sampler
    walks = (sampler is None or type(sampler) in (KeyedSampler, GeneratorSampler)) and target.device.type == "cpu"
    if sampler is None:
        return Greedy(WalkRows(walks and speculative and target.scores_rows_apart), walks)
    warp = options.warp or Warp(options.temperature)
    if options.verifier == "rejection":
        return Rejection(sampler, warp)
    if options.verifier == "traversal":
        return Traversal(sampler, warp)
    if options.verifier == "match":
        return Match(sampler, warp, WalkRows(walks and speculative and target.scores_rows_apart), walks)
    raise ValueError(f"verifier: expected one of {VERIFIERS} at T>0, got {options.verifier!r}")
