"""RaggedTarget: a batch of sequences of different lengths in one :class:`HFTarget` cache.

Layout (right-padded): row ``r`` holds its ``lengths[r]`` committed slots in cache columns
``[0, lengths[r])``; columns ``[lengths[r], width)`` are padding (``width = max(lengths)``) that no
real query attends to.  A forward of ``n`` new slots per row (a tree, or one AR token) is written
by transformers at columns ``[width, width + n)`` for every row; each new slot of row ``r`` gets
position id ``lengths[r] + depth`` and sees its row's committed columns plus its own ancestors
(:func:`dartree.verify.inputs.tree_inputs` with a per-row ``prefix_len`` and ``cache_len=width``).
:meth:`RaggedTarget.commit` then moves each row's kept slots to ``[lengths[r], lengths[r] + count[r])``
(one gather and one scatter per tensor, the committed prefix is never copied) and cuts the cache to
the new ``max(lengths)`` (a ``DynamicLayer`` becomes a view, a ``StaticLayer`` gets its
``cumulative_length``).  After every commit each row's columns ``[0, lengths[r])`` equal a fresh
prefill of that row alone (tested).  :meth:`RaggedTarget.keep_rows` drops finished rows from the
batch so that they stop costing.

The cache is the wrapped target's (``HFTarget.cache``); a static cache needs room for
``width + n`` slots, where ``width`` is the longest row.  The host knows every length (Python
ints): the decoding loop already syncs once per round to learn what each row committed.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers.cache_utils import StaticLayer

from dartree.models.target import HFTarget, TargetOutput
from dartree.tree import DraftTree
from dartree.verify.cache import cache_layers
from dartree.verify.inputs import TreeInputs, tree_inputs

__all__ = ["RaggedTarget"]


class RaggedTarget:
    """Per-row lengths, positions, masks and KV compaction over an :class:`HFTarget` (see module docstring).

    Args:
        target: the wrapped target; its cache is replaced by :meth:`prefill`.
    """

    def __init__(self, target: HFTarget) -> None:
        if not isinstance(target, HFTarget):
            raise ValueError(f"target: expected an HFTarget, got {type(target).__name__}")
        self.target = target
        self.lengths: list[int] = []
        self._pending: int | None = None

    # ------------------------------------------------------------------------------------ state
    @property
    def batch_size(self) -> int:
        return len(self.lengths)

    @property
    def width(self) -> int:
        """Cache columns in use: the longest row (excludes pending slots)."""
        return max(self.lengths, default=0)

    def lengths_tensor(self) -> Tensor:
        """int64 ``[b]`` committed slots per row, on the target's device."""
        return torch.tensor(self.lengths, dtype=torch.int64, device=self.target.device)

    def _kv_len(self, n: int) -> int:
        t = self.target
        return t.max_cache_len if t.cache_kind == "static" else self.width + n

    def _check_room(self, n: int, name: str) -> None:
        cap = self.target.capacity
        if cap is not None and self.width + n > cap:
            raise ValueError(f"{name}: {n} more slots after the longest row ({self.width}) exceed the static "
                             f"cache's capacity {cap}")

    def _mask(self, mask: Tensor) -> Tensor:
        if self.target.attn_implementation == "eager":
            low = torch.full((), torch.finfo(self.target.dtype).min, dtype=self.target.dtype, device=mask.device)
            return torch.where(mask, torch.zeros((), dtype=self.target.dtype, device=mask.device), low)
        return mask

    # --------------------------------------------------------------------------------- forwards
    @torch.no_grad()
    def prefill(self, contexts: list[Tensor], logits: str = "all") -> TargetOutput:
        """Reset the cache and run each row's context (1-D int64, possibly empty) causally.

        Returns the padded outputs: ``logits [b, m, V]``, ``hidden [b, m, F]`` with ``m`` the longest
        context; entries past a row's length are padding.  ``logits="last"`` runs the LM head only at
        each row's last position (``logits [b, 1, V]``; every row needs at least one token).
        """
        if logits not in ("all", "last"):
            raise ValueError(f"logits: expected 'all' or 'last', got {logits!r}")
        t = self.target
        if not contexts:
            raise ValueError("contexts: expected at least one row")
        lengths = [int(c.shape[0]) for c in contexts]
        m = max(lengths)
        if t.capacity is not None and m > t.capacity:
            raise ValueError(f"contexts: {m} tokens exceed the static cache's capacity {t.capacity}")
        t.reset()
        self.lengths = lengths
        self._pending = None
        b = len(contexts)
        if m == 0:
            width = len(t.layer_ids) * t.hidden_size
            hidden = torch.zeros(b, 0, width, dtype=t.dtype, device=t.device) if t.layer_ids else None
            return TargetOutput(torch.zeros(b, 0, t.vocab_size, dtype=t.dtype, device=t.device), hidden)
        ids = torch.zeros(b, m, dtype=torch.int64, device=t.device)
        for r, c in enumerate(contexts):
            ids[r, : lengths[r]] = c.to(t.device)
        kv = t.max_cache_len if t.cache_kind == "static" else m
        q = torch.arange(m, device=t.device)[:, None]
        k = torch.arange(kv, device=t.device)[None, :]
        own = self.lengths_tensor()[:, None, None]
        # causal within the row's own tokens; a padding query sees only itself (a finite softmax row)
        mask = (k <= q)[None] & ((k < own) | (k == q)[None])
        positions = torch.arange(m, device=t.device).expand(b, m)
        keep = None
        if logits == "last":
            if min(lengths) == 0:
                raise ValueError("contexts: logits='last' needs at least one token in every row")
            ends = sorted({n - 1 for n in lengths})           # HF keeps these columns for every row
            keep = torch.tensor(ends, dtype=torch.int64, device=t.device)
        out = t._run(ids, positions, self._mask(mask[:, None]), keep=keep)
        if keep is not None:
            column = torch.tensor([ends.index(n - 1) for n in lengths], dtype=torch.int64, device=out.logits.device)
            last = out.logits[torch.arange(b, device=column.device), column][:, None]
            out = TargetOutput(last, out.hidden, out.final)
        self._cut(self.width)
        return out

    def tree_inputs(self, tree: DraftTree) -> TreeInputs:
        """Inputs scoring row ``r`` of ``tree`` after that row's committed slots (columns from ``width``)."""
        if tree.batch_size != self.batch_size:
            raise ValueError(f"tree: {tree.batch_size} rows, the batch holds {self.batch_size}")
        self._check_room(tree.max_nodes, "tree")
        return tree_inputs(tree, self.lengths_tensor().to(tree.device), cache_len=self.width,
                           kv_len=self._kv_len(tree.max_nodes))

    @torch.no_grad()
    def forward_tree(self, tree: DraftTree, inputs: TreeInputs | None = None, logits: str = "all") -> TargetOutput:
        """Score every node of every row in one forward; the slots stay pending until :meth:`commit`.

        ``inputs``: ``self.tree_inputs(tree)`` if the caller built them already.  ``logits="root"``
        runs the LM head on each row's node 0 only and returns every node's final hidden state in
        ``final`` (see :attr:`HFTarget.scores_rows_apart`); ``"all"`` scores every node.

        Shape:
            returns logits ``[b, n, V]`` (``[b, 1, V]`` for ``"root"``), hidden ``[b, n, F]``
            (padding slots hold garbage).
        """
        if logits not in ("all", "root"):
            raise ValueError(f"logits: expected 'all' or 'root', got {logits!r}")
        if self._pending is not None:
            raise ValueError("tree: a forward is already pending; commit first")
        if inputs is None:
            inputs = self.tree_inputs(tree)
        elif inputs.kv_len != self._kv_len(tree.max_nodes) or inputs.input_ids.shape != tree.tokens.shape:
            raise ValueError("inputs: not built for this tree and cache; use ragged.tree_inputs(tree)")
        mask = self._mask(inputs.mask)
        out = self.target._run(inputs.input_ids.to(self.target.device), inputs.position_ids.to(self.target.device),
                               mask, root_only=logits == "root")
        self._pending = tree.max_nodes
        return out

    @torch.no_grad()
    def forward_next(self, ids: Tensor) -> TargetOutput:
        """One causal step per row (the AR baseline): ``ids[r]`` at position ``lengths[r]``; pending until commit.

        Shape:
            ids: int64 ``[b]`` -> logits ``[b, 1, V]``.
        """
        if self._pending is not None:
            raise ValueError("ids: a forward is already pending; commit first")
        if ids.shape != (self.batch_size,):
            raise ValueError(f"ids: expected shape [{self.batch_size}], got {tuple(ids.shape)}")
        self._check_room(1, "ids")
        t = self.target
        w, kv = self.width, self._kv_len(1)
        lengths = self.lengths_tensor()
        cols = torch.arange(kv, device=t.device)[None, :]
        mask = (cols < lengths[:, None]) | (cols == w)
        out = t._run(ids[:, None].to(t.device), lengths[:, None], self._mask(mask[:, None, None]))
        self._pending = 1
        return out

    @torch.no_grad()
    def commit(self, nodes: Tensor, counts: list[int]) -> None:
        """Keep, per row, the first ``counts[r]`` pending slots listed in ``nodes[r]`` (root first).

        Shape:
            nodes: int64 ``[b, c]`` pending slot indices (``VerifyResult.accepted``; -1 past the count
            is fine), ``c >= max(counts)``.
        """
        if self._pending is None:
            raise ValueError("nodes: no forward is pending")
        if len(counts) != self.batch_size or any(not 1 <= c <= self._pending for c in counts):
            raise ValueError(f"counts: expected {self.batch_size} ints in [1, {self._pending}], got {counts}")
        w, c = self.width, max(counts)
        if nodes.dim() != 2 or nodes.shape[0] != self.batch_size or nodes.shape[1] < c:
            raise ValueError(f"nodes: expected int64 [{self.batch_size}, >= {c}], got {tuple(nodes.shape)}")
        new_lengths = [length + k for length, k in zip(self.lengths, counts, strict=True)]
        # every row at the width and only the root kept (node 0 is always the root): already in place
        in_place = c == 1 and all(length == w for length in self.lengths)
        layers = [layer for layer in cache_layers(self.target.cache) if layer.is_initialized]
        if layers and not in_place:
            device = layers[0].keys.device
            src = (nodes[:, :c].clamp(min=0).to(device) + w)[:, None, :, None]
            dst = (self.lengths_tensor().to(device)[:, None] + torch.arange(c, device=device))[:, None, :, None]
            for layer in layers:
                b, heads, _, d = layer.keys.shape
                # gathered first, then scattered: overlapping source and destination are safe; slots past
                # a row's count land in that row's padding
                keys = torch.gather(layer.keys, 2, src.expand(b, heads, c, d))
                values = torch.gather(layer.values, 2, src.expand(b, heads, c, layer.values.shape[-1]))
                layer.keys.scatter_(2, dst.expand(b, heads, c, d), keys)
                layer.values.scatter_(2, dst.expand(b, heads, c, layer.values.shape[-1]), values)
        self.lengths = new_lengths
        self._pending = None
        self._cut(self.width)

    def _cut(self, width: int) -> None:
        """Hold exactly ``width`` columns: a view of a dynamic layer, a static layer's length."""
        for layer in cache_layers(self.target.cache):
            if not layer.is_initialized:
                continue
            if isinstance(layer, StaticLayer):
                layer.cumulative_length.fill_(width)
            else:
                layer.keys = layer.keys[:, :, :width]
                layer.values = layer.values[:, :, :width]
        self.target._length = width
        self.target._pending = None

    def rollback(self) -> None:
        """Drop the pending tree slots of every row (nothing committed)."""
        self._pending = None
        self._cut(self.width)

    @torch.no_grad()
    def keep_rows(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in that order); the others leave the batch and stop costing (``[]``: empty batch)."""
        if self._pending is not None:
            raise ValueError("rows: a forward is pending; commit first")
        if any(not 0 <= r < self.batch_size for r in rows) or len(set(rows)) != len(rows):
            raise ValueError(f"rows: expected distinct row indices in [0, {self.batch_size}), got {rows}")
        if rows == list(range(self.batch_size)):
            return
        if not rows:
            self.target.reset()
            self.lengths = []
            return
        self.lengths = [self.lengths[r] for r in rows]
        layers = [layer for layer in cache_layers(self.target.cache) if layer.is_initialized]
        if layers:
            index = torch.tensor(rows, dtype=torch.int64, device=layers[0].keys.device)
            for layer in layers:
                layer.keys = layer.keys.index_select(0, index)
                layer.values = layer.values.index_select(0, index)
                if isinstance(layer, StaticLayer):
                    layer.batch_size = len(rows)
        self._cut(self.width)

    @torch.no_grad()
    def add_rows(self, contexts: list[Tensor], logits: str = "all") -> TargetOutput:
        """Append new rows (prefilled with ``contexts``) after the current ones: a freed slot takes a new request.

        The new contexts are prefilled in a cache of their own, then both caches are padded to the
        wider width and concatenated along the batch.  Returns the new rows' prefill outputs (as
        :meth:`prefill`).
        """
        if self._pending is not None:
            raise ValueError("contexts: a forward is pending; commit first")
        if not self.lengths:
            return self.prefill(contexts, logits)
        t = self.target
        old_cache, old_lengths = t.cache, self.lengths
        out = self.prefill(contexts, logits)                # into a fresh cache
        new_cache, new_lengths = t.cache, self.lengths
        width = max(old_lengths + new_lengths)
        merged = []
        for a, b in zip(cache_layers(old_cache), cache_layers(new_cache), strict=True):
            if not a.is_initialized and not b.is_initialized:
                merged.append(None)
                continue
            like = a if a.is_initialized else b
            parts = []
            for layer, rows in ((a, len(old_lengths)), (b, len(new_lengths))):
                for name in ("keys", "values"):
                    ref = getattr(like, name)
                    if layer.is_initialized:
                        x = getattr(layer, name)
                        if not isinstance(layer, StaticLayer):
                            x = x[:, :, :width]
                            if x.shape[2] < width:
                                x = torch.cat([x, x.new_zeros(x.shape[0], x.shape[1], width - x.shape[2],
                                                              x.shape[3])], dim=2)
                    else:
                        size = ref.shape[2] if isinstance(like, StaticLayer) else width
                        x = ref.new_zeros(rows, ref.shape[1], size, ref.shape[3])
                    parts.append(x)
            merged.append(((parts[0], parts[2]), (parts[1], parts[3])))
        for layer, pair in zip(cache_layers(old_cache), merged, strict=True):
            if pair is None:
                continue
            (k0, k1), (v0, v1) = pair
            if not layer.is_initialized:             # take the new cache's initialised layer over
                fresh = cache_layers(new_cache)[cache_layers(old_cache).index(layer)]
                layer.__dict__.update({k: v for k, v in fresh.__dict__.items() if k not in ("keys", "values")})
            layer.keys, layer.values = torch.cat([k0, k1]), torch.cat([v0, v1])
            if isinstance(layer, StaticLayer):
                layer.batch_size = layer.keys.shape[0]
        t._cache = old_cache
        self.lengths = old_lengths + new_lengths
        self._cut(self.width)
        return out

    def row_cache(self, row: int) -> list[tuple[Tensor, Tensor]]:
        """Per layer, the committed keys and values of ``row``: ``[1, heads, lengths[row], d]`` each (tests)."""
        n = self.lengths[row]
        return [(layer.keys[row: row + 1, :, :n], layer.values[row: row + 1, :, :n])
                for layer in cache_layers(self.target.cache) if layer.is_initialized]
