"""Tensorized depth-wise search and tree assembly shared by the fast builders (all rows at once, no host
sync: every depth keeps the same number of nodes in every row, so widths are Python ints).  How the total
order is applied exactly: docs/kernels.md, "How the total order is applied exactly (tensorized path)".
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from dataclasses import dataclass

import torch
from torch import Tensor

from dartree.block import DraftBlock
from dartree.fast import checks, expansion, ops
from dartree.fast.heads import HeadSteps, check_logits_finite
from dartree.fast.keys import lexsort, word_plan
from dartree.fast.results import CandidateSet
from dartree.protocols import CorrectionHead
from dartree.scoring import log_normalize
from dartree.tree import PAD, DraftTree

__all__ = ["Supertree", "candidate_set", "expand", "assemble"]


@dataclass(frozen=True)
class Supertree:
    """Kept nodes of each depth (a list over depths 1..D), each depth in rank-path lex order.

    Shape (per depth d, W_d kept nodes):
        parents[d-1]: int64 ``[b, W_d]`` index into depth d-1's kept nodes (depth 1: 0, the root).
        ranks, tokens: int64 ``[b, W_d]``; scores: float32 ``[b, W_d]``.
        words: int64 ``[b, W_d, w]`` rank-path words (digits: 1-based lex index per depth), or empty.
        log_q: float32 ``[b, gamma, K]`` the per-depth log q of the single branch, when traced.
    """

    parents: list[Tensor]
    ranks: list[Tensor]
    tokens: list[Tensor]
    scores: list[Tensor]
    words: list[Tensor]
    log_q: Tensor | None = None

    @property
    def widths(self) -> list[int]:
        return [p.shape[1] for p in self.parents]


def candidate_set(block: DraftBlock, topk: int, normalize: str) -> CandidateSet:
    """``C_d`` and base log q of every depth of every row (one dispatched kernel); log q is recomputed from
    the kernel's exact outputs with the reference's :func:`dartree.scoring.log_normalize`, so tree scores do not
    depend on the kernel's own (allclose) log-softmax."""
    x = block.logits
    # NaN / +inf never pass (-inf masks a token); read once, at the end of the build (dartree.fast.checks).
    checks.defer(torch.isnan(x).any() | (x == float("inf")).any(),
                 "block.logits: must not hold NaN or +inf (-inf is allowed, to mask tokens)")
    cands = ops.topk_candidates(x, topk, normalize == "vocab")
    checks.defer(cands.logits[..., -1] == float("-inf"),
                 f"topk: a position has fewer than topk={topk} logits above -inf; lower topk, or mask tokens "
                 f"with a large negative finite logit instead of -inf")
    return cands._replace(log_q=log_normalize(cands.logits, cands.rest_lse))


@functools.lru_cache(maxsize=256)
def _layout(widths: tuple[int, ...], device: torch.device) -> tuple[list[Tensor], Tensor, int]:
    """Per-depth digit rows ``[W_d, w]`` (each kept node's 1-based index at its word's place), the
    depth of every flat supertree node ``[N]``, and the number of words.  Cached: widths repeat."""
    plan = word_plan([w + 1 for w in widths])
    digits = []
    for depth, width in enumerate(widths, start=1):
        row = torch.zeros(width, plan.num_words, dtype=torch.int64)
        row[:, plan.word[depth]] = torch.arange(1, width + 1) * plan.place[depth]
        digits.append(row.to(device))
    depths = torch.cat([torch.full((w,), d, dtype=torch.int64) for d, w in enumerate(widths, start=1)])
    return digits, depths.to(device), plan.num_words


