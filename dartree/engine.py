"""The one speculative round: every entry point drives :class:`Engine`, four named stages on every live row::

    block = engine.draft()                  # the block for every live row's root (drafted, or a kept one)
    tree = engine.build(block)              # the builder's tree, cut to the model, with the verifier's draws
    verified = engine.verify(tree)          # one target forward over every row's tree + acceptance
    done = engine.commit(verified)          # per-row KV compaction, drafter context, stop / length

How each entry point drives it, and each row equal to its decode alone: docs/internals.md, "The engine".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from dartree.batch_drafters import batch_drafter
from dartree.block import DraftBlock
from dartree.drafting import Drafting
from dartree.models.target import HFTarget
from dartree.rounds import (
    STOP_REASONS,
    Clock,
    GenerationResult,
    Request,
    RoundStats,
    StageTimes,
    TimedRows,
    truncate,
)
from dartree.tree import DraftTree
from dartree.verifiers import Verifier, make_verifier
from dartree.verify.accept import VerifyResult
from dartree.verify.rejection import SampledTree

__all__ = ["Engine", "OneRow", "Verified"]


class OneRow:
    """A single-request drafter (the protocol of :mod:`dartree.decode`) as the one row of an engine, used
    as is: no copy, so a caller's drafter object holds the decode's context, as it always did.  No ``keep_rows``:
    a ``single`` engine keeps its row's state when it finishes, so it never drops a row."""

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


@dataclass(frozen=True)
class Verified:
    """The verify stage's outcome: the acceptance, the forward's hidden states for the drafter, the tree
    size per row and the stage's wall times."""

    result: VerifyResult
    hidden: Tensor | None
    tree_size: Tensor          # int64 [b] draft nodes per row
    times: StageTimes          # draft, build (head), mask, verify (target); commit is the next stage's
    head_calls: int


