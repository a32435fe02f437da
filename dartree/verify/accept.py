"""Greedy and sampled (target-sample matching) verification of a draft tree against the target's logits at its
nodes: the walk from the root follows the child whose token is the target's pick at its parent (docs/verification.md,
"Acceptance").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from dartree.fast import ops
from dartree.protocols import check_sampler
from dartree.tree import PAD, DraftTree
from dartree.verify.sampling import GeneratorSampler, KeyedSampler, Sampler, check_temperature, sample_checked

__all__ = ["VerifyResult", "verify_greedy", "verify_sampled", "accept_picks", "walk_greedy", "walk_sampled",
           "check_logits", "host_result"]


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of verifying a batch of trees.

    Shape:
        accepted:        int64 ``[b, n]`` node indices of the accepted path, root first, then
                         ``accepted_length`` draft nodes in root-to-leaf order; -1 after.
        accepted_length: int64 ``[b]`` accepted draft nodes (root excluded).
        bonus:           int64 ``[b]`` the target's pick at the last accepted node.
        tokens:          int64 ``[b, n]`` committed tokens: the accepted draft tokens, then the
                         bonus (``accepted_length + 1`` of them); -1 after.
        picks:           int64 ``[b, n]`` the target's pick at every node; -1 in padding.
    """

    accepted: Tensor
    accepted_length: Tensor
    bonus: Tensor
    tokens: Tensor
    picks: Tensor


def check_logits(tree: DraftTree, target_logits: Tensor) -> None:
    """``ValueError`` unless ``target_logits`` is float ``[b, n, V]`` on the tree's device."""
    b, n = tree.tokens.shape
    if not isinstance(target_logits, Tensor) or target_logits.dim() != 3 or target_logits.shape[:2] != (b, n):
        got = tuple(target_logits.shape) if isinstance(target_logits, Tensor) else type(target_logits).__name__
        raise ValueError(f"target_logits: expected shape [{b}, {n}, V] (the tree's batch and nodes), got {got}")
    if not target_logits.is_floating_point():
        raise ValueError(f"target_logits: expected a floating dtype, got {target_logits.dtype}")
    if target_logits.device != tree.device:
        raise ValueError(f"target_logits: on {target_logits.device}, tree on {tree.device}")


def accept_picks(tree: DraftTree, picks: Tensor) -> VerifyResult:
    """Walk each tree from its root following the target's ``picks``; no host sync.

    Shape:
        picks: int64 ``[b, n]`` the target's token at each node.
    """
    b, n = tree.tokens.shape
    if picks.shape != (b, n) or picks.dtype != torch.int64:
        raise ValueError(f"picks: expected int64 [{b}, {n}], got {picks.dtype} {tuple(picks.shape)}")
    valid = tree.valid()
    picks = torch.where(valid, picks, torch.full_like(picks, PAD))
    walk = ops.greedy_walk(tree.tokens, tree.parents, tree.num_nodes, picks)
    accepted, accepted_length, bonus = walk.accepted, walk.accepted_length, walk.bonus
    slots = torch.arange(n, device=tree.device)[None, :]
    # committed token k is the token of accepted node k + 1, or the bonus at k == accepted_length.
    next_node = torch.cat([accepted[:, 1:], torch.full_like(accepted[:, :1], PAD)], dim=1)
    draft_tok = torch.gather(tree.tokens, 1, next_node.clamp(min=0))
    tokens = torch.where(slots < accepted_length[:, None], draft_tok, torch.full_like(draft_tok, PAD))
    tokens = torch.where(slots == accepted_length[:, None], bonus[:, None], tokens)
    return VerifyResult(accepted=accepted, accepted_length=accepted_length, bonus=bonus, tokens=tokens,
                        picks=picks)


def verify_greedy(tree: DraftTree, target_logits: Tensor) -> VerifyResult:
    """Greedy (T=0) verification: the target's pick at each node is its argmax.

    Shape:
        target_logits: float ``[b, n, V]`` the target's next-token logits at each node.
    """
    check_logits(tree, target_logits)
    return accept_picks(tree, target_logits.argmax(dim=-1))


def verify_sampled(
    tree: DraftTree,
    target_logits: Tensor,
    temperature: float,
    sampler: Sampler,
    prefix_len: int | Tensor = 0,
) -> VerifyResult:
    """Sampled (T>0) verification by exact target-sample matching: one draw from ``softmax(target_logits.float()
    / temperature)`` at every node, at the absolute position its token will occupy (docs/verification.md,
    "Acceptance").

    Shape:
        target_logits: float ``[b, n, V]``.
        prefix_len:    int or int64 ``[b]`` (the root's absolute position).
    """
    check_logits(tree, target_logits)
    if check_temperature(temperature) == 0:
        raise ValueError("temperature: 0 is greedy; use verify_greedy (verify_sampled needs a temperature > 0)")
    check_sampler(sampler)
    positions = tree.positions(prefix_len) + 1
    picks = sample_checked(sampler, target_logits.float() / temperature, positions)   # float32: as generate_ar
    return accept_picks(tree, picks.to(torch.int64))


