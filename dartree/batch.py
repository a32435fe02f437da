"""Batched decoding with ragged acceptance: many prompts in flight, one forward per round.

``generate_batch(decoder, prompts, ...)`` (also :meth:`SpeculativeDecoder.generate_batch`) runs the
speculative round of :mod:`dartree.decode` on all live rows at once: one batched ``draft_rows``
(:mod:`dartree.batch_drafters`), one :class:`~dartree.tree.DraftTree` for all rows (the builders are
batched), one target forward over every row's tree (:class:`~dartree.models.ragged.RaggedTarget`:
per-row lengths, positions, masks), one acceptance walk, and a per-row commit (rows accept
different lengths).  A row that commits a stop token or reaches ``max_new_tokens`` leaves the
batch at the end of that round: its cache rows and drafter context are dropped, so it stops costing.
``generate_ar_batch`` is the autoregressive baseline on the same cache machinery (one causal step
per live row per forward).

Each row's tokens equal what ``generate`` / ``generate_ar`` return for that prompt alone (T=0, and
T>0 with a ``KeyedSampler``, whose draw at a position does not depend on the batch); the tests check
it.  Per-row ``RoundStats`` carry the batch round's wall times (shared by every row in that round):
sum a row's rounds for its latency, the rounds of the longest row for the batch's wall time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from dartree.batch_drafters import batch_drafter
from dartree.builders import checked_tree
from dartree.models.ragged import RaggedTarget
from dartree.models.target import HFTarget
from dartree.rounds import (
    STOP_REASONS,
    Clock,
    GenerationResult,
    Request,
    RoundStats,
    TimedRows,
    WalkRows,
    as_target,
    check_block,
    check_requests,
    first_tokens,
    fit_tree,
    truncate,
)
from dartree.verify.accept import verify_greedy, verify_sampled, walk_greedy, walk_greedy_logits
from dartree.verify.sampling import Sampler, sample_checked

if TYPE_CHECKING:
    from dartree.decode import SpeculativeDecoder

__all__ = ["generate_batch", "generate_ar_batch", "SpecBatch", "ARBatch"]


def _padded(rows: list[list[int]], device: torch.device) -> Tensor:
    m = max((len(r) for r in rows), default=0)
    return torch.tensor([r + [0] * (m - len(r)) for r in rows], dtype=torch.int64, device=device).reshape(len(rows), m)


class SpecBatch:
    """The live rows of batched speculative decoding; requests join with :meth:`admit`, :meth:`step` runs one round.

    The round is :meth:`SpeculativeDecoder.generate`'s, on every live row (the shared pieces are
    :mod:`dartree.rounds`).  ``generate_batch`` admits every prompt and steps until none is live;
    ``dartree.serve`` keeps ``concurrency`` requests live, admitting the next prompt whenever a row
    finishes.  A row's output does not depend on when it joined or on the other rows.
    """

    def __init__(self, decoder: SpeculativeDecoder) -> None:
        self.decoder = decoder
        self.target = decoder.target
        self.drafter = batch_drafter(decoder.drafter)
        self.ragged = RaggedTarget(self.target)
        self.clock = Clock(self.target.device)
        self.live: list[int] = []            # request index of each batch row
        self.reqs: list[Request] = []
        self.generated: list[list[int]] = []
        self.rounds: list[list[RoundStats]] = []
        self.stopped: list[bool] = []
        self.prefill_s: list[float] = []
        self.roots = torch.zeros(0, dtype=torch.int64, device=self.target.device)
        # T=0 on the CPU: the LM head on the roots only while the walks stay short, as in generate (the
        # batched walk runs one LM-head call per depth: its length is the longest row's)
        self.walk = WalkRows(True)

    def admit(self, reqs: list[Request]) -> list[int]:
        """Prefill ``reqs``, take each one's first token from its prompt's last logits and add the
        unfinished ones as rows (request indices continue from the earlier admissions, in order).
        Returns the indices of the requests that are complete at once (their first token is a stop
        token, or ``max_new_tokens`` is 1): they never join the batch."""
        self.clock.lap()
        prompts = [q.prompt[0] for q in reqs]
        logits = self._prefill(prompts)                                                # [k, V]
        positions = torch.tensor([p.shape[0] for p in prompts], dtype=torch.int64, device=self.target.device)
        firsts = first_tokens(logits, reqs, positions)
        host = firsts.tolist()       # one sync per admission, on purpose: the first tokens may end requests
        ids = list(range(len(self.reqs), len(self.reqs) + len(reqs)))
        self.reqs += reqs
        self.generated += [[t] for t in host]
        self.rounds += [[] for _ in reqs]
        self.stopped += [t in q.stop for t, q in zip(host, reqs, strict=True)]
        joined = [j for j, q in enumerate(ids) if not self.stopped[q] and self.reqs[q].max_new_tokens > 1]
        old = len(self.live)
        if len(joined) < len(reqs):          # finished at their first token: they leave before any round
            self._keep(list(range(old)) + [old + j for j in joined])
        self.prefill_s += [self.clock.lap()] * len(reqs)
        self.live += [ids[j] for j in joined]
        index = torch.tensor(joined, dtype=torch.int64, device=firsts.device)
        self.roots = torch.cat([self.roots, firsts[index].to(self.roots.device)])
        joined_ids = {ids[j] for j in joined}
        return [q for q in ids if q not in joined_ids]

    def _keep(self, rows: list[int]) -> None:
        self.ragged.keep_rows(rows)
        self.drafter.keep_rows(rows)

    def _prefill(self, prompts: list[Tensor]) -> Tensor:
        """Prefill the target over ``prompts``, give the drafter its rows; the prompts' last logits ``[k, V]``."""
        if not self.live:
            out = self.ragged.prefill(prompts, logits="last")
            self.drafter.start(0)
        else:
            out = self.ragged.add_rows(prompts, logits="last")
        self.drafter.add_rows(out.hidden, _padded([p.tolist() for p in prompts], self.target.device),
                              [p.shape[0] for p in prompts])
        return out.logits[:, -1]

    def step(self) -> list[int]:
        """One round for every live row; returns the request indices that finished in it."""
        decoder, target, ragged, drafter, clock = self.decoder, self.target, self.ragged, self.drafter, self.clock
        live, roots, first = self.live, self.roots, self.reqs[self.live[0]]
        b = len(live)
        clock.lap()
        block = drafter.draft_rows(roots)
        check_block(block, roots, target.vocab_size, rows=b)
        draft_s = clock.lap()
        timed = decoder.timed_head
        tree = checked_tree(decoder.builder, decoder.builder.build(block, timed), block)    # as in generate
        tree = fit_tree(tree, block.gamma, ragged.lengths, ragged.width, target)
        build_s = clock.lap()
        head_s, head_calls = (0.0, 0) if timed is None else (timed.take(), timed.take_calls())
        prefix = ragged.lengths_tensor().to(tree.device)
        inputs = ragged.tree_inputs(tree)
        mask_s = clock.lap()
        # T=0 on the CPU: the walk picks only along the path, and the LM head runs only there while walks
        # are short (WalkRows: the b x n rows of one call against the longest walk), as in generate
        walks = first.sampler is None and target.scores_rows_apart and tree.device == target.device
        lazy = walks and self.walk.logits(tree.tokens.numel()) == "root"
        scored = ragged.forward_tree(tree, inputs, logits="root" if lazy else "all")
        target_s = clock.lap()
        if lazy:
            rows = TimedRows(target, scored.final)
            result = walk_greedy(tree, scored.logits[:, 0], rows)
        elif walks:
            result = walk_greedy_logits(tree, scored.logits)
        elif first.sampler is None:
            result = verify_greedy(tree, scored.logits.to(tree.device))
        else:
            result = verify_sampled(tree, scored.logits.to(tree.device), first.temperature, first.sampler, prefix)
        verify_s = target_s + clock.lap()
        if lazy:
            target_s += rows.seconds                # LM-head rows of the walk are target work
        # One host sync per round, on purpose: every row's committed tokens and tree size.
        n = result.tokens.shape[1]
        host = torch.cat([result.tokens, tree.num_nodes[:, None]], dim=1).tolist()
        counts, done, longest = [], [], 0
        for r, q in enumerate(live):
            row = host[r][:n]
            committed = row[: row.index(-1)] if -1 in row else row
            longest = max(longest, len(committed))
            kept, stop = truncate(committed, self.reqs[q].max_new_tokens - len(self.generated[q]), self.reqs[q].stop)
            self.generated[q].extend(kept)
            self.stopped[q] = stop
            counts.append(len(kept))
            done.append(stop or len(self.generated[q]) >= self.reqs[q].max_new_tokens)
        self.walk.record(longest)
        ragged.commit(result.accepted, counts)
        c = max(counts)
        accepted = result.accepted[:, :c].clamp(min=0).to(scored.logits.device)
        hidden = None
        if scored.hidden is not None:
            hidden = torch.gather(scored.hidden, 1, accepted[:, :, None].expand(-1, -1, scored.hidden.shape[-1]))
        cached = torch.cat([roots[:, None], result.tokens[:, : c - 1].clamp(min=0)], dim=1)
        index = torch.tensor(counts, dtype=torch.int64, device=roots.device)[:, None] - 1
        roots = torch.gather(result.tokens.to(roots.device), 1, index)[:, 0]
        kv_s = clock.lap()
        keep = [r for r in range(b) if not done[r]]
        if len(keep) < b:     # a finished row needs no context: drop it first, then feed the rest
            self._keep(keep)
            index = torch.tensor(keep, dtype=torch.int64, device=roots.device)
            roots, cached = roots[index], cached[index.to(cached.device)]
            hidden = None if hidden is None else hidden[index.to(hidden.device)]
        if keep:
            drafter.append_rows(hidden, cached, [counts[r] for r in keep])
        context_s = clock.lap()
        for r, q in enumerate(live):
            accepted_length = (host[r][:n].index(-1) if -1 in host[r][:n] else n) - 1
            self.rounds[q].append(RoundStats(accepted_length, counts[r], host[r][n] - 1, draft_s, build_s, mask_s,
                                             verify_s, kv_s + context_s, head_s, target_s, context_s,
                                             head_calls))
        self.live, self.roots = [live[r] for r in keep], roots
        return [live[r] for r in range(b) if done[r]]

    def result(self, q: int) -> GenerationResult:
        req = self.reqs[q]
        return GenerationResult(tokens=torch.tensor([self.generated[q]], dtype=torch.int64, device=req.prompt.device),
                                prompt=req.prompt, rounds=tuple(self.rounds[q]),
                                stop_reason=STOP_REASONS[1] if self.stopped[q] else STOP_REASONS[0],
                                prefill_s=self.prefill_s[q])


