"""Sampled draft trees (children drawn without replacement from known proposals) and their verification by
recursive rejection sampling: lossless in law at T>0.  How and why: docs/verification.md, "Sampled trees
verified by rejection sampling".  Shape: ``tree`` tensors ``[b, n]``; target logits ``[b, n, V]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from dartree.arguments import check_int
from dartree.block import DraftBlock
from dartree.protocols import head_method
from dartree.scoring import candidates as top_candidates
from dartree.tree import PAD, DraftTree, children_lists
from dartree.verify.accept import VerifyResult, check_logits, host_result
from dartree.verify.sampling import inverse_cdf
from dartree.verify.warp import Warp

__all__ = ["SampledTree", "HostLists", "sample_tree", "verify_rejection", "walk_coins", "accept_step",
           "draw_index", "proposal_probs", "proposal_row", "HEAD_DEPTHS", "NUCLEUS_CANDIDATES"]

#: the depths a correction head proposes at in a decode (the drafter below).  Each depth costs one head call
#: and a draw, and the sampled path reaches depth 3 too rarely for the head's proposal there to pay: deeper
#: head depths gave no more tau than 2 (figures: docs/results.md, "Measurements behind design choices in the
#: code").
HEAD_DEPTHS = 2


class HostLists(NamedTuple):
    """:func:`sample_tree`'s host lists of the tree it made (``[b][n]`` each): the children of every node in sibling
    order, the tokens, each node's proposal row (``PAD`` where none) and the ``stated`` flags (``None`` without a
    head)."""

    children: list
    tokens: list
    row_of: list
    stated: list | None


@dataclass(frozen=True)
class SampledTree:
    """A draft tree whose children were drawn from known proposals.

    Shape:
        tree:    the tree (tokens drawn; shape from the builder's tree).
        probs:   float32 ``[b, R, P]`` proposal distributions; node ``u``'s children were drawn from row
                 ``row_of[:, u]``.
        row_of:  int64 ``[b, n]`` (``PAD`` for a node without children).
        support: int64 ``[b, R, P]`` the token of each proposal entry, or ``None`` (``P == V``: entry = token).
        states:  ``[b, n, S]`` the head's state after each node's path, where ``stated`` (bool ``[b, n]``) is
                 set: the root and the nodes whose children the head proposed; ``None`` without a head.
    """

    tree: DraftTree
    probs: Tensor
    row_of: Tensor
    support: Tensor | None = None
    states: Tensor | None = None
    stated: Tensor | None = None
    #: perf: (tree, row_of, :class:`HostLists`) from :func:`sample_tree`, so that a verifier's walk and block reuse
    #: read no tensor back; used only while ``tree`` and ``row_of`` are still the objects they describe
    made: tuple | None = field(default=None, compare=False, repr=False)

    def host_lists(self) -> HostLists | None:
        """The host lists :func:`sample_tree` made of this tree, or ``None`` (not made, or the tree was replaced)."""
        made = self.made
        if made is None or made[0] is not self.tree or made[1] is not self.row_of:
            return None
        return made[2]

    def host_proposals(self) -> tuple[np.ndarray, np.ndarray | None]:
        """``probs`` and ``support`` as host arrays (``support`` ``None`` when ``P == V``)."""
        return self.probs.cpu().numpy(), None if self.support is None else self.support.cpu().numpy()


def proposal_row(probs: np.ndarray, support: np.ndarray | None, row: int, r: int, vocab: int) -> np.ndarray:
    """Proposal row ``r`` of ``row`` over the whole vocabulary, float64 renormalised (host arrays)."""
    q = probs[row, r].astype(np.float64)
    q /= q.sum()                                        # float32 proposals, renormalised in float64
    if support is None:
        return q
    full = np.zeros(vocab)
    full[support[row, r]] = q
    return full


#: top-p of a proposal is taken over this many most likely tokens (:func:`proposal_probs`)
NUCLEUS_CANDIDATES = 256


def proposal_probs(warp: Warp, logits: Tensor) -> Tensor:
    """The distribution children are drawn from: ``warp.probs(logits)`` without top-p, else the nucleus (the most
    likely tokens until their mass reaches ``top_p``) of the ``NUCLEUS_CANDIDATES`` most likely, renormalised; why
    that stays exact and pays: docs/verification.md, "Proposals under top-p".

    Shape: float ``[..., V]`` -> float32 ``[..., V]``.
    """
    if warp.top_p is None or warp.top_p >= 1.0:
        return warp.probs(logits)
    probs = Warp(warp.temperature, warp.top_k, None, warp.min_p).probs(logits)
    top, index = probs.topk(min(NUCLEUS_CANDIDATES, probs.shape[-1]), dim=-1)
    kept = top * ((top.cumsum(dim=-1) - top) < warp.top_p)          # the first token is always kept
    q = torch.zeros_like(probs).scatter_(-1, index, kept)
    return q / q.sum(dim=-1, keepdim=True)


def _draw_without_replacement(q: Tensor, m: int, generator: torch.Generator | None) -> Tensor:
    """The first ``m`` draws without replacement from the rows of ``q``, in draw order: one by the inverse CDF
    (perf: several times cheaper on the CPU), more by Gumbel-top-m (the key order is the sequential draw order).
    Tokens of mass 0 come last.  Shape: ``q`` float ``[..., V]`` -> int64 ``[..., m]``."""
    if m == 1:
        return inverse_cdf(q, generator)
    u = torch.rand(q.shape, generator=generator, dtype=torch.float32, device=q.device)
    # log q + G orders as q / E with E = -log u ~ Exp(1) (one log over V instead of three)
    keys = q.float() / u.clamp_min(torch.finfo(torch.float32).tiny).log_().neg_()
    return torch.topk(keys, m, dim=-1).indices


def _draws(q: Tensor, m: int, generator: torch.Generator | None) -> tuple[list, list]:
    """:func:`_draw_without_replacement` as host lists, and per row how many of the ``m`` draws have positive mass
    (they come first: a node with more children than that keeps only that many).

    Shape: ``q`` float ``[..., V]`` -> ``[...][m]`` tokens (or candidate indices), ``[...]`` counts.
    """
    one_row = q.device.type == "cpu" and q.numel() == q.shape[-1]
    if m == 1 and one_row:
        token = _inverse_cdf_host(q, generator)
        if q.dim() == 3:            # perf: a one-row depth's one parent (_draw_head), its nesting written out
            return [[[token]]], [[1]]
        return _nested([token], q.dim() - 1), _ones(q.shape[:-1])
    drawn = _draw_without_replacement(q, m, generator)
    if m == 1:      # one draw: any proposal has a token of positive mass (perf: no gather, no tensor of ones)
        return drawn.tolist(), _ones(q.shape[:-1])
    if one_row:     # perf: the masses of the m draws read on the host (no gather, compare and sum ops)
        row, mass = drawn.reshape(-1).tolist(), q.reshape(-1).numpy()
        return _nested(row, q.dim() - 1), _nested(sum(1 for x in row if mass[x] > 0), q.dim() - 1)
    return drawn.tolist(), (q.gather(-1, drawn.to(q.device)) > 0).sum(-1).tolist()


def _inverse_cdf_host(q: Tensor, generator: torch.Generator | None) -> int:
    """:func:`_draw_without_replacement`'s one draw from one CPU row, bit for bit: the same uniform and cumulative
    sums, the point and the search on the host (perf: four small ops fewer; the product, ``nextafter`` and the
    right-side search are the same IEEE operations in numpy).

    Shape: ``q`` float ``[1, ..., 1, V]`` on the CPU -> the token.
    """
    u = torch.rand((*q.shape[:-1], 1), generator=generator, dtype=torch.float64, device=q.device)
    cdf = q.reshape(-1).cumsum(0, dtype=torch.float64).numpy()
    total = float(cdf[-1])
    # host read: a CPU tensor, no device sync; math's nextafter on a float is numpy's on a float64 (perf)
    point = min(u.item() * total, math.nextafter(total, 0.0))
    return int(cdf.searchsorted(point, side="right"))


def _nested(x, depth: int):
    """``x`` inside ``depth`` one-element lists (a one-row draw in the nesting of ``tolist``)."""
    for _ in range(depth):
        x = [x]
    return x


def _ones(shape: tuple[int, ...]) -> list:
    """Nested host lists of 1 of ``shape`` (``torch.ones(shape).tolist()``)."""
    return 1 if not shape else [_ones(shape[1:]) for _ in range(shape[0])]


def sample_tree(template: DraftTree, block: DraftBlock, head=None, warp: Warp | None = None,
                generator: torch.Generator | None = None, topk: int | None = None,
                head_depths: int | None = None, offset: int = 0, root_state: Tensor | None = None) -> SampledTree:
    """``template``'s shape with tokens drawn from each node's proposal: a correction ``head``'s along the
    sampled path, or the block's logits (``head=None``).  The arguments: docs/verification.md, "Sampled trees
    verified by rejection sampling" (API).

    Shape:
        template: ``[b, n]`` on the block's device, depths ``<= gamma - offset``; block.logits ``[b, gamma, V]``;
        root_state: ``[b, S]``.
    """
    warp = Warp(1.0) if warp is None else warp
    if not isinstance(template, DraftTree):
        raise ValueError(f"template: expected a DraftTree, got {type(template).__name__}")
    if not isinstance(warp, Warp):
        raise ValueError(f"warp: expected a dartree.verify.warp.Warp or None, got {type(warp).__name__}")
    check_int("topk", topk, optional=True)
    check_int("head_depths", head_depths, optional=True)
    check_int("offset", offset, low=0)
    if head is not None and offset > 0 and root_state is None:
        raise ValueError("root_state: a head proposing below a reused block's depth 0 needs the state after the "
                         f"{offset} committed tokens; got None")
    if head_depths is not None and topk is not None:
        raise ValueError("head_depths: the drafter proposes past head_depths over the whole vocabulary; "
                         f"pass topk=None with it, got topk={topk!r}")
    logits = block.logits.detach()
    b, gamma, vocab = logits.shape
    if template.batch_size != b:
        raise ValueError(f"template: {template.batch_size} rows, the block has {b}")
    if template.device != logits.device:
        raise ValueError(f"template: on {template.device}, the block on {logits.device}")
    # one host read of the template's integers: the draws are placed on the host
    n = template.max_nodes
    host = torch.cat([template.parents, template.depths, template.tokens, template.num_nodes[:, None]], dim=1).tolist()
    counts = [h[3 * n] for h in host]
    depths = [h[n: 2 * n] for h in host]
    kids = [children_lists(host[r][:n], counts[r]) for r in range(b)]
    tokens = [h[2 * n: 3 * n] for h in host]
    keep = [[u < c for u in range(n)] for c in counts]
    deepest = max(depths[r][u] for r, c in enumerate(counts) for u in range(c))
    if deepest + offset > gamma:
        raise ValueError(f"template: a node deeper than the block's gamma={gamma} (offset {offset})")
    states = stated = stated_host = None
    if head is None:
        # q at each depth that has parents (perf: a filter's sort is per row): [b, D, V]
        probs = proposal_probs(warp, logits[:, offset: offset + max(1, deepest)])
        rows, support = depths, None
        pairs = [(r, u) for r in range(b) for u in range(n) if keep[r][u] and kids[r][u]]
        if pairs:
            at = torch.tensor([[r for r, _ in pairs], [depths[r][u] for r, u in pairs]], dtype=torch.int64,
                              device=logits.device)
            _draw_rows(tokens, keep, kids, pairs, probs[at[0], at[1]], generator)     # [pairs, V] proposals
    else:
        probs, support, rows, (states, stated, stated_host) = _draw_head(
            tokens, keep, kids, depths, block, head, warp, generator, vocab if topk is None else min(vocab, topk),
            gamma if head_depths is None else min(gamma, head_depths), offset, root_state)
    # nodes without (kept) children point nowhere; tokens and rows in one tensor
    row_host = [[rows[r][u] if kids[r][u] and keep[r][u] else PAD for u in range(n)] for r in range(b)]
    both = torch.tensor([tokens, row_host], dtype=torch.int64, device=logits.device)
    tree = DraftTree(tokens=both[0], parents=template.parents, depths=template.depths, scores=template.scores,
                     ranks=template.ranks, num_nodes=template.num_nodes)
    row_of = both[1]
    if all(all(k) for k in keep):
        made = (tree, row_of, HostLists(kids, tokens, row_host, stated_host))
        return SampledTree(tree, probs, row_of, support, states, stated, made)
    mask = torch.tensor(keep, dtype=torch.bool, device=logits.device)
    # a cut is prefix-closed (a dropped node's children are dropped); node indices change, so do the rows
    order = [[u for u in range(template.max_nodes) if keep[r][u]] for r in range(b)]
    width = max(len(o) for o in order)
    index = torch.tensor([o + [o[0]] * (width - len(o)) for o in order], dtype=torch.int64, device=logits.device)
    if states is not None:
        states = torch.gather(states, 1, index[:, :, None].expand(-1, -1, states.shape[-1]))
        stated = torch.gather(stated, 1, index)
    kept = tree.select(mask)
    valid = torch.arange(width, device=logits.device)[None] < kept.num_nodes[:, None]
    row_of = torch.where(valid, torch.gather(row_of, 1, index), torch.full_like(index, PAD))   # padding: no row
    return SampledTree(kept, probs, row_of, support, states, stated)


def _draw_rows(tokens: list, keep: list, kids, pairs: list[tuple[int, int]], q: Tensor, generator) -> None:
    """The children of every (row, node) of ``pairs`` at once, one draw without replacement from its row of ``q``
    ``[len(pairs), V]`` each (placed in ``tokens`` and ``keep``, host lists ``[b][n]``; pairs in node order, so a
    node cut by an earlier placement is skipped)."""
    most = max(len(kids[r][u]) for r, u in pairs)
    drawn, positive = _draws(q, min(most, q.shape[-1]), generator)
    for (r, u), row, count in zip(pairs, drawn, positive, strict=True):
        if keep[r][u]:
            _place(tokens[r], keep[r], kids[r], u, row, count)


def _place(tokens: list[int], keep: list[bool], kids: list[list[int]], node: int, drawn: list[int],
           positive: int) -> None:
    """Node ``node``'s children get the draws in sibling order; children past ``q``'s positive mass are cut."""
    for j, child in enumerate(kids[node]):
        if j < positive:
            tokens[child] = drawn[j]
        else:
            _drop(keep, kids, child)


def _drop(keep: list[bool], kids: list[list[int]], node: int) -> None:
    keep[node] = False
    for child in kids[node]:
        _drop(keep, kids, child)


def _draw_head(tokens: list, keep: list, kids, depths, block: DraftBlock, head, warp: Warp, generator, k: int,
               head_depths: int, offset: int = 0, root_state: Tensor | None = None):
    """Depth by depth along the sampled path: one head ``logits``, one draw and one ``advance`` call per depth,
    for the children at depths ``<= head_depths``; deeper children, all at once, from the drafter's ``q`` at
    their depth (over the whole vocabulary: ``k == V``).

    Places the draws in ``tokens`` and ``keep`` (host lists ``[b][n]``); returns the proposals ``[b, R, P]`` (one
    row per parent node, in the order they were drawn: a depth's parents padded to the batch's most), the support
    (``None`` when ``P == V``), ``row_of`` (host ``[b][n]``: each parent's row, ``PAD`` elsewhere) and the head's
    states with their flags (a tensor and the host lists).
    """
    b, n = len(tokens), len(tokens[0])
    vocab = block.logits.shape[-1]
    device = block.logits.device
    # [b, gamma, K]; None: the whole vocabulary, in token order (a candidate index is its token)
    cand = top_candidates(block, k, "candidates").tokens if k < vocab else None
    cand_host = cand.tolist() if cand is not None else None
    vocab_logits = head_method(head, "vocab_logits") if k == vocab else None
    row_of = [[PAD] * n for _ in range(b)]
    blocks: list[Tensor] = []             # proposal rows, [b, m, P] per depth (then the drafter's)
    slot_depth: list[int] = []            # the block depth (0-based) each row's candidates come from
    if root_state is None:
        root_state = head.initial_state(block)                             # [b, S]
    states = root_state.new_zeros((b, n, root_state.shape[-1]))
    states.select(1, 0).copy_(root_state)      # perf: select/narrow/copy_ cost less than indexing's parsing
    stated = [[u == 0 for u in range(n)] for _ in range(b)]     # the nodes whose state is made (for children)
    for d in range(1, head_depths + 1):
        parents = [[u for u in range(n) if keep[r][u] and depths[r][u] == d - 1 and kids[r][u]] for r in range(b)]
        m = max(len(p) for p in parents)
        if m == 0:
            break
        first = parents[0][0] if parents[0] else 0
        if b == 1 and parents[0] == list(range(first, first + m)):     # perf: a slice, no index tensor and gather
            parent_states = states.narrow(1, first, m)
        else:
            index = torch.tensor([p + [0] * (m - len(p)) for p in parents], dtype=torch.int64, device=device)
            parent_states = torch.gather(states, 1, index[:, :, None].expand(-1, -1, states.shape[-1]))
        if vocab_logits is None:
            every = cand[:, offset + d - 1] if cand is not None else \
                torch.arange(vocab, device=device).expand(b, vocab)
            q = proposal_probs(warp, head.logits(block, offset + d, parent_states, every))   # [b, m, K]
        else:
            q = proposal_probs(warp, vocab_logits(block, offset + d, parent_states))         # [b, m, V]
        for r in range(b):
            for j, u in enumerate(parents[r]):
                row_of[r][u] = len(slot_depth) + j
        blocks.append(q)
        slot_depth += [offset + d - 1] * m
        most = max(len(kids[r][u]) for r in range(b) for u in parents[r])
        drawn, positive = _draws(q, min(most, k), generator)    # [b, m, most] candidate indices, [b, m]
        child_parent, child_token, children = [], [], []
        for r in range(b):
            for j, u in enumerate(parents[r]):
                picks = drawn[r][j] if cand_host is None else [cand_host[r][offset + d - 1][i] for i in drawn[r][j]]
                _place(tokens[r], keep[r], kids[r], u, picks, positive[r][j])
            rows = [(j, c) for j, u in enumerate(parents[r]) for c in kids[r][u] if keep[r][c] and kids[r][c]]
            children.append([c for _, c in rows])
            child_parent.append([j for j, _ in rows])
            child_token.append([tokens[r][c] for _, c in rows])
        c = max(len(x) for x in children)
        if c == 0 or d == head_depths:            # no child has children of its own (a state is for its children)
            break
        if b == 1 and child_parent[0] == list(range(m)):       # perf: each parent has one child with children
            new = head.advance(block, offset + d, parent_states,
                               torch.tensor(child_token, dtype=torch.int64, device=device))          # [b, c, S]
        else:
            pairs = torch.tensor([[x + [0] * (c - len(x)) for x in child_parent],
                                  [x + [0] * (c - len(x)) for x in child_token]], dtype=torch.int64, device=device)
            at = pairs[0]
            new = head.advance(block, offset + d,
                               torch.gather(parent_states, 1, at[:, :, None].expand(-1, -1, states.shape[-1])),
                               pairs[1])                                              # [b, c, S]
        for r in range(b):
            if children[r]:
                if b == 1 and children[0] == list(range(children[0][0], children[0][0] + c)):    # perf: 3 ops
                    states.narrow(1, children[0][0], c).copy_(new)
                elif children[r] == list(range(children[r][0], children[r][0] + len(children[r]))):
                    states.select(0, r).narrow(0, children[r][0], len(children[r])).copy_(
                        new.select(0, r).narrow(0, 0, len(children[r])))                    # a slice: cheaper
                else:
                    states[r, children[r]] = new[r, : len(children[r])]
                for c in children[r]:
                    stated[r][c] = True
    if k == vocab:
        deeper = [[u for u in range(n) if keep[r][u] and kids[r][u] and depths[r][u] >= head_depths] for r in range(b)]
        m = max(len(x) for x in deeper)
        if m:
            pairs = [(r, u) for r in range(b) for u in deeper[r]]
            rows = torch.tensor([[r for r, _ in pairs], [depths[r][u] + offset for r, u in pairs]], dtype=torch.int64,
                                device=device)
            q = proposal_probs(warp, block.logits.detach()[rows[0], rows[1]])               # [pairs, V]
            _draw_rows(tokens, keep, kids, pairs, q, generator)
            first = [0] * b                       # each row's pairs, then padding: a [b, m, V] block of rows
            for r, u in pairs:
                row_of[r][u] = len(slot_depth) + first[r]
                first[r] += 1
            if b == 1:
                blocks.append(q[None])
            else:
                starts = [0] * b
                for r in range(1, b):
                    starts[r] = starts[r - 1] + len(deeper[r - 1])
                # a row's padding repeats its last pair; a row with no pair points at pair 0 (never read)
                sel = torch.tensor([[starts[r] + min(j, len(deeper[r]) - 1) if deeper[r] else 0 for j in range(m)]
                                    for r in range(b)], dtype=torch.int64, device=device)
                blocks.append(q[sel])
            slot_depth += [PAD] * m
    probs = (blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=1)) if blocks else \
        torch.zeros(b, 0, k, dtype=torch.float32, device=device)
    states_out = (states, torch.tensor(stated, dtype=torch.bool, device=device), stated)
    if cand is None:
        return probs, None, row_of, states_out
    support = cand[:, torch.tensor(slot_depth, dtype=torch.int64, device=device)] if slot_depth else \
        torch.zeros(b, 0, k, dtype=torch.int64, device=device)
    return probs, support, row_of, states_out


def accept_step(r: np.ndarray, s: np.ndarray, x: int) -> tuple[float, np.ndarray, np.ndarray]:
    """One sibling of the recursive rejection: the probability of accepting ``x`` (drawn from ``s``), and
    the target and proposal of the next sibling if it is rejected (:mod:`module docstring <dartree.verify.rejection>`).

    Shape: ``r``, ``s``: float64 ``[V]`` distributions (host).
    """
    return (_accept_probability(r, s, x), *_after_rejection(r, s, x))


def _accept_probability(r: np.ndarray, s: np.ndarray, x: int) -> float:
    return 1.0 if s[x] <= 0 else min(1.0, r[x] / s[x])


def _after_rejection(r: np.ndarray, s: np.ndarray, x: int) -> tuple[np.ndarray, np.ndarray]:
    """The next sibling's target ``norm(max(r - s, 0))`` and proposal ``s`` without ``x``."""
    rest = np.maximum(r - s, 0.0)
    total = rest.sum()
    r_next = rest / total if total > 0 else r          # total == 0 only when rejection had probability 0
    s_next = s.copy()
    s_next[x] = 0.0
    mass = s_next.sum()
    s_next = s_next / mass if mass > 0 else s_next
    return r_next, s_next


def draw_index(p: np.ndarray, u: float) -> int:
    """The token the uniform ``u`` in ``[0, 1)`` draws from ``p`` by the inverse CDF (never one of mass 0).

    Shape: ``p`` float64 ``[V]`` (host; need not sum to 1).
    """
    # perf: torch's CPU cumsum adds in order as numpy's does (the same float64 sums: tested), and faster
    cdf = torch.from_numpy(np.ascontiguousarray(p, dtype=np.float64)).cumsum(0).numpy()
    i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    if i < cdf.shape[0]:        # cdf[i] > u * total >= cdf[i - 1] (or 0): p[i] > 0, so no token of mass 0 (perf)
        return i
    return int(np.flatnonzero(p > 0)[-1])      # u * total rounded up to the total


def walk_coins(sampled: SampledTree, target_logits: Tensor, warp: Warp,
               generator: torch.Generator | None) -> np.ndarray:
    """The arguments of a sampled tree's verifier (:func:`verify_rejection`,
    :func:`~dartree.verify.traversal.verify_traversal`) checked (a ``ValueError`` names the one that is not what
    it takes), then every coin its host walk may use, in one draw: float64 uniforms ``[b, n]`` on the host
    (``generator`` on any device; ``None``: torch's global one)."""
    if not isinstance(sampled, SampledTree):
        raise ValueError(f"sampled: expected a SampledTree (from sample_tree), got {type(sampled).__name__}")
    if not isinstance(warp, Warp):
        raise ValueError(f"warp: expected a dartree.verify.warp.Warp, got {type(warp).__name__}")
    check_logits(sampled.tree, target_logits)
    device = generator.device if generator is not None else torch.device("cpu")
    # host read on purpose: the walk runs on the host
    return torch.rand(sampled.tree.tokens.shape, generator=generator, dtype=torch.float64,
                      device=device).cpu().numpy()


def verify_rejection(sampled: SampledTree, target_logits: Tensor, warp: Warp,
                     generator: torch.Generator | None = None) -> VerifyResult:
    """Recursive rejection sampling down ``sampled.tree`` (module docstring); the committed tokens have the
    distribution of the target's (warped) sampling.

    ``generator``: the coins' (:func:`walk_coins`), one per sibling tested and one for the bonus, used in walk
    order.  The returned ``picks`` are all ``PAD`` (no token is sampled at a node).

    Shape:
        target_logits: float ``[b, n, V]`` the target's next-token logits at each node (unwarped).
        returns: a :class:`~dartree.verify.accept.VerifyResult`, as :func:`~dartree.verify.accept.verify_sampled`'s.
    """
    coins = walk_coins(sampled, target_logits, warp, generator)
    tree = sampled.tree
    b, n = tree.tokens.shape
    vocab = target_logits.shape[-1]
    # one host read of the tree's integers (parents, tokens, proposal rows, node counts): the walk runs on the host
    ints = torch.cat([tree.parents, tree.tokens, sampled.row_of.to(tree.device), tree.num_nodes[:, None]], dim=1)
    host = ints.tolist()
    probs, support = sampled.host_proposals()                          # float32 [b, R, P] proposals
    paths, committed = [], []             # per row: the accepted nodes (root first), the committed tokens
    for row in range(b):
        parents, tokens, row_of = host[row][:n], host[row][n: 2 * n], host[row][2 * n: 3 * n]
        kids = children_lists(parents, host[row][3 * n])
        u, path, used = 0, [0], 0
        while True:
            # the target's distribution at the visited node only (float64, host): a softmax over V is the walk's cost
            r = warp.logits(target_logits[row, u]).softmax(-1, dtype=torch.float64).cpu().numpy()
            nxt = None
            if kids[u]:
                s = proposal_row(probs, support, row, row_of[u], vocab)
                for child in kids[u]:
                    # accept_step, its residuals computed only on a rejection (perf: 3 of its 4 passes over V)
                    used += 1
                    if coins[row, used - 1] < _accept_probability(r, s, tokens[child]):
                        nxt = child
                        break
                    r, s = _after_rejection(r, s, tokens[child])
            if nxt is None:               # a leaf, or every child rejected: the bonus ~ the residual
                paths.append(path)
                committed.append([tokens[i] for i in path[1:]] + [draw_index(r, coins[row, used])])
                break
            path.append(nxt)
            u = nxt
    return host_result(paths, committed, None, n, tree.device)          # picks: none sampled at a node
