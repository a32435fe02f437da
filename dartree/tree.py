"""DraftTree: the one tree type, its validation, canonical form and derived structure.

Batch-first and padded: node 0 is the root, nodes ``1..num_nodes-1`` draft tokens; padding holds ``PAD``
(-1) in the integer fields and ``-inf`` in ``scores``, and nothing derived reads it.  Builders emit a row's
nodes in the total order (score descending, ties by rank path, a prefix first), so parents precede their
children and two backends that select the same set produce identical tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from dartree.arguments import check_int
from dartree.block import DraftBlock, check_not_meta
from dartree.structure import PAD, ancestor_mask, tree_structure

__all__ = ["DraftTree", "PAD", "check_decodable", "children_lists", "rank_path_key"]


def rank_path_key(score: float, rank_path: tuple[int, ...]) -> tuple[float, tuple[int, ...]]:
    """Sort key of the total order: higher score first, then rank path (a tuple: a prefix sorts first)."""
    return (-score, rank_path)


def children_lists(parents: list[int], count: int) -> list[list[int]]:
    """Each node's children in node (sibling) order, from one row's host ``parents`` and its node ``count``."""
    kids: list[list[int]] = [[] for _ in parents]
    for i in range(1, count):
        kids[parents[i]].append(i)
    return kids


@dataclass(frozen=True)
class DraftTree:
    """A batch of draft trees.

    Shape:
        tokens:    int64 ``[b, n]`` node 0 is the root (= block.root).
        parents:   int64 ``[b, n]`` ``parents[:, 0] = -1``; ``0 <= parents[i] < i`` for valid ``i >= 1``.
        depths:    int64 ``[b, n]`` ``depths[:, 0] = 0``; ``depths[i] = depths[parents[i]] + 1``.
        scores:    float32 ``[b, n]`` selection score s(u) (root 0.0).
        ranks:     int64 ``[b, n]`` rank of the token in its depth's candidate list (root -1).
        num_nodes: int64 ``[b]`` valid nodes per row, root included; ``n = max(num_nodes)``.
    """

    tokens: Tensor
    parents: Tensor
    depths: Tensor
    scores: Tensor
    ranks: Tensor
    num_nodes: Tensor

    # ----------------------------------------------------------------------------------- shape
    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def max_nodes(self) -> int:
        return self.tokens.shape[1]

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def valid(self) -> Tensor:
        """bool ``[b, n]``: which slots hold a node."""
        n = self.max_nodes
        return torch.arange(n, device=self.device)[None, :] < self.num_nodes[:, None]

    # ------------------------------------------------------------------------------ validation
    def validate(self, gamma: int | None = None, budget: int | None = None,
                 vocab_size: int | None = None) -> DraftTree:
        """Check every structural invariant; raise ``ValueError`` naming the first one broken.

        ``gamma``, ``budget`` and ``vocab_size`` (tokens in ``[0, vocab_size)``) are checked when given; returns
        ``self``.  :func:`check_decodable`'s clauses (the tree's own root), then ranks, scores and padding; host
        syncs: for tests and debugging (the decoder runs :func:`check_decodable`).
        """
        for name, value in (("gamma", gamma), ("budget", budget), ("vocab_size", vocab_size)):
            check_int(name, value, optional=True)
        fields = {"tokens": self.tokens, "parents": self.parents, "depths": self.depths, "ranks": self.ranks,
                  "scores": self.scores}
        for name, t in fields.items():
            dtype, kind = (torch.float32, "a float32") if name == "scores" else (torch.int64, "an int64")
            if not isinstance(t, Tensor) or t.dtype != dtype or t.dim() != 2:
                got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(f"{name}: expected {kind} tensor [b, n], got {got}")
        if not isinstance(self.num_nodes, Tensor):
            raise ValueError(f"num_nodes: expected an int64 tensor [b], got {type(self.num_nodes).__name__}")
        if self.tokens.device.type == "meta":
            raise ValueError("tokens: on the meta device (a tensor without data); build the tree on a real device")
        shape = self.tokens.shape
        for name, t in fields.items():
            if t.shape != shape:
                raise ValueError(f"{name}: shape {tuple(t.shape)} differs from tokens {tuple(shape)}")
            if t.device != self.device:
                raise ValueError(f"{name}: on {t.device}, tokens on {self.device}")
        if self.num_nodes.dtype != torch.int64 or self.num_nodes.shape != (shape[0],):
            raise ValueError(f"num_nodes: expected int64 [{shape[0]}]")
        nn = self.num_nodes.tolist()
        if min(nn) < 1 or max(nn) != shape[1]:
            raise ValueError(f"num_nodes: must be >= 1 with max == n={shape[1]}, got {nn}")
        if budget is not None and max(nn) > 1 + budget:
            raise ValueError(f"num_nodes: {max(nn)} exceeds 1 + budget ({budget})")
        # the decoder's contract (root, tokens, parents, depths, distinct siblings), then what it does not read
        vocab = vocab_size if vocab_size is not None else max(int(self.tokens.max()) + 1, 1)
        detail = _broken(self, self.tokens[:, 0], vocab, shape[1] if gamma is None else gamma, shape[1])
        if detail is not None:
            raise ValueError(detail)
        valid = self.valid()
        child = valid & (torch.arange(shape[1], device=self.device) > 0)
        parent_score = torch.gather(self.scores, 1, torch.where(child, self.parents, 0))    # parents checked
        flags = {
            "row {r}: root must have parent -1, depth 0, rank -1, score 0.0":
                ((self.ranks[:, 0] != PAD) | (self.scores[:, 0] != 0.0))[:, None],
            "ranks: row {r} node {i} has rank {rank} < 0": child & (self.ranks < 0),
            "scores: row {r} node {i} has a NaN score": child & self.scores.isnan(),
            "scores: row {r} node {i} outscores its parent": child & (self.scores > parent_score),
            "row {r}: padding slot {i} must hold -1": ~valid & ((self.parents != PAD) | (self.tokens != PAD)),
        }
        for message, flag in flags.items():
            if bool(flag.any()):
                r, i = (int(x) for x in flag.nonzero()[0])
                raise ValueError(message.format(r=r, i=i, rank=int(self.ranks[r, i])))
        return self

    # ---------------------------------------------------------------------------- derived data
    def ancestor_mask(self) -> Tensor:
        """bool ``[b, n, n]``: ``mask[r, i, j]`` iff node j is node i or an ancestor (padding all False)."""
        return ancestor_mask(self.parents, self.num_nodes)

    def positions(self, prefix_len: int | Tensor) -> Tensor:
        """int64 ``[b, n]``: position ids ``prefix_len + depth`` (padding gets ``prefix_len``)."""
        prefix = torch.as_tensor(prefix_len, device=self.device, dtype=torch.int64)
        if prefix.dim() == 1:
            prefix = prefix[:, None]
        return prefix + self.depths.clamp(min=0)

    def links(self) -> tuple[Tensor, Tensor]:
        """First-child and next-sibling links, int64 ``[b, n]`` each, -1 where none (children in node order)."""
        s = tree_structure(self.parents, self.num_nodes)
        return s.first_child, s.next_sibling

    def node_paths(self, row: int) -> list[list[int]]:
        """Node indices on the root-to-node path of each valid node of ``row`` (root excluded)."""
        par = self.parents[row].tolist()
        out: list[list[int]] = [[]]
        for i in range(1, int(self.num_nodes[row])):
            out.append(out[par[i]] + [i])
        return out

    def paths(self, row: int) -> list[tuple[int, ...]]:
        """Root-to-node token paths (root token excluded) of each valid node of ``row``."""
        tok = self.tokens[row].tolist()
        return [tuple(tok[j] for j in p) for p in self.node_paths(row)]

    def rank_paths(self, row: int) -> list[tuple[int, ...]]:
        """Root-to-node rank paths of each valid node of ``row`` (root: the empty tuple)."""
        rk = self.ranks[row].tolist()
        return [tuple(rk[j] for j in p) for p in self.node_paths(row)]

    def canonical(self) -> list[dict[tuple[int, ...], float]]:
        """Per row: each node's token path (root: ``()``) -> its score.  Two trees are the same tree iff
        their canonical forms are equal (parity tests compare these)."""
        out = []
        for r in range(self.batch_size):
            sc = self.scores[r].tolist()
            out.append({p: sc[i] for i, p in enumerate(self.paths(r))})
        return out

    def format(self, row: int = 0, token_text=str) -> str:
        """A text rendering of one row, depth-first, children in node (total) order."""
        tok, sc = self.tokens[row].tolist(), self.scores[row].tolist()
        kids = children_lists(self.parents[row].tolist(), int(self.num_nodes[row]))
        lines = [f"{token_text(tok[0])!s}  (root)"]

        def walk(i: int, indent: str) -> None:
            children = kids[i]
            for j, c in enumerate(children):
                last = j == len(children) - 1
                lines.append(f"{indent}{'└─ ' if last else '├─ '}{token_text(tok[c])!s}  [{sc[c]:.3f}]")
                walk(c, indent + ("   " if last else "│  "))

        walk(0, "")
        return "\n".join(lines)

    def select(self, keep: Tensor) -> DraftTree:
        """The sub-tree of the nodes where ``keep`` (bool ``[b, n]``) is True, order preserved; ``keep`` must
        include the root and be prefix-closed."""
        keep = keep & self.valid()
        if not bool(keep[:, 0].all()):
            raise ValueError("keep: must keep the root of every row")
        kept_parent = torch.gather(keep, 1, self.parents.clamp(min=0))
        if bool((keep & ~kept_parent)[:, 1:].any()):
            raise ValueError("keep: must be prefix-closed (a kept node's parent must be kept)")
        new_index = keep.long().cumsum(1) - 1
        num = keep.sum(1)
        n = int(num.max())
        b = self.batch_size
        order = torch.sort((~keep).long(), dim=1, stable=True).indices[:, :n]
        slot_valid = torch.arange(n, device=self.device)[None, :] < num[:, None]

        def take(x: Tensor, pad: float | int) -> Tensor:
            return torch.where(slot_valid, torch.gather(x, 1, order), torch.full((b, n), pad, dtype=x.dtype,
                                                                                    device=self.device))

        old_par = take(self.parents, PAD)
        par = torch.where(old_par >= 0, torch.gather(new_index, 1, old_par.clamp(min=0)), old_par)
        return DraftTree(
            tokens=take(self.tokens, PAD),
            parents=torch.where(slot_valid, par, torch.full_like(par, PAD)),
            depths=take(self.depths, PAD),
            scores=take(self.scores, float("-inf")),
            ranks=take(self.ranks, PAD),
            num_nodes=num.to(torch.int64),
        )

    def to(self, device: torch.device | str) -> DraftTree:
        return DraftTree(*(getattr(self, f).to(device) for f in
                           ("tokens", "parents", "depths", "scores", "ranks", "num_nodes")))


# ------------------------------------------------------------------------ the decoder's contract
_INT_FIELDS = ("tokens", "parents", "depths", "num_nodes")


def _broken(tree: DraftTree, root: Tensor, vocab_size: int, gamma: int, limit: int) -> str | None:
    """The message of the first clause of :func:`check_decodable` the tree breaks, or ``None`` (numpy on the host:
    a dozen calls; the message is made only on failure)."""
    host = tree if tree.device.type == "cpu" else tree.to("cpu")
    tokens, parents, depths = host.tokens.numpy(), host.parents.numpy(), host.depths.numpy()
    num = host.num_nodes.numpy()
    slots = np.arange(tokens.shape[1])
    valid = slots[None, :] < num[:, None]
    draft = valid & (slots[None, :] >= 1)
    safe = np.where(draft & (parents >= 0) & (parents < slots), parents, 0)
    ordered = np.sort(np.where(draft, safe * vocab_size + tokens, -1 - slots), axis=1)    # sibling keys
    flags = {
        "num_nodes": ((num < 1) | (num > limit))[:, None],
        "root": ((tokens[:, 0] != root.numpy(force=True)) | (parents[:, 0] != PAD) | (depths[:, 0] != 0))[:, None],
        "tokens": valid & ((tokens < 0) | (tokens >= vocab_size)),
        "parents": draft & ((parents < 0) | (parents >= slots)),
        "depths": draft & ((depths != np.take_along_axis(depths, safe, 1) + 1) | (depths > gamma)),
        "siblings": (ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0),
    }
    clause = next((c for c, f in flags.items() if f.any()), None)
    if clause is None:
        return None
    r, i = (int(x) for x in np.argwhere(flags[clause])[0])
    if clause == "num_nodes":
        return (f"num_nodes: row {r} has {num[r]}, need 1 <= num_nodes <= {limit} "
                f"(the n slots of the tree, and 1 + budget when the decoder gives a budget)")
    if clause == "root":
        return (f"root: row {r} has root token {tokens[r, 0]}, parent {parents[r, 0]}, depth {depths[r, 0]}; "
                f"need block.root={int(root[r])}, parent -1, depth 0")
    if clause == "tokens":
        return f"tokens: row {r} node {i} has token {tokens[r, i]}, need 0 <= token < V={vocab_size}"
    if clause == "parents":
        return f"parents: row {r} node {i} has parent {parents[r, i]}, need 0 <= parent < {i}"
    if clause == "depths":
        p = parents[r, i]
        return (f"depths: row {r} node {i} has depth {depths[r, i]}, need depth[parent {p}] + 1 = "
                f"{depths[r, p] + 1} and <= gamma={gamma}")
    key = int(ordered[r, i + 1])
    return (f"siblings: row {r} has two children of node {key // vocab_size} with the same token "
            f"{key % vocab_size} (siblings must carry distinct tokens)")


def check_decodable(tree: DraftTree, block: DraftBlock, budget: int | None = None) -> DraftTree:
    """Check the contract the decoder relies on for a builder's tree (a broken one gives wrong output or fails deep
    inside the target); return ``tree``.  Over every row's valid nodes: the root is ``block.root`` (parent -1, depth
    0); tokens in ``[0, V)``; ``0 <= parents[i] < i``; ``depths[i] == depths[parents[i]] + 1 <= block.gamma``;
    distinct sibling tokens; ``1 <= num_nodes <= n`` (and ``<= 1 + budget``).  Scores, ranks and padding are
    :meth:`DraftTree.validate`'s.  One host read; a ``ValueError`` names the clause, the row and the node.

    Shape: tree ``[b, n]`` with ``b = block.batch_size``.
    """
    if not isinstance(tree, DraftTree):
        raise ValueError(f"builder: build() must return a DraftTree, got {type(tree).__name__}")
    b = block.batch_size
    tokens = tree.tokens
    if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.shape[0] != b or tokens.shape[1] < 1:
        got = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"builder: tree.tokens must have shape [{b}, n] (the block's batch, n >= 1), got {got}")
    for name in _INT_FIELDS:
        t = getattr(tree, name)
        want = (b,) if name == "num_nodes" else tuple(tokens.shape)
        if not isinstance(t, Tensor) or t.dtype != torch.int64 or tuple(t.shape) != want:
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"builder: tree.{name} must be an int64 tensor of shape {list(want)}, got {got}")
        if t.device != block.device:
            raise ValueError(f"builder: tree.{name} is on {t.device}, the block on {block.device}")
    check_int("budget", budget, optional=True)
    check_not_meta("block.root", block.root)
    limit = tree.max_nodes if budget is None else min(tree.max_nodes, 1 + budget)
    detail = _broken(tree, block.root, block.vocab_size, block.gamma, limit)      # one host read (on purpose)
    if detail is not None:
        raise ValueError(f"builder: the tree breaks the decoder's contract: {detail}")
    return tree