class _StopPoll:
    """Whether the bound's stop flag (a 0-d bool tensor per depth) has been seen set, read without a sync:
    at once on the CPU; on CUDA copied to pinned memory behind an event and read once the event completed
    (``query()`` never blocks: the stop lags by the depths in flight); never on other devices (``meta``).
    Expanding past the stop is harmless: no later node can enter the tree (docs/builders.md, "Bound pruning")."""

    def __init__(self, device: torch.device) -> None:
        self.kind = device.type
        self.pending: list[tuple[Tensor, torch.cuda.Event]] = []

    def stop(self, flag: Tensor) -> bool:
        if self.kind == "cpu":
            return bool(flag)  # a CPU tensor: no device to wait for
        if self.kind != "cuda":
            return False
        host = torch.empty((), dtype=torch.bool, pin_memory=True)
        host.copy_(flag, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self.pending.append((host, event))
        while self.pending and self.pending[0][1].query():  # completed copies only: never a sync
            done, _ = self.pending.pop(0)
            if bool(done):  # pinned host memory, already written
                return True
        return False


def expand(block: DraftBlock, cands: CandidateSet, widths: list[int], head: CorrectionHead | None = None,
           beta: float = 0.0, log_q: Tensor | None = None, trace: bool = False, words: bool = True,
           bound: int | None = None) -> Supertree:
    """Depth-wise batched expansion: at depth d keep the best ``widths[d-1]`` children of the kept nodes.

    With a head, one fused ``advance_logits`` call per depth for all branches of all rows (or ``advance`` then
    ``logits``); the last depth's advance is never computed.  Without one, every branch of depth d shares
    ``log_q[:, d-1]`` (default: the base log q).  ``trace`` records each depth's ``[b, 1, K]`` log q (chains
    only); ``words`` builds the rank-path words :func:`assemble` needs to sort a branching supertree.

    ``bound`` (``dartree-pruned``'s budget; docs/builders.md, "Bound pruning"): once the rows hold that many
    nodes, when every frontier node of every row scores, plus ``beta``, strictly below its row's ``bound``-th
    best score, no deeper node can enter the tree and the expansion stops (read through :class:`_StopPoll`).
    No branch is masked (on a GPU a head call costs the same for fewer rows); ties with the threshold are kept.

    Shape:
        cands: :class:`CandidateSet` ``[b, gamma, K]``; log_q: float32 ``[b, gamma, K]`` or None.
    """
    b = block.batch_size
    scores = torch.zeros(b, 1, dtype=torch.float32, device=block.device)  # the root
    states = logits = None
    if head is not None:
        steps = HeadSteps(head, block, cands.tokens)
        states = steps.initial()
        logits = steps.logits(1, states)
    shared = cands.log_q if log_q is None else log_q
    digits, _, num_words = _layout(tuple(widths), block.device)
    path_words = torch.zeros(b, 1, num_words, dtype=torch.int64, device=block.device)
    tree = Supertree(parents=[], ranks=[], tokens=[], scores=[], words=[])
    traced: list[Tensor] = []
    poll = _StopPoll(block.device) if bound is not None else None
    best = None  # [b, <= bound] the best scores so far (running top-bound)
    count = 0  # nodes per row so far (the same in every row)
    for depth, width in enumerate(widths, start=1):
        cand_tokens = cands.tokens[:, depth - 1]  # [b, K]
        if head is not None:
            check_logits_finite(logits)
            lq = log_normalize(logits, cands.rest_lse[:, depth - 1, None])  # [b, m, K], the one formula
        else:
            lq = shared[:, depth - 1 : depth]  # [b, 1, K] shared by every branch
        if trace:
            traced.append(lq)
        step = ops.depth_step(scores, lq, beta, width)
        tokens = torch.gather(cand_tokens, 1, step.ranks)
        if words:
            idx = step.parents[:, :, None].expand(-1, -1, num_words)
            path_words = torch.gather(path_words, 1, idx) + digits[depth - 1]
            tree.words.append(path_words)
        tree.parents.append(step.parents)
        tree.ranks.append(step.ranks)
        tree.tokens.append(tokens)
        tree.scores.append(step.scores)
        scores = step.scores
        count += width
        if poll is not None and depth < len(widths):
            best = step.scores if best is None else torch.cat([best, step.scores], dim=1)
            if count >= bound:
                best = torch.topk(best, bound, dim=1, sorted=False).values
                # every frontier node's best possible child (its score + beta: log q <= 0, float32
                # rounding monotone) below the bound-th best score: nothing deeper enters the tree
                if poll.stop((step.scores.amax(1) + beta < best.amin(1)).all()):
                    break
        if head is not None and depth < len(widths):  # the last depth's advance would never be used
            idx = step.parents[:, :, None].expand(-1, -1, states.shape[-1])
            states, logits = steps.advance_logits(depth, torch.gather(states, 1, idx), tokens)
    done = len(tree.parents)
    expansion.record(expansion.Expansion(depths=done, full_depths=len(widths),
                                         branches=b * (1 + sum(widths[:done - 1])),
                                         full_branches=b * (1 + sum(widths[:-1]))))
    return dataclasses.replace(tree, log_q=torch.cat(traced, dim=1)) if trace else tree


def _flatten(tree: Supertree) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """All kept nodes depth after depth: parents (flat index, -1 = the root), tokens, ranks, scores."""
    offsets = [0, *itertools.accumulate(tree.widths)]
    parents = torch.cat([torch.full_like(tree.parents[0], PAD)]
                        + [p + offsets[d - 1] for d, p in enumerate(tree.parents) if d > 0], dim=1)
    return parents, torch.cat(tree.tokens, 1), torch.cat(tree.ranks, 1), torch.cat(tree.scores, 1)


def assemble(block: DraftBlock, tree: Supertree, budget: int | None, path: bool = False) -> DraftTree:
    """The DraftTree of the best ``budget`` supertree nodes (all when None), sorted by the total order;
    ``path``: the supertree is one chain, whose depth order is the total order (no sort needed)."""
    parents, tokens, ranks, scores = _flatten(tree)
    b, total = scores.shape
    n_out = total if budget is None else min(budget, total)
    dev = scores.device
    depths = _layout(tuple(tree.widths), dev)[1].expand(b, -1)
    if path:
        sel = torch.arange(n_out, device=dev).expand(b, -1)
    else:
        # Lay the nodes out in pre-order (= rank-path order, prefix first); then a top-B whose ties
        # go to the smaller position is exactly the total order.
        perm = lexsort(torch.cat(tree.words, dim=1))
        sel = torch.gather(perm, 1, ops.top_b(torch.gather(scores, 1, perm), n_out))  # [b, n_out] total order
    slot = torch.full((b, total), PAD, dtype=torch.int64, device=dev)
    slot.scatter_(1, sel, torch.arange(1, n_out + 1, device=dev).expand(b, -1))
    par = torch.gather(parents, 1, sel)
    par = torch.where(par < 0, torch.zeros_like(par), torch.gather(slot, 1, par.clamp(min=0)))

    def with_root(root: Tensor, rest: Tensor) -> Tensor:
        return torch.cat([root[:, None], rest], dim=1)

    pad = torch.full((b,), PAD, dtype=torch.int64, device=dev)
    return DraftTree(
        tokens=with_root(block.root, torch.gather(tokens, 1, sel)),
        parents=with_root(pad, par),
        depths=with_root(torch.zeros_like(pad), torch.gather(depths, 1, sel)),
        scores=with_root(torch.zeros(b, dtype=torch.float32, device=dev), torch.gather(scores, 1, sel)),
        ranks=with_root(pad, torch.gather(ranks, 1, sel)),
        num_nodes=torch.full((b,), n_out + 1, dtype=torch.int64, device=dev),
    )
