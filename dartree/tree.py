"""DraftTree: the one tree type, its validation, canonical form and derived structure.

Layout (batch-first, padded): node 0 is the root, nodes ``1..num_nodes-1`` are draft tokens.
Validity is ``arange(n) < num_nodes``; padding slots hold ``PAD`` (-1) in the integer fields and
``-inf`` in ``scores``, and no derived quantity ever reads them.

Every builder emits the draft nodes of a row sorted by the total order (score descending, ties by
rank path, a prefix before its extensions), so parents always precede their children and two
backends that select the same set produce identical tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dartree.structure import PAD, TreeStructure, ancestor_mask, tree_structure

__all__ = ["DraftTree", "PAD", "rank_path_key"]


def rank_path_key(score: float, rank_path: tuple[int, ...]) -> tuple[float, tuple[int, ...]]:
    """Sort key of the total order: higher score first, then rank path lexicographically.

    Python compares tuples so that a prefix sorts before its extensions, exactly as required.
    """
    return (-score, rank_path)


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
    def validate(self, gamma: int | None = None, budget: int | None = None) -> DraftTree:
        """Check every structural invariant; raise ``ValueError`` naming the first one broken.

        Returns ``self`` so that it can be chained.  This synchronises with the device; it is meant
        for tests and debugging, not for the decoding hot path.
        """
        fields = {"tokens": self.tokens, "parents": self.parents, "depths": self.depths, "ranks": self.ranks}
        for name, t in fields.items():
            if not isinstance(t, Tensor) or t.dtype != torch.int64 or t.dim() != 2:
                raise ValueError(f"{name}: expected an int64 tensor [b, n]")
        if self.scores.dtype != torch.float32 or self.scores.dim() != 2:
            raise ValueError("scores: expected a float32 tensor [b, n]")
        shape = self.tokens.shape
        for name, t in {**fields, "scores": self.scores}.items():
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
        tok, par, dep, rnk, sc = (x.tolist() for x in (self.tokens, self.parents, self.depths, self.ranks,
                                                       self.scores))
        for r, count in enumerate(nn):
            if par[r][0] != PAD or dep[r][0] != 0 or rnk[r][0] != PAD or sc[r][0] != 0.0:
                raise ValueError(f"row {r}: root must have parent -1, depth 0, rank -1, score 0.0")
            if tok[r][0] < 0:
                raise ValueError(f"tokens: row {r} root token {tok[r][0]} < 0")
            seen: set[tuple[int, int]] = set()
            for i in range(1, count):
                p = par[r][i]
                if not 0 <= p < i:
                    raise ValueError(f"parents: row {r} node {i} has parent {p}, need 0 <= parent < {i}")
                if dep[r][i] != dep[r][p] + 1:
                    raise ValueError(f"depths: row {r} node {i} has depth {dep[r][i]}, parent depth {dep[r][p]}")
                if gamma is not None and dep[r][i] > gamma:
                    raise ValueError(f"depths: row {r} node {i} deeper than gamma={gamma}")
                if rnk[r][i] < 0:
                    raise ValueError(f"ranks: row {r} node {i} has rank {rnk[r][i]} < 0")
                if tok[r][i] < 0:
                    raise ValueError(f"tokens: row {r} node {i} has token {tok[r][i]} < 0")
                if (p, tok[r][i]) in seen:
                    raise ValueError(f"tokens: row {r} node {i} repeats a sibling token {tok[r][i]}")
                seen.add((p, tok[r][i]))
                if sc[r][i] != sc[r][i]:
                    raise ValueError(f"scores: row {r} node {i} has a NaN score")
                if sc[r][i] > sc[r][p]:
                    raise ValueError(f"scores: row {r} node {i} outscores its parent")
            for i in range(count, shape[1]):
                if par[r][i] != PAD or tok[r][i] != PAD:
                    raise ValueError(f"row {r}: padding slot {i} must hold -1")
        return self

    # ---------------------------------------------------------------------------- derived data
    def structure(self, prefix_len: int | Tensor = 0) -> TreeStructure:
        """Ancestor mask, positions and first-child / next-sibling links in one pass.

        Computed by :func:`dartree.structure.tree_structure` (numpy on the host for CPU tensors, torch
        without host synchronisation elsewhere); :func:`dartree.fast.ops.tree_structure` adds the
        Triton kernel for CUDA on top.
        """
        return tree_structure(self.parents, self.num_nodes, prefix_len)

    def ancestor_mask(self) -> Tensor:
        """bool ``[b, n, n]``: ``mask[r, i, j]`` iff node j is node i or one of its ancestors.

        Padding rows and columns are all False.
        """
        return ancestor_mask(self.parents, self.num_nodes)

    def positions(self, prefix_len: int | Tensor) -> Tensor:
        """int64 ``[b, n]``: position ids ``prefix_len + depth`` (padding gets ``prefix_len``)."""
        prefix = torch.as_tensor(prefix_len, device=self.device, dtype=torch.int64)
        if prefix.dim() == 1:
            prefix = prefix[:, None]
        return prefix + self.depths.clamp(min=0)

    def links(self) -> tuple[Tensor, Tensor]:
        """first-child and next-sibling links, int64 ``[b, n]`` each, -1 where none.

        Children are linked in node-index order (which is the total order).
        """
        s = self.structure()
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
        """Per row: map from each node's token path (root excluded; root: ``()``) to its score.

        Two trees are the same tree iff their canonical forms are equal; parity tests compare
        these (paths exactly, scores exactly or with a stated tolerance).
        """
        out = []
        for r in range(self.batch_size):
            sc = self.scores[r].tolist()
            out.append({p: sc[i] for i, p in enumerate(self.paths(r))})
        return out

    def format(self, row: int = 0, token_text=str) -> str:
        """A text rendering of one row, depth-first, children in node (total) order."""
        tok, sc, par = self.tokens[row].tolist(), self.scores[row].tolist(), self.parents[row].tolist()
        kids: dict[int, list[int]] = {}
        for i in range(1, int(self.num_nodes[row])):
            kids.setdefault(par[i], []).append(i)
        lines = [f"{token_text(tok[0])!s}  (root)"]

        def walk(i: int, indent: str) -> None:
            children = kids.get(i, [])
            for j, c in enumerate(children):
                last = j == len(children) - 1
                lines.append(f"{indent}{'└─ ' if last else '├─ '}{token_text(tok[c])!s}  [{sc[c]:.3f}]")
                walk(c, indent + ("   " if last else "│  "))

        walk(0, "")
        return "\n".join(lines)

    def select(self, keep: Tensor) -> DraftTree:
        """The sub-tree of the nodes where ``keep`` (bool ``[b, n]``) is True, order preserved.

        ``keep`` must include the root and be prefix-closed (every kept node's parent kept).
        """
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
