"""The one speculative round: every entry point drives :class:`Engine`.

A round has four named stages, run on every live row at once (Medusa's and gpt-fast's shape)::

    block = engine.draft()                  # the drafter's block for every live row's root
    tree = engine.build(block)              # the builder's tree (head calls timed), cut to the model
    verified = engine.verify(tree)          # one target forward over every row's tree + acceptance
    done = engine.commit(verified)          # per-row KV compaction, drafter context, stop / length

:meth:`Engine.step` runs them in order.  ``SpeculativeDecoder.generate`` is a batch of one (its drafter
used as is, :class:`OneRow`), ``generate_batch`` admits every prompt, ``dartree.serve.serve`` admits
prompts as rows finish, and the AR baselines are an engine without a drafter (``draft`` and ``build``
are skipped and ``verify`` is one causal step per row).  How a decode verifies is chosen once, when
the engine is made (:attr:`Engine.verifier`): ``"greedy"`` at T=0; at T>0 ``"match"`` (exact
target-sample matching: keyed draws give output equal to AR token for token), ``"rejection"`` (trees
sampled from the head's or the drafter's distribution, recursive rejection sampling: AR's law,
:mod:`dartree.verify.rejection`) or ``"traversal"`` (the same trees, Traversal Verification,
:mod:`dartree.verify.traversal`).  Under either a Sequoia builder's tree is its static shape, and
with a head and one live row ``step`` may skip ``draft``: the kept block serves the round, the head proposing
from its state after the tokens committed since (block reuse, ``SequoiaConfig.reuse_depths``,
docs/verification.md).  The target owns its
cache (:class:`~dartree.models.target.HFTarget`: rows of any lengths), so the engine uses only its
public methods.

Each row's tokens equal what it would get alone (T=0, and T>0 with a ``KeyedSampler``, whose draw at a
position depends on nothing else); a row's output does not depend on when it joined or on the other rows.
Per-row :class:`~dartree.rounds.RoundStats` carry the round's wall times (shared by the rows of a round).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from dartree.batch_drafters import batch_drafter
from dartree.builders import SequoiaConfig, checked_tree
from dartree.fast.sequoia import shape_tree
from dartree.models.target import HFTarget, TargetOutput
from dartree.rounds import (
    ALL_VERIFIERS,
    SAMPLED_VERIFIERS,
    STOP_REASONS,
    Clock,
    GenerationResult,
    Request,
    RoundStats,
    TimedRows,
    WalkRows,
    check_block,
    first_tokens,
    fit_tree,
    scored_rows,
    truncate,
)
from dartree.tree import PAD, DraftTree
from dartree.verify.accept import (
    VerifyResult,
    verify_greedy,
    verify_sampled,
    walk_greedy,
    walk_greedy_logits,
    walk_sampled,
)
from dartree.verify.rejection import HEAD_DEPTHS, SampledTree, sample_tree, verify_rejection
from dartree.verify.sampling import GeneratorSampler, KeyedSampler, sample_checked
from dartree.verify.traversal import verify_traversal
from dartree.verify.warp import Warp

__all__ = ["Engine", "OneRow", "Verified"]


class OneRow:
    """A single-request drafter (the protocol of :mod:`dartree.decode`) as the one row of an engine, used
    as is: no copy, so a caller's drafter object holds the decode's context, as it always did."""

    def __init__(self, drafter) -> None:
        self.drafter = drafter
        self.target_layer_ids = tuple(drafter.target_layer_ids)

    def start(self, batch_size: int) -> None:
        self.drafter.reset()

    def add_rows(self, hidden_states: Tensor | None, tokens: Tensor, counts: list[int]) -> None:
        if len(counts) != 1:
            raise ValueError(f"counts: a single-request drafter takes one row, got {len(counts)}")
        self.drafter.reset()
        self.append_rows(hidden_states, tokens, counts)

    def append_rows(self, hidden_states: Tensor | None, tokens: Tensor, counts: list[int]) -> None:
        c = counts[0]
        self.drafter.append_context(None if hidden_states is None else hidden_states[:, :c], tokens[:, :c])

    def draft_rows(self, roots: Tensor):
        return self.drafter.draft(roots)

    def keep_rows(self, rows: list[int]) -> None:
        if rows not in ([], [0]):
            raise ValueError(f"rows: a single-request drafter has one row, got {rows}")


@dataclass(frozen=True)
class Verified:
    """The verify stage's outcome: the acceptance, the forward's hidden states for the drafter, the tree
    size per row and the stage's wall times."""

    result: VerifyResult
    hidden: Tensor | None
    tree_size: Tensor          # int64 [b] draft nodes per row
    times: tuple[float, ...]   # draft, build, mask, verify, head, target seconds
    head_calls: int