@torch.inference_mode()      # as SpeculativeDecoder.generate
def generate_batch(
    decoder: SpeculativeDecoder,
    prompts: Sequence[Tensor],
    max_new_tokens: int,
    temperature: float = 0.0,
    sampler: Sampler | None = None,
    stop_token_ids: Iterable[int] | None = None,
) -> list[GenerationResult]:
    """Decode every prompt with ``decoder``'s drafter, builder and head, all live rows per round.

    Same arguments as :meth:`SpeculativeDecoder.generate`, with ``prompts`` a sequence of integer
    ``[L]`` or ``[1, L]`` tensors of any lengths; one result per prompt, in order.
    """
    reqs = check_requests(decoder.target, prompts, max_new_tokens, temperature, sampler, stop_token_ids)
    batch = SpecBatch(decoder)
    batch.admit(reqs)
    while batch.live:
        batch.step()
    return [batch.result(q) for q in range(len(reqs))]


class ARBatch(SpecBatch):
    """The live rows of the batched AR baseline: :meth:`step` is one causal token for every live row."""

    def __init__(self, target: HFTarget) -> None:
        self.target = target
        self.drafter = None
        self.ragged = RaggedTarget(target)
        self.clock = Clock(target.device)
        self.live, self.reqs, self.generated, self.rounds, self.stopped, self.prefill_s = [], [], [], [], [], []
        self.roots = torch.zeros(0, dtype=torch.int64, device=target.device)

    def _keep(self, rows: list[int]) -> None:
        self.ragged.keep_rows(rows)

    def _prefill(self, prompts: list[Tensor]) -> Tensor:
        if self.live:
            return self.ragged.add_rows(prompts, logits="last").logits[:, -1]
        return self.ragged.prefill(prompts, logits="last").logits[:, -1]

    def step(self) -> list[int]:
        ragged, clock, live, first = self.ragged, self.clock, self.live, self.reqs[self.live[0]]
        clock.lap()
        positions = ragged.lengths_tensor() + 1          # where the drawn tokens will sit
        logits = ragged.forward_next(self.roots).logits[:, -1]                          # [b, V]
        target_s = clock.lap()
        if first.sampler is None:
            nxt = logits.argmax(dim=-1)
        else:
            nxt = sample_checked(first.sampler, logits.float() / first.temperature, positions).to(torch.int64)
        verify_s = target_s + clock.lap()
        tokens = nxt.tolist()             # one sync per step, on purpose: stop tokens are checked on the host
        ragged.commit(torch.zeros(len(live), 1, dtype=torch.int64, device=self.target.device), [1] * len(live))
        keep = []
        for r, q in enumerate(live):
            self.generated[q].append(tokens[r])
            self.stopped[q] = tokens[r] in self.reqs[q].stop
            if not self.stopped[q] and len(self.generated[q]) < self.reqs[q].max_new_tokens:
                keep.append(r)
        if len(keep) < len(live):
            ragged.keep_rows(keep)
            nxt = nxt[torch.tensor(keep, dtype=torch.int64, device=nxt.device)]
        self.roots = nxt
        commit_s = clock.lap()
        for q in live:
            self.rounds[q].append(RoundStats(0, 1, 0, 0.0, 0.0, 0.0, verify_s, commit_s, 0.0, target_s))
        self.live = [live[r] for r in keep]
        kept = set(keep)
        return [q for r, q in enumerate(live) if r not in kept]


@torch.inference_mode()      # as SpeculativeDecoder.generate
def generate_ar_batch(
    target: HFTarget | nn.Module,
    prompts: Sequence[Tensor],
    max_new_tokens: int,
    temperature: float = 0.0,
    sampler: Sampler | None = None,
    stop_token_ids: Iterable[int] | None = None,
) -> list[GenerationResult]:
    """Batched autoregressive baseline: one causal step for every live row per forward.

    Same contract as :func:`dartree.decode.generate_ar` for each prompt (ragged lengths; rows leave
    the batch when they finish); the token at absolute position p is drawn by
    ``sampler.sample(logits / temperature, p)``, so each row equals ``generate_ar`` on that prompt.
    """
    if not isinstance(target, HFTarget):
        target = as_target(target, ())
    reqs = check_requests(target, prompts, max_new_tokens, temperature, sampler, stop_token_ids)
    batch = ARBatch(target)
    batch.admit(reqs)
    while batch.live:
        batch.step()
    return [batch.result(q) for q in range(len(reqs))]
