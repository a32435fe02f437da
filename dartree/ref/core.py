"""The two search cores every reference builder shares, written to be obviously correct: one row at a time,
Python objects for nodes, tuples as sort keys (``tree.rank_path_key``), float32 scores from the functions
the fast backend uses (``dartree.scoring``).

- :func:`depthwise` keeps, at each depth, the best ``quota(d)`` children of the previous depth's kept
  nodes (``chain`` / ``corrected-chain``: quota 1; DARTree: a width or a budget schedule).
- :func:`best_first` pops nodes from a max-heap in the total order and pushes their children (``ddtree``,
  ``corrected-chain-ddtree``, ``sequential-heap`` differ only in how children are scored).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from dartree.block import DraftBlock, check_finite
from dartree.protocols import CorrectionHead
from dartree.scoring import Candidates, child_scores, log_normalize
from dartree.tree import PAD, DraftTree, rank_path_key

__all__ = ["Node", "assemble", "depthwise", "best_first", "children", "head_log_q", "base_log_q", "advance",
           "initial_state"]


@dataclass(eq=False)
class Node:
    """One node of a reference search (identity-compared; ``parent`` is None for the root)."""

    token: int
    score: float
    rank_path: tuple[int, ...]
    parent: Node | None = None
    state: Tensor | None = field(default=None, repr=False)  # head state after this node, [S]

    @property
    def depth(self) -> int:
        return len(self.rank_path)

    @property
    def key(self) -> tuple[float, tuple[int, ...]]:
        return rank_path_key(self.score, self.rank_path)


def assemble(roots: list[Node], nodes: list[list[Node]], device: torch.device) -> DraftTree:
    """Pack per-row node lists into a padded DraftTree, draft nodes sorted by the total order."""
    rows = []
    for root, row in zip(roots, nodes, strict=True):
        ordered = [root] + sorted(row, key=lambda u: u.key)
        index = {id(u): i for i, u in enumerate(ordered)}
        orphans = [u for u in ordered[1:] if u.parent is None or id(u.parent) not in index]
        if orphans:                     # a builder that dropped a node but kept its children
            u = orphans[0]
            raise ValueError(f"nodes: row {len(rows)} has {len(orphans)} node(s) whose parent is not in the tree "
                             f"(e.g. token {u.token} at depth {u.depth}, rank path {u.rank_path}); a tree must "
                             f"hold every ancestor of its nodes (prefix-closed)")
        rows.append([(u.token, PAD if u.parent is None else index[id(u.parent)], u.depth, u.score,
                      u.rank_path[-1] if u.rank_path else PAD) for u in ordered])
    n = max(len(r) for r in rows)
    pad = (PAD, PAD, PAD, float("-inf"), PAD)
    padded = [r + [pad] * (n - len(r)) for r in rows]
    ints = torch.tensor([[[u[j] for u in r] for r in padded] for j in (0, 1, 2, 4)], dtype=torch.int64)  # [4, b, n]
    scores = torch.tensor([[u[3] for u in r] for r in padded], dtype=torch.float32)
    return DraftTree(tokens=ints[0].to(device), parents=ints[1].to(device), depths=ints[2].to(device),
                     scores=scores.to(device), ranks=ints[3].to(device),
                     num_nodes=torch.tensor([len(r) for r in rows], dtype=torch.int64, device=device))


# ------------------------------------------------------------------------------------ scoring
def base_log_q(cands: Candidates, row: int, depth: int) -> Tensor:
    """float32 ``[K]``: log q of the base candidates of ``row`` at ``depth`` (1-based)."""
    return log_normalize(cands.logits[row, depth - 1], cands.rest_lse[row, depth - 1])


def head_log_q(head: CorrectionHead, block: DraftBlock, cands: Candidates, row: int, depth: int,
               states: Tensor) -> Tensor:
    """float32 ``[m, K]``: corrected log q of ``C_depth`` after each of ``m`` branch states ``[m, S]``
    (``block``: the one-row block of ``row``)."""
    cand = cands.tokens[row, depth - 1][None]  # [1, K]
    logits = head.logits(block, depth, states[None], cand)
    expected = (1, states.shape[0], cands.topk)
    if tuple(logits.shape) != expected:
        raise ValueError(f"head.logits: returned shape {tuple(logits.shape)}, expected [b, m, K] = {expected}")
    check_finite("head.logits", logits)
    return log_normalize(logits[0], cands.rest_lse[row, depth - 1])


def advance(head: CorrectionHead, block: DraftBlock, depth: int, states: Tensor, tokens: list[int]) -> Tensor:
    """``[m, S]`` head states after appending ``tokens`` (one per branch) at ``depth``."""
    tok = torch.tensor([tokens], dtype=torch.int64, device=states.device)
    out = head.advance(block, depth, states[None], tok)
    if out.dim() != 3 or tuple(out.shape[:2]) != (1, len(tokens)):
        raise ValueError(f"head.advance: returned shape {tuple(out.shape)}, expected [b, m, S] = [1, {len(tokens)}, S]")
    return out[0]


def initial_state(head: CorrectionHead, block: DraftBlock) -> Tensor:
    """``[S]`` head state at the root of a one-row block."""
    out = head.initial_state(block)
    if not isinstance(out, Tensor):
        raise ValueError(f"head.initial_state: returned {type(out).__name__}, expected a torch.Tensor")
    if out.dim() != 2 or out.shape[0] != block.batch_size:
        raise ValueError(f"head.initial_state: returned shape {tuple(out.shape)}, expected [b={block.batch_size}, S]")
    return out[0]


# ------------------------------------------------------------------------------- depth-wise core
Quota = Callable[[int, int], int]  # (depth, nodes selected so far) -> how many to keep at depth


def depthwise(block: DraftBlock, row: int, cands: Candidates, head: CorrectionHead | None, quota: Quota,
              beta: float, trace: list[Tensor] | None = None) -> tuple[Node, list[Node]]:
    """Depth-wise batched expansion of one row (DARTree's Algorithm 1; chains with quota 1): per depth ONE head
    call scores all kept branches, the best ``quota`` children are kept under the total order, and ONE call
    advances their states.  ``trace``: a list the ``[m, K]`` log q of each expanded depth is appended to."""
    one = block.rows(row)
    root = Node(token=int(block.root[row]), score=0.0, rank_path=())
    frontier = [root]
    states = initial_state(head, one)[None] if head is not None else None  # [m, S]
    selected: list[Node] = []
    for depth in range(1, block.gamma + 1):
        keep = quota(depth, len(selected))
        if keep <= 0 or not frontier:
            break
        if head is not None:
            log_q = head_log_q(head, one, cands, row, depth, states)
        else:
            log_q = base_log_q(cands, row, depth).expand(len(frontier), -1)
        if trace is not None:
            trace.append(log_q)
        parent_scores = torch.tensor([u.score for u in frontier], dtype=torch.float32, device=log_q.device)
        scores = child_scores(parent_scores, log_q, beta).tolist()
        tokens = cands.tokens[row, depth - 1].tolist()
        children = [(p, k) for p in range(len(frontier)) for k in range(len(tokens))]
        children.sort(key=lambda pk: rank_path_key(scores[pk[0]][pk[1]], frontier[pk[0]].rank_path + (pk[1],)))
        children = children[:keep]
        nxt = [Node(token=tokens[k], score=scores[p][k], rank_path=frontier[p].rank_path + (k,), parent=frontier[p])
               for p, k in children]
        if head is not None:
            parent_idx = torch.tensor([p for p, _ in children], dtype=torch.int64, device=states.device)
            states = advance(head, one, depth, states[parent_idx], [u.token for u in nxt])
        frontier = nxt
        selected.extend(nxt)
    return root, selected


def children(u: Node, log_q: Tensor, tokens: list[int], beta: float = 0.0) -> list[Node]:
    """All children of ``u`` given the float32 ``[K]`` log q of its depth's candidates ``tokens``."""
    scores = child_scores(torch.tensor([u.score], dtype=torch.float32, device=log_q.device), log_q[None], beta)
    return [Node(token=t, score=s, rank_path=u.rank_path + (k,), parent=u)
            for k, (t, s) in enumerate(zip(tokens, scores[0].tolist(), strict=True))]


# ------------------------------------------------------------------------------ best-first core
Expand = Callable[[Node], list[Node]]  # a popped node -> all its children, scored


def best_first(root: Node, expand: Expand, budget: int) -> list[Node]:
    """Pop up to ``budget`` draft nodes in the total order from a max-heap (Lemma 1's search); ``expand`` is
    called once per popped node (the root included) and returns its children."""
    heap: list[tuple[tuple[float, tuple[int, ...]], int, Node]] = []
    counter = 0  # never compared in practice (keys are unique); keeps heapq off Node objects

    def push_children(u: Node) -> None:
        nonlocal counter
        for child in expand(u):
            heapq.heappush(heap, (child.key, counter, child))
            counter += 1

    popped: list[Node] = []
    if budget > 0:
        push_children(root)
    while heap and len(popped) < budget:
        _, _, u = heapq.heappop(heap)
        popped.append(u)
        if len(popped) < budget:  # the last popped node's children could never be selected
            push_children(u)
    return popped