def walk_greedy(tree: DraftTree, root_logits: Tensor,
                node_logits: Callable[[list[int], list[int]], Tensor]) -> VerifyResult:
    """Greedy verification that scores only the nodes the walk visits (one ``node_logits`` call per depth for all
    the rows still walking).  Equal to ``verify_greedy(tree, logits)`` when ``node_logits(rows, nodes)`` is
    ``logits[rows, nodes]`` and ``root_logits`` is ``logits[:, 0]``, except that ``picks`` holds ``PAD`` at the
    nodes never scored.  Host-side walk: meant for CPU trees.

    Shape:
        root_logits: float ``[b, V]``; node_logits(rows, nodes) -> float ``[k, V]`` for the ``k``
        (row, node) pairs given, every node ``>= 1``.
    """
    return _walk(tree, root_logits, node_logits, lambda logits, rows, nodes: logits.argmax(-1).tolist())


def walk_sampled(tree: DraftTree, root_logits: Tensor, node_logits: Callable[[list[int], list[int]], Tensor],
                 temperature: float, sampler: KeyedSampler | GeneratorSampler,
                 prefix_len: int | Tensor = 0) -> VerifyResult:
    """:func:`verify_sampled` that draws (and runs the LM head) only at the nodes the walk visits: with a
    ``KeyedSampler`` the result equals it (``picks`` ``PAD`` at the nodes never scored); with a
    ``GeneratorSampler`` each visited node draws afresh, AR's sampling in law (docs/verification.md,
    "Acceptance").  Host-side walk: meant for CPU trees.

    Shape:
        root_logits: float ``[b, V]``; node_logits(rows, nodes) -> float ``[k, V]``; prefix_len: int or
        int64 ``[b]`` (the root's absolute position).
    """
    if not isinstance(sampler, KeyedSampler) and type(sampler) is not GeneratorSampler:
        raise ValueError(f"sampler: walk_sampled needs a KeyedSampler or a GeneratorSampler (a sampler known to "
                         f"draw each call afresh), got {type(sampler).__name__}; use verify_sampled")
    if check_temperature(temperature) == 0:
        raise ValueError("temperature: 0 is greedy; use walk_greedy")
    b = tree.tokens.shape[0]
    base = [int(prefix_len)] * b if not isinstance(prefix_len, Tensor) else [int(x) for x in
                                                                              prefix_len.reshape(-1).tolist()]
    depths = tree.depths.tolist()

    def pick(logits: Tensor, rows: list[int], nodes: list[int]) -> list[int]:
        positions = torch.tensor([base[r] + depths[r][i] + 1 for r, i in zip(rows, nodes, strict=True)],
                                 dtype=torch.int64, device=logits.device)
        return sample_checked(sampler, logits.float() / temperature, positions).tolist()

    return _walk(tree, root_logits, node_logits, pick)


def _walk(tree: DraftTree, root_logits: Tensor, node_logits: Callable[[list[int], list[int]], Tensor],
          pick_rows: Callable[[Tensor, list[int], list[int]], list[int]]) -> VerifyResult:
    """The host walk of :func:`walk_greedy` / :func:`walk_sampled`; ``pick_rows(logits, rows, nodes)``
    gives the target's token at each (row, node) pair from its logits."""
    b, n = tree.tokens.shape
    if not isinstance(root_logits, Tensor) or root_logits.shape[:1] != (b,) or root_logits.dim() != 2 \
            or not root_logits.is_floating_point():
        got = tuple(root_logits.shape) if isinstance(root_logits, Tensor) else type(root_logits).__name__
        raise ValueError(f"root_logits: expected a float tensor [{b}, V] (one row per tree), got {got}")
    counts = tree.num_nodes.tolist()
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    child = [{(parents[r][i], tokens[r][i]): i for i in range(1, counts[r])} for r in range(b)]
    picks = [[PAD] * n for _ in range(b)]
    paths = [[0] for _ in range(b)]
    for r, pick in enumerate(pick_rows(root_logits, list(range(b)), [0] * b)):
        picks[r][0] = pick
    walking = list(range(b))
    while walking:
        rows, nodes = [], []
        for r in walking:
            last = paths[r][-1]
            nxt = child[r].get((last, picks[r][last]))
            if nxt is not None:
                paths[r].append(nxt)
                rows.append(r)
                nodes.append(nxt)
        if rows:
            for r, i, pick in zip(rows, nodes, pick_rows(node_logits(rows, nodes), rows, nodes), strict=True):
                picks[r][i] = pick
        walking = rows
    committed = [[tokens[r][i] for i in paths[r][1:]] + [picks[r][paths[r][-1]]] for r in range(b)]
    return host_result(paths, committed, picks, n, tree.device)


def host_result(paths: list[list[int]], committed: list[list[int]], picks: list[list[int]] | None, n: int,
                device: torch.device) -> VerifyResult:
    """A :class:`VerifyResult` from a host walk's lists, one tensor made: per row the accepted nodes (root first),
    the committed tokens (the bonus last) and the picks ``[n]`` (``None``: all ``PAD``)."""
    pad = [PAD] * n
    out = torch.tensor([path + pad[len(path):] + row + pad[len(row):] + (pad if picks is None else picks[r])
                        + [len(path) - 1, row[-1]] for r, (path, row) in enumerate(zip(paths, committed, strict=True))],
                       dtype=torch.int64, device=device)
    return VerifyResult(accepted=out[:, :n], accepted_length=out[:, 3 * n], bonus=out[:, 3 * n + 1],
                        tokens=out[:, n: 2 * n], picks=out[:, 2 * n: 3 * n])