class Engine:
    """The live rows of a decode and the round they take (see the module docstring).

    Args:
        target: the :class:`HFTarget` (owns the cache).
        drafter: a drafter (``None``: the AR baseline); ``single=True`` drives it as the one row of a
            single-request decode (:class:`OneRow`), else its batch form (``batch_drafter``).
        builder, head: the tree builder and the timed head proxy the builder is given (``None`` without).
        options: the decode's checked options (``dartree.rounds.check_request``), shared by every row: temperature,
            sampler, warp and verifier (``None``: greedy); they choose :attr:`verifier` once.
    """

    def __init__(self, target: HFTarget, drafter=None, builder=None, head=None, *, options: Request | None = None,
                 single: bool = False) -> None:
        self.target, self.builder, self.head = target, builder, head
        self.drafter = None if drafter is None else OneRow(drafter) if single else batch_drafter(drafter)
        self.single = single                 # one request: its rows' state is kept when it finishes
        self.verifier: Verifier = make_verifier(options, target, speculative=drafter is not None)
        self.drafting = None if self.drafter is None else Drafting(self.drafter, builder, head, self.verifier)
        self.clock = Clock(target.device)
        self.live: list[int] = []            # request index of each batch row
        self.reqs: list[Request] = []
        self.generated: list[list[int]] = []
        self.rounds: list[list[RoundStats]] = []
        self.stopped: list[bool] = []
        self.prefill_s: list[float] = []
        self.roots = torch.zeros(0, dtype=torch.int64, device=target.device)
        self.on_round: Callable[[int, RoundStats, list[int]], None] | None = None
        self._times = StageTimes()           # the round's stage times so far
        self._calls = 0                      # the round's head calls

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
            self.drafter.add_rows(out.hidden, pad_sequence(prompts, batch_first=True), [p.shape[0] for p in prompts])
        positions = torch.tensor([p.shape[0] for p in prompts], dtype=torch.int64, device=target.device)
        firsts = self.verifier.next_token(out.logits[:, -1], positions)     # as every later AR token
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
        if self.drafting is not None:
            self.drafting.new_rows()         # a new row: the next round drafts
        joined_firsts = firsts[torch.tensor(joined, dtype=torch.int64, device=firsts.device)]
        self.roots = torch.cat([self.roots, joined_firsts.to(self.roots.device)])
        return [q for j, q in enumerate(ids) if j not in joined]

    def _keep(self, rows: list[int]) -> None:
        self.target.keep_rows(rows)
        if self.drafter is not None:
            self.drafter.keep_rows(rows)

    # ---------------------------------------------------------------------------------- stages
    def step(self) -> list[int]:
        """One round for every live row; returns the request indices that finished in it."""
        self.clock.lap()
        if self.drafting is None:
            return self.commit(self.verify_next())
        return self.commit(self.verify(self.build(self.draft())))

    def draft(self) -> DraftBlock:
        """Stage 1: the block for every live row (the drafter's, or a kept one: :class:`~dartree.drafting.Drafting`)."""
        block = self.drafting.draft(self.roots, self.target.vocab_size)
        self._times = StageTimes(draft_s=self.clock.lap())
        return block

    def build(self, block: DraftBlock) -> DraftTree | SampledTree:
        """Stage 2: the tree the target verifies (the builder's, cut to what the model can hold, with the
        verifier's draws)."""
        tree = self.drafting.build(block, self.roots, self.target)
        build_s = self.clock.lap()
        head = self.head
        head_s, self._calls = (0.0, 0) if head is None else head.take()
        self._times = self._times._replace(build_s=build_s, head_s=head_s)
        return tree

    def verify(self, drafted: DraftTree | SampledTree) -> Verified:
        """Stage 3: one target forward over every row's tree, then the verifier's acceptance."""
        target, clock = self.target, self.clock
        tree = drafted.tree if isinstance(drafted, SampledTree) else drafted
        # the absolute position of each row's root: what a keyed sampler is given
        prefix = target.length if len(self.live) == 1 else target.lengths_tensor().to(tree.device)
        inputs = target.tree_inputs(tree)
        mask_s = clock.lap()
        lazy = self.verifier.walk.logits(tree.tokens.numel()) == "root"
        scored = target.forward_tree(inputs, logits="root" if lazy else "all")
        target_s = clock.lap()
        rows = TimedRows(target, scored.final) if lazy else None
        result = self.verifier.accept(drafted, scored, prefix, rows)
        verify_s = target_s + clock.lap()
        if lazy:
            target_s += rows.seconds                # LM-head rows of the walk are target work
        times = self._times._replace(mask_s=mask_s, verify_s=verify_s, target_s=target_s)
        return Verified(result, scored.hidden, tree.num_nodes - 1, times, self._calls)

    def verify_next(self) -> Verified:
        """Stage 3 of the AR baseline: one causal step per live row, the verifier's token."""
        target, clock = self.target, self.clock
        positions = target.lengths_tensor() + 1 if self.verifier.name != "greedy" else None   # where draws sit
        logits = target.forward_next(self.roots).logits[:, -1]                               # [b, V]
        target_s = clock.lap()
        nxt = self.verifier.next_token(logits, positions)
        zero = torch.zeros_like(nxt)
        result = VerifyResult(accepted=zero[:, None], accepted_length=zero, bonus=nxt, tokens=nxt[:, None],
                              picks=nxt[:, None])
        return Verified(result, None, zero, StageTimes(verify_s=target_s + clock.lap(), target_s=target_s), 0)

    def commit(self, verified: Verified) -> list[int]:
        """Stage 4: per row, truncate at a stop token or the token limit, keep the committed slots in the
        target's cache, hand the committed tokens to the drafter; finished rows leave the batch.
        Returns the request indices that finished."""
        target, drafter, live, result = self.target, self.drafter, self.live, verified.result
        b, n = result.tokens.shape
        # One host sync per round, on purpose: the loop must know how many tokens each row committed (to
        # size the cache and to check stop tokens).  Tokens, accepted nodes and tree sizes come back together.
        host = torch.cat([result.tokens, result.accepted, verified.tree_size[:, None]], dim=1).tolist()
        counts, done, walked = [], [], []           # walked: the accepted nodes + 1 (before truncation)
        for r, q in enumerate(live):
            row = host[r][:n]
            committed = row[: row.index(-1)] if -1 in row else row
            walked.append(len(committed))
            kept, stop = truncate(committed, self.reqs[q].max_new_tokens - len(self.generated[q]), self.reqs[q].stop)
            self.generated[q].extend(kept)
            if self.drafting is not None:
                self.drafting.committed(host[r][n: 2 * n], kept, len(live))
            self.stopped[q] = stop
            counts.append(len(kept))
            done.append(stop or len(self.generated[q]) >= self.reqs[q].max_new_tokens)
        self.verifier.walk.record(max(walked))       # the round's longest walk
        c = max(counts)
        target.commit(result.accepted, counts, host[0][n: n + c] if b == 1 else None)
        roots, hidden, cached = self.roots, None, None
        if b == 1:
            nxt = result.tokens[:, c - 1]
        else:
            index = torch.tensor(counts, dtype=torch.int64, device=roots.device)[:, None] - 1
            nxt = torch.gather(result.tokens.to(roots.device), 1, index)[:, 0]
        if drafter is not None:
            if verified.hidden is not None and b == 1 and host[0][n: n + c] == list(range(c)):
                hidden = verified.hidden.narrow(1, 0, c)        # perf: the path is the first c nodes: a slice
            elif verified.hidden is not None:
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
        times = verified.times._replace(commit_s=kv_s + context_s, context_s=context_s)
        for r, q in enumerate(live):
            stats = RoundStats.of(walked[r] - 1, counts[r], host[r][2 * n], times, verified.head_calls)
            self.rounds[q].append(stats)
            if self.on_round is not None:
                self.on_round(q, stats, self.generated[q][len(self.generated[q]) - counts[r]:])
        self.live, self.roots = [live[r] for r in keep], nxt if len(fed) == len(keep) else nxt[:0]
        return [live[r] for r in range(b) if done[r]]

    # ---------------------------------------------------------------------------------- output
    def run(self) -> list[GenerationResult]:
        """Rounds until no row is live; then every request's result, in admission order."""
        while self.live:
            self.step()
        return [self.result(q) for q in range(len(self.reqs))]

    def result(self, q: int) -> GenerationResult:
        """Request ``q``'s tokens and per-round statistics so far."""
        req = self.reqs[q]
        return GenerationResult(tokens=torch.tensor([self.generated[q]], dtype=torch.int64, device=req.prompt.device),
                                prompt=req.prompt, rounds=tuple(self.rounds[q]),
                                stop_reason=STOP_REASONS[1] if self.stopped[q] else STOP_REASONS[0],
                                prefill_s=self.prefill_s[q])