class Engine:
    """The live rows of a decode and the round they take (see the module docstring).

    Args:
        target: the :class:`HFTarget` (owns the cache).
        drafter: a drafter (``None``: the AR baseline); ``single=True`` drives it as the one row of a
            single-request decode (:class:`OneRow`), else its batch form (``batch_drafter``).
        builder, head: the tree builder and the timed head proxy the builder is given (``None`` without).
        options: the decode's checked options (``dartree.rounds.check_request``), shared by every row: temperature,
            sampler, warp and verifier (``None``: greedy).
    """

    def __init__(self, target: HFTarget, drafter=None, builder=None, head=None, *, options: Request | None = None,
                 single: bool = False) -> None:
        self.target, self.builder, self.head = target, builder, head
        self.drafter = None if drafter is None else OneRow(drafter) if single else batch_drafter(drafter)
        self.single = single
        sampler = None if options is None else options.sampler
        self.temperature, self.sampler = (0.0, None) if sampler is None else (options.temperature, sampler)
        self.warp = None if sampler is None else options.warp or Warp(options.temperature)
        verifier = None if sampler is None else options.verifier
        self.clock = Clock(target.device)
        self.live: list[int] = []            # request index of each batch row
        self.reqs: list[Request] = []
        self.generated: list[list[int]] = []
        self.rounds: list[list[RoundStats]] = []
        self.stopped: list[bool] = []
        self.prefill_s: list[float] = []
        self.roots = torch.zeros(0, dtype=torch.int64, device=target.device)
        self.on_round: Callable[[int, RoundStats, list[int]], None] | None = None
        # the verifier, chosen once: on the CPU, greedy, with keyed draws (a node's draw depends on nothing
        # else: walk_sampled equals verify_sampled) or a torch.Generator's (fresh draws: the same law), the
        # walk draws only at the nodes it visits, and while walks are short the LM head runs only there too
        # (WalkRows; scores_rows_apart: probed once per target); a custom sampler draws at every node
        self.verifier = "greedy" if sampler is None else verifier
        if self.verifier not in ("greedy", *ALL_VERIFIERS):
            raise ValueError(f"verifier: expected one of {ALL_VERIFIERS} at T>0, got {verifier!r}")
        rejection = self.verifier in SAMPLED_VERIFIERS          # sampled trees: rejection or traversal
        self.generator = getattr(sampler, "generator", None) if rejection else None
        # under rejection only a tree's shape is kept: a Sequoia builder's is static, so its tokens (candidates,
        # and for corrected-sequoia a head call and a sort per depth) are skipped (perf: the builder stage of
        # corrected-sequoia B=16 at T=1 on the zoo, 1.55 -> 1.20 ms a round, two runs minutes apart, not side by
        # side), and its config says where the head proposes; every other builder's head proposes at depths
        # <= HEAD_DEPTHS
        config = getattr(builder, "config", None)
        self.head_depths = getattr(config, "head_depths", HEAD_DEPTHS)
        self.static_shape = rejection and isinstance(config, SequoiaConfig) \
            and getattr(builder, "trusted", False)
        # block reuse (a static shape, a head, one live row): the next round's proposals come from the head along
        # the committed path over the same block, until fewer than config.reuse_depths of its depths are left
        self.reuse_depths = getattr(config, "reuse_depths", 0) if self.static_shape and head is not None else 0
        self._kept = None                    # the block being reused
        self._since: list[int] = []          # tokens committed after its root
        self._carry: Tensor | None = None    # the head's state after its root and the first _folded of them
        self._folded = 0
        self._sampled: SampledTree | None = None   # the round's sampled tree (its head states along the path)
        walks = (sampler is None or type(sampler) in (KeyedSampler, GeneratorSampler)) and target.device.type == "cpu"
        self.walk = WalkRows(walks and drafter is not None and not rejection and target.scores_rows_apart)
        self._accept: Callable[..., VerifyResult]
        if sampler is None:
            self._accept = self._walk_greedy if walks else self._all_greedy
        elif rejection:
            self._accept = self._rejection
        else:
            self._accept = self._walk_sampled if walks else self._all_sampled

    # ------------------------------------------------------------------------------------ rows
    def admit(self, reqs: list[Request]) -> list[int]:
        """Prefill ``reqs``, take each one's first token from its prompt's last logits and add the
        unfinished ones as rows (request indices continue from the earlier admissions, in order).
        Returns the indices of the requests that are complete at once (their first token is a stop
        token, or ``max_new_tokens`` is 1): they never join the batch."""
        self.clock.lap()
        prompts = [q.prompt[0] for q in reqs]
        target = self.target
        if not self.live:
            out = target.prefill(prompts, logits="last")
            if self.drafter is not None:
                self.drafter.start(0)
        else:
            out = target.add_rows(prompts, logits="last")
        if self.drafter is not None:
            self.drafter.add_rows(out.hidden, _padded([p.tolist() for p in prompts], target.device),
                                  [p.shape[0] for p in prompts])
        positions = torch.tensor([p.shape[0] for p in prompts], dtype=torch.int64, device=target.device)
        firsts = first_tokens(out.logits[:, -1], reqs, positions)
        host = firsts.tolist()       # one sync per admission, on purpose: the first tokens may end requests
        ids = list(range(len(self.reqs), len(self.reqs) + len(reqs)))
        self.reqs += reqs
        self.generated += [[t] for t in host]
        self.rounds += [[] for _ in reqs]
        self.stopped += [t in q.stop for t, q in zip(host, reqs, strict=True)]
        joined = [j for j, q in enumerate(ids) if not self.stopped[q] and self.reqs[q].max_new_tokens > 1]
        old = len(self.live)
        if len(joined) < len(reqs) and not self.single:   # finished at their first token: they leave at once
            self._keep(list(range(old)) + [old + j for j in joined])
        self.prefill_s += [self.clock.lap()] * len(reqs)
        self.live += [ids[j] for j in joined]
        self._kept = None                    # a new row: the next round drafts
        joined_firsts = firsts[torch.tensor(joined, dtype=torch.int64, device=firsts.device)]
        self.roots = torch.cat([self.roots, joined_firsts.to(self.roots.device)])
        joined_ids = {ids[j] for j in joined}
        return [q for q in ids if q not in joined_ids]

    def _keep(self, rows: list[int]) -> None:
        self.target.keep_rows(rows)
        if self.drafter is not None:
            self.drafter.keep_rows(rows)

    # ---------------------------------------------------------------------------------- stages
    def step(self) -> list[int]:
        """One round for every live row; returns the request indices that finished in it."""
        self.clock.lap()
        if self.drafter is None:
            return self.commit(self.verify_next())
        block = self._reusable()
        if block is None:
            block, draft_s = self.draft()
            if self.reuse_depths and len(self.live) == 1:
                self._kept, self._since, self._carry, self._folded = block, [], None, 0
        else:
            draft_s = self.clock.lap()
        return self.commit(self.verify(*self.build(block, draft_s)))

    def _reusable(self):
        """The kept block if the next round reuses it, else ``None``."""
        block = self._kept
        if block is None or len(self.live) != 1 or block.gamma - len(self._since) < self.reuse_depths:
            return None
        return block

    def draft(self) -> tuple:
        """Stage 1: the drafter's block for every live row (checked against the roots it was given)."""
        block = self.drafter.draft_rows(self.roots)
        check_block(block, self.roots, self.target.vocab_size, rows=len(self.live))
        return block, self.clock.lap()

    def build(self, block, draft_s: float) -> tuple:
        """Stage 2: the builder's tree (a user builder's tree is checked before the target sees it),
        cut to what the model can hold."""
        target, head = self.target, self.head
        offset = len(self._since) if block is self._kept else 0
        if self.static_shape:
            tree = shape_tree(block, self.builder.config, block.gamma - offset, self.roots)
        else:
            tree = checked_tree(self.builder, self.builder.build(block, head), block)
        tree = fit_tree(tree, block.gamma - offset, target.lengths, target.length, target)
        if self.verifier in SAMPLED_VERIFIERS:
            # the builder's shape, tokens drawn from its head's warped distribution over the whole vocabulary
            # along the sampled path at depths <= self.head_depths (builders with a head), else from the drafter's
            carry = self._carried(block, offset) if offset else None
            tree = sample_tree(tree, block, head, self.warp, self.generator, head_depths=self.head_depths,
                               offset=offset, root_state=carry)
            self._sampled = tree if self._kept is not None else None     # its head states, for _adopt
        build_s = self.clock.lap()
        head_s, calls = (0.0, 0) if head is None else (head.take(), head.take_calls())
        return tree, (draft_s, build_s, head_s), calls

    def _carried(self, block, offset: int) -> Tensor:
        """The head's state after the kept block's root and the ``offset`` tokens committed since ([1, S])."""
        head = self.head
        if self._carry is None:
            self._carry = head.initial_state(block)
        device = self._carry.device
        while self._folded < offset:
            token = torch.tensor([[self._since[self._folded]]], dtype=torch.int64, device=device)
            self._carry = head.advance(block, self._folded + 1, self._carry[:, None], token)[:, 0]
            self._folded += 1
        return self._carry

    def _adopt(self, accepted: list[int], kept: int) -> None:
        """Take the head's state after the deepest committed node of the round's path that has one (the sampled
        tree made it for that node's children) as the carried state: fewer ``advance`` calls in :meth:`_carried`.
        ``accepted``: the path's nodes, root first (then ``PAD``); ``kept``: the tokens committed."""
        sampled, before = self._sampled, len(self._since)
        if sampled is None or sampled.states is None:
            return
        path = [u for u in accepted if u != PAD]
        stated = sampled.stated[0].tolist()       # one host read a round (a host list on the CPU already)
        for j in range(min(len(path) - 1, kept), -1, -1):      # node path[j]'s state: after j committed tokens
            if before + j > self._folded and stated[path[j]]:
                self._carry, self._folded = sampled.states[0, path[j]][None].clone(), before + j
                return

    def verify(self, drafted: DraftTree | SampledTree, times: tuple[float, float, float], head_calls: int) -> Verified:
        """Stage 3: one target forward over every row's tree, then the decode's acceptance rule."""
        target, clock = self.target, self.clock
        tree = drafted.tree if isinstance(drafted, SampledTree) else drafted
        # the absolute position of each row's root: what a keyed sampler is given
        prefix = target.length if len(self.live) == 1 else target.lengths_tensor().to(tree.device)
        inputs = target.tree_inputs(tree)
        mask_s = clock.lap()
        lazy = self.walk.logits(tree.tokens.numel()) == "root"
        scored = target.forward_tree(inputs, logits="root" if lazy else "all")
        target_s = clock.lap()
        if lazy:
            rows = TimedRows(target, scored.final)
            result = self._accept(drafted, scored, prefix, rows)
        else:
            result = self._accept(drafted, scored, prefix)
        verify_s = target_s + clock.lap()
        if lazy:
            target_s += rows.seconds                # LM-head rows of the walk are target work
        draft_s, build_s, head_s = times
        return Verified(result, scored.hidden, tree.num_nodes - 1,
                        (draft_s, build_s, mask_s, verify_s, head_s, target_s), head_calls)

    def verify_next(self) -> Verified:
        """Stage 3 of the AR baseline: one causal step per live row, its argmax or its draw."""
        target, clock = self.target, self.clock
        positions = target.lengths_tensor() + 1 if self.sampler is not None else None   # where the draws sit
        logits = target.forward_next(self.roots).logits[:, -1]                          # [b, V]
        target_s = clock.lap()
        if self.sampler is None:
            nxt = logits.argmax(dim=-1)
        else:
            nxt = sample_checked(self.sampler, self.warp.logits(logits), positions).to(torch.int64)
        zero = torch.zeros_like(nxt)
        result = VerifyResult(accepted=zero[:, None], accepted_length=zero, bonus=nxt, tokens=nxt[:, None],
                              picks=nxt[:, None])
        return Verified(result, None, zero, (0.0, 0.0, 0.0, target_s + clock.lap(), 0.0, target_s), 0)

    def commit(self, verified: Verified) -> list[int]:
        """Stage 4: per row, truncate at a stop token or the token limit, keep the committed slots in the
        target's cache, hand the committed tokens to the drafter; finished rows leave the batch.
        Returns the request indices that finished."""
        target, drafter, live, result = self.target, self.drafter, self.live, verified.result
        b, n = result.tokens.shape
        # One host sync per round, on purpose: the loop must know how many tokens each row committed (to
        # size the cache and to check stop tokens).  Tokens, accepted nodes and tree sizes come back together.
        host = torch.cat([result.tokens, result.accepted, verified.tree_size[:, None]], dim=1).tolist()
        counts, done, longest = [], [], 0
        for r, q in enumerate(live):
            row = host[r][:n]
            committed = row[: row.index(-1)] if -1 in row else row
            longest = max(longest, len(committed))
            kept, stop = truncate(committed, self.reqs[q].max_new_tokens - len(self.generated[q]), self.reqs[q].stop)
            self.generated[q].extend(kept)
            if self._kept is not None:
                if len(live) == 1:
                    self._adopt(host[r][n: 2 * n], len(kept))
                    self._since += kept
                else:
                    self._kept = None
            self.stopped[q] = stop
            counts.append(len(kept))
            done.append(stop or len(self.generated[q]) >= self.reqs[q].max_new_tokens)
        self.walk.record(longest)
        c = max(counts)
        target.commit(result.accepted, counts, host[0][n: n + c] if b == 1 else None)
        roots, hidden, cached = self.roots, None, None
        if b == 1:
            nxt = result.tokens[:, c - 1]
        else:
            index = torch.tensor(counts, dtype=torch.int64, device=roots.device)[:, None] - 1
            nxt = torch.gather(result.tokens.to(roots.device), 1, index)[:, 0]
        if drafter is not None:
            if verified.hidden is not None:
                accepted = result.accepted[:, :c].clamp(min=0).to(verified.hidden.device)
                width = verified.hidden.shape[-1]
                hidden = torch.gather(verified.hidden, 1, accepted[:, :, None].expand(-1, -1, width))
            cached = torch.cat([roots[:, None], result.tokens[:, : c - 1].clamp(min=0)], dim=1)
        kv_s = self.clock.lap()
        keep = [r for r in range(b) if not done[r]]
        # a finished row needs no context: drop it first, then feed the rest (a single request keeps its
        # state: the target and the drafter hold the whole decode afterwards, as the drafter protocol says)
        fed = list(range(b)) if self.single else keep
        if len(fed) < b:
            self._keep(fed)
            index = torch.tensor(fed, dtype=torch.int64, device=roots.device)
            nxt = nxt[index]
            if cached is not None:
                cached = cached[index.to(cached.device)]
                hidden = None if hidden is None else hidden[index.to(hidden.device)]
        if fed and drafter is not None:
            drafter.append_rows(hidden, cached, [counts[r] for r in fed])
        context_s = self.clock.lap()
        draft_s, build_s, mask_s, verify_s, head_s, target_s = verified.times
        for r, q in enumerate(live):
            row = host[r][:n]
            accepted_length = (row.index(-1) if -1 in row else n) - 1
            stats = RoundStats(accepted_length, counts[r], host[r][2 * n], draft_s, build_s, mask_s, verify_s,
                               kv_s + context_s, head_s, target_s, context_s, verified.head_calls)
            self.rounds[q].append(stats)
            if self.on_round is not None:
                self.on_round(q, stats, self.generated[q][len(self.generated[q]) - counts[r]:])
        self.live, self.roots = [live[r] for r in keep], nxt if len(fed) == len(keep) else nxt[:0]
        return [live[r] for r in range(b) if done[r]]

    # ------------------------------------------------------------------------------ acceptance
    def _walk_greedy(self, tree: DraftTree, scored: TargetOutput, prefix, rows=None) -> VerifyResult:
        if rows is not None:
            return walk_greedy(tree, scored.logits[:, 0], rows)
        return walk_greedy_logits(tree, scored.logits)

    def _all_greedy(self, tree: DraftTree, scored: TargetOutput, prefix, rows=None) -> VerifyResult:
        return verify_greedy(tree, scored.logits.to(tree.device))

    # at T>0 the target's logits are warped first (temperature, top-k, top-p, min-p), then drawn at temperature 1:
    # x / 1.0 is x, so the draws are AR's to the bit
    def _walk_sampled(self, tree: DraftTree, scored: TargetOutput, prefix, rows=None) -> VerifyResult:
        warp = self.warp.logits
        node_rows = rows or scored_rows(scored.logits)
        return walk_sampled(tree, warp(scored.logits[:, 0]), lambda r, n: warp(node_rows(r, n)), 1.0, self.sampler,
                            prefix)

    def _all_sampled(self, tree: DraftTree, scored: TargetOutput, prefix, rows=None) -> VerifyResult:
        return verify_sampled(tree, self.warp.logits(scored.logits.to(tree.device)), 1.0, self.sampler, prefix)

    def _rejection(self, sampled: SampledTree, scored: TargetOutput, prefix, rows=None) -> VerifyResult:
        verify = verify_traversal if self.verifier == "traversal" else verify_rejection
        return verify(sampled, scored.logits.to(sampled.tree.device), self.warp, self.generator)

    # ---------------------------------------------------------------------------------- output
    def run(self) -> None:
        """Rounds until no row is live."""
        while self.live:
            self.step()

    def result(self, q: int) -> GenerationResult:
        """Request ``q``'s tokens and per-round statistics so far."""
        req = self.reqs[q]
        return GenerationResult(tokens=torch.tensor([self.generated[q]], dtype=torch.int64, device=req.prompt.device),
                                prompt=req.prompt, rounds=tuple(self.rounds[q]),
                                stop_reason=STOP_REASONS[1] if self.stopped[q] else STOP_REASONS[0],
                                prefill_s=self.prefill_s[q])


def _padded(rows: list[list[int]], device: torch.device) -> Tensor:
    m = max((len(r) for r in rows), default=0)
    return torch.tensor([r + [0] * (m - len(r)) for r in rows], dtype=torch.int64, device=device).reshape(len(rows), m)
