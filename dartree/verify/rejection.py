"""Sampled draft trees verified by recursive rejection sampling: lossless in distribution at T>0.

Target-sample matching (:func:`~dartree.verify.accept.verify_sampled`) accepts a deterministic child only
with the target's probability of it.  Here the children are *sampled* from the proposal ``q`` at their
parent and verified by recursive rejection sampling without replacement (SpecInfer's multi-step
speculative sampling, with the without-replacement residual of Recursive Speculative Decoding, Jeon et
al. 2024): one draft is then accepted with probability ``1 - TV(p, q)``, and more siblings accept more.

**The tree.**  :func:`sample_tree` keeps the builder's tree *shape* (its parents and the order of each
node's children) and re-draws its tokens: node ``u``'s ``m`` children become the first ``m`` draws
without replacement from ``q_u`` (Gumbel-top-m on ``log q_u``, which is a sequential draw without
replacement), in sibling order.  ``q_u`` is the warped softmax of the block's logits at the children's
depth over the vocabulary (builders without a head), or of the correction head's logits of
``max(topk, 64)`` candidates evaluated along the *sampled* path (builders with one), one batched head
call per depth.  The shape is a function of the block (and head) alone, never of a draw; a node with
fewer tokens of positive ``q`` than children keeps only that many (a function of ``q``, not of a draw).
So every builder is supported, with the proposals each one's head or drafter gives.

**The verifier.**  At an accepted node with target ``p`` (the :class:`~dartree.verify.warp.Warp`ed
distribution) and children ``x_1..x_m`` drawn without replacement from ``q``::

    r, s = p, q
    for i in 1..m:
        accept x_i with probability min(1, r(x_i) / s(x_i))          -> continue at x_i
        r = norm(max(r - s, 0));  s = norm(s with x_i removed)        (rejected)
    bonus ~ r                                                        (all rejected; a leaf: bonus ~ p)

Exactness, by induction from the last sibling: a stage that proposes ``x ~ s`` and outputs ``x`` with
probability ``min(1, r(x)/s(x))``, else the output of a later stage that is distributed as
``norm(max(r - s, 0))`` whatever ``x`` was, outputs ``min(s, r)(v) + (1 - sum min(s, r)) *
norm(max(r - s, 0))(v) = r(v)``.  The later stage's proposal ``s`` minus ``x`` is the law of the next
draw given the earlier ones (without replacement), and its target ``norm(max(r - s, 0))`` does not
depend on ``x``: so each stage is exact for its ``r``, and the first one outputs ``p``.  An accepted
child's own children were drawn from ``q`` at that child independently of everything above, so the
committed sequence has the target's joint law token by token.  Applying ``min(1, p/q)`` to
*deterministic* top-k children instead is biased (tested: the exact enumeration catches it).

Randomness: a ``torch.Generator`` (the decode's ``GeneratorSampler``'s); draws are not keyed, so the
output equals AR in distribution, not token for token (tested by exact enumeration and seeded
statistics).  The walk runs on the host in float64 over the nodes it visits (CPU-oriented; on an
accelerator it is one transfer of the visited rows).

Shape: ``tree`` tensors ``[b, n]``; target logits ``[b, n, V]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from dartree.block import DraftBlock
from dartree.scoring import candidates as top_candidates
from dartree.tree import PAD, DraftTree
from dartree.verify.accept import VerifyResult
from dartree.verify.warp import Warp

__all__ = ["SampledTree", "sample_tree", "verify_rejection", "accept_step", "SAMPLE_CANDIDATES"]

#: candidates per depth a correction head scores when it proposes (at least the builder's ``topk``)
SAMPLE_CANDIDATES = 64


@dataclass(frozen=True)
class SampledTree:
    """A draft tree whose children were drawn from known proposals.

    Shape:
        tree:    the tree (tokens drawn; shape from the builder's tree).
        probs:   float32 ``[b, R, P]`` proposal distributions; node ``u``'s children were drawn from row
                 ``row_of[:, u]``.
        row_of:  int64 ``[b, n]`` (``PAD`` for a node without children).
        support: int64 ``[b, R, P]`` the token of each proposal entry, or ``None`` (``P == V``: entry = token).
    """

    tree: DraftTree
    probs: Tensor
    row_of: Tensor
    support: Tensor | None = None

    def proposal(self, row: int, node: int, vocab: int) -> np.ndarray:
        """Node ``node``'s proposal over the whole vocabulary (float64, host)."""
        r = int(self.row_of[row, node])
        q = self.probs[row, r].double().cpu().numpy()
        q = q / q.sum()                                 # float32 proposals, renormalised in float64
        if self.support is None:
            return q
        full = np.zeros(vocab)
        full[self.support[row, r].cpu().numpy()] = q
        return full


def _draw_without_replacement(q: Tensor, m: int, generator: torch.Generator | None) -> Tensor:
    """The first ``m`` draws without replacement from the distributions ``q`` (rows), in draw order: one draw
    by the inverse of the cumulative distribution, more by Gumbel-top-m (the order of the perturbed keys
    ``log q + G`` is the sequential draw order).

    perf (CPU): a chain's 15 single draws over 4,098 tokens take 0.1 ms by the inverse CDF, 1.0 ms as float64
    Gumbel keys, 1.8 ms with ``torch.multinomial``; several draws use float32 keys.
    """
    if m == 1:
        cdf = q.double().cumsum(-1)
        u = torch.rand((*cdf.shape[:-1], 1), generator=generator, dtype=torch.float64, device=cdf.device)
        # the first token whose cumulative mass exceeds u (a token of mass 0 never is the first)
        return torch.searchsorted(cdf, u * cdf[..., -1:], right=True).clamp_max(cdf.shape[-1] - 1)
    u = torch.rand(q.shape, generator=generator, dtype=torch.float32, device=q.device)
    keys = q.float().log() - torch.log(-torch.log(u.clamp_min(torch.finfo(torch.float32).tiny)))
    return torch.topk(keys, m, dim=-1).indices


def _children(tree: DraftTree) -> list[list[list[int]]]:
    """Per row, per node, its children in sibling order (node index order)."""
    counts, parents = tree.num_nodes.tolist(), tree.parents.tolist()
    out = []
    for r, count in enumerate(counts):
        kids: list[list[int]] = [[] for _ in range(tree.max_nodes)]
        for i in range(1, count):
            kids[parents[r][i]].append(i)
        out.append(kids)
    return out


def sample_tree(template: DraftTree, block: DraftBlock, head=None, warp: Warp | None = None,
                generator: torch.Generator | None = None, topk: int = SAMPLE_CANDIDATES) -> SampledTree:
    """``template``'s shape with tokens drawn from each node's proposal (module docstring).

    ``head``: the correction head (its logits of ``max(topk, SAMPLE_CANDIDATES)`` candidates along the
    sampled path propose), or ``None`` (the block's logits over the vocabulary propose).  ``warp``: the
    proposal's temperature and filters (default: temperature 1).

    Shape:
        template: ``[b, n]`` on the block's device; block.logits ``[b, gamma, V]``.
    """
    warp = Warp(1.0) if warp is None else warp
    logits = block.logits.detach()
    b, gamma, vocab = logits.shape
    if template.batch_size != b:
        raise ValueError(f"template: {template.batch_size} rows, the block has {b}")
    kids = _children(template)
    depths = template.depths.tolist()
    if head is None:
        probs = warp.probs(logits)                                          # [b, gamma, V]: q at each depth
        row_of = torch.where(template.depths < gamma, template.depths, torch.full_like(template.depths, PAD))
        tokens, keep = _draw_vocab(template, kids, depths, probs, generator)
        support = None
    else:
        tokens, keep, probs, support = _draw_head(template, kids, depths, block, head, warp, generator,
                                                  min(vocab, max(topk, SAMPLE_CANDIDATES)))
        row_of = torch.arange(template.max_nodes, device=logits.device).expand(b, -1).clone()
    for r in range(b):                         # nodes without children point nowhere
        for u in range(template.max_nodes):
            if not kids[r][u] or not keep[r][u]:
                row_of[r, u] = PAD
    tree = DraftTree(tokens=torch.tensor(tokens, dtype=torch.int64, device=logits.device), parents=template.parents,
                     depths=template.depths, scores=template.scores, ranks=template.ranks,
                     num_nodes=template.num_nodes)
    sampled = SampledTree(tree, probs, row_of, support)
    if all(all(k) for k in keep):
        return sampled
    mask = torch.tensor(keep, dtype=torch.bool, device=logits.device)
    # a cut is prefix-closed (a dropped node's children are dropped); node indices change, so do the rows
    order = [[u for u in range(template.max_nodes) if keep[r][u]] for r in range(b)]
    width = max(len(o) for o in order)
    index = torch.tensor([o + [o[0]] * (width - len(o)) for o in order], dtype=torch.int64, device=logits.device)
    return SampledTree(tree.select(mask), probs, torch.gather(row_of, 1, index), support)


def _draw_vocab(template: DraftTree, kids, depths, probs: Tensor, generator) -> tuple[list, list]:
    """Every node's children at once: one Gumbel-top-m over the vocabulary per node with children."""
    b, n = template.tokens.shape
    tokens = template.tokens.tolist()
    keep = [[u < c for u in range(n)] for c in template.num_nodes.tolist()]
    parents = [(r, u) for r in range(b) for u in range(n) if keep[r][u] and kids[r][u]]
    if not parents:
        return tokens, keep
    rows = torch.tensor([r for r, _ in parents], dtype=torch.int64, device=probs.device)
    at = torch.tensor([depths[r][u] for r, u in parents], dtype=torch.int64, device=probs.device)
    q = probs[rows, at]                                                  # [k, V] each parent's proposal
    most = max(len(kids[r][u]) for r, u in parents)
    drawn = _draw_without_replacement(q, min(most, q.shape[-1]), generator).tolist()
    positive = (q > 0).sum(-1).tolist()
    for (r, u), row, count in zip(parents, drawn, positive, strict=True):
        for j, child in enumerate(kids[r][u]):
            if j < count:                         # Gumbel keys of q > 0 come before those of q = 0 (-inf)
                tokens[r][child] = row[j]
            else:
                _drop(keep[r], kids[r], child)
    return tokens, keep


def _drop(keep: list[bool], kids: list[list[int]], node: int) -> None:
    keep[node] = False
    for child in kids[node]:
        _drop(keep, kids, child)


def _draw_head(template: DraftTree, kids, depths, block: DraftBlock, head, warp: Warp, generator, k: int):
    """Depth by depth along the sampled path: one head ``logits`` and one ``advance`` call per depth."""
    b, n = template.tokens.shape
    gamma = block.logits.shape[1]
    cand = top_candidates(block, k, "candidates").tokens                  # [b, gamma, K]
    tokens = template.tokens.tolist()
    keep = [[u < c for u in range(n)] for c in template.num_nodes.tolist()]
    root_state = head.initial_state(block)                                 # [b, S]
    states = root_state.new_zeros((b, n, root_state.shape[-1]))
    states[:, 0] = root_state
    probs = torch.zeros(b, n, k, dtype=torch.float32, device=block.logits.device)
    for d in range(1, gamma + 1):
        parents = [[u for u in range(n) if keep[r][u] and depths[r][u] == d - 1 and kids[r][u]] for r in range(b)]
        m = max(len(p) for p in parents)
        if m == 0:
            break
        index = torch.tensor([p + [0] * (m - len(p)) for p in parents], dtype=torch.int64, device=states.device)
        parent_states = torch.gather(states, 1, index[:, :, None].expand(-1, -1, states.shape[-1]))
        q = warp.probs(head.logits(block, d, parent_states, cand[:, d - 1]))       # [b, m, K]
        positive = (q > 0).sum(-1).tolist()
        children, child_parent, child_token = [], [], []
        for r in range(b):
            rows, par, tok = [], [], []
            for j, u in enumerate(parents[r]):
                probs[r, u] = q[r, j]
                allowed = min(len(kids[r][u]), positive[r][j])
                drawn = _draw_without_replacement(q[r, j], allowed, generator).tolist()
                for i, child in enumerate(kids[r][u]):
                    if i < allowed:
                        tokens[r][child] = int(cand[r, d - 1, drawn[i]])
                        rows.append(child)
                        par.append(j)
                        tok.append(tokens[r][child])
                    else:
                        _drop(keep[r], kids[r], child)
            children.append(rows)
            child_parent.append(par)
            child_token.append(tok)
        c = max(len(x) for x in children)
        if c == 0:
            break
        at = torch.tensor([x + [0] * (c - len(x)) for x in child_parent], dtype=torch.int64, device=states.device)
        drawn = torch.tensor([x + [0] * (c - len(x)) for x in child_token], dtype=torch.int64, device=states.device)
        new = head.advance(block, d, torch.gather(parent_states, 1, at[:, :, None].expand(-1, -1, states.shape[-1])),
                           drawn)
        for r in range(b):
            if children[r]:
                states[r, children[r]] = new[r, : len(children[r])]
    support = torch.gather(cand, 1, template.depths.clamp(0, gamma - 1)[:, :, None].expand(-1, -1, k))
    return tokens, keep, probs, support


def accept_step(r: np.ndarray, s: np.ndarray, x: int) -> tuple[float, np.ndarray, np.ndarray]:
    """One sibling of the recursive rejection: the probability of accepting ``x`` (drawn from ``s``), and
    the target and proposal of the next sibling if it is rejected (:mod:`module docstring <dartree.verify.rejection>`).

    Shape: ``r``, ``s``: float64 ``[V]`` distributions (host).
    """
    accept = 1.0 if s[x] <= 0 else min(1.0, r[x] / s[x])
    rest = np.maximum(r - s, 0.0)
    total = rest.sum()
    r_next = rest / total if total > 0 else r          # total == 0 only when rejection had probability 0
    s_next = s.copy()
    s_next[x] = 0.0
    mass = s_next.sum()
    s_next = s_next / mass if mass > 0 else s_next
    return accept, r_next, s_next


def _draw(p: np.ndarray, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(torch.from_numpy(p / p.sum()), 1, generator=generator))


def verify_rejection(sampled: SampledTree, target_logits: Tensor, warp: Warp,
                     generator: torch.Generator | None = None) -> VerifyResult:
    """Recursive rejection sampling down ``sampled.tree`` (module docstring); the committed tokens have the
    distribution of the target's (warped) sampling.

    Shape:
        target_logits: float ``[b, n, V]`` the target's next-token logits at each node.
    """
    tree = sampled.tree
    b, n = tree.tokens.shape
    if target_logits.dim() != 3 or tuple(target_logits.shape[:2]) != (b, n):
        raise ValueError(f"target_logits: expected shape [{b}, {n}, V], got {tuple(target_logits.shape)}")
    vocab = target_logits.shape[-1]
    kids = _children(tree)
    tokens = tree.tokens.tolist()
    paths, bonus = [], []
    for row in range(b):
        u, path = 0, [0]
        while True:
            p = warp.logits(target_logits[row, u]).double().softmax(-1).cpu().numpy()
            if not kids[row][u]:
                bonus.append(_draw(p, generator))
                break
            r, s, nxt = p, sampled.proposal(row, u, vocab), None
            for child in kids[row][u]:
                accept, r_next, s_next = accept_step(r, s, tokens[row][child])
                if float(torch.rand((), generator=generator, dtype=torch.float64)) < accept:
                    nxt = child
                    break
                r, s = r_next, s_next
            if nxt is None:
                bonus.append(_draw(r, generator))
                break
            path.append(nxt)
            u = nxt
        paths.append(path)
    accepted = [path + [PAD] * (n - len(path)) for path in paths]
    committed = [[tokens[row][i] for i in paths[row][1:]] + [bonus[row]] for row in range(b)]
    committed = [c + [PAD] * (n - len(c)) for c in committed]
    device = tree.device
    out = torch.tensor([accepted, committed], dtype=torch.int64, device=device)
    lengths = torch.tensor([len(p) - 1 for p in paths], dtype=torch.int64, device=device)
    picks = torch.full((b, n), PAD, dtype=torch.int64, device=device)
    return VerifyResult(accepted=out[0], accepted_length=lengths, bonus=torch.tensor(bonus, device=device),
                        tokens=out[1], picks=picks)
