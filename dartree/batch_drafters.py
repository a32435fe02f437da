"""Drafters with per-row contexts, for batched decoding (:meth:`dartree.decode.SpeculativeDecoder.generate_batch`).

The batch protocol (``start``, ``append_rows``, ``draft_rows``, ``keep_rows``, ``add_rows``): docs/verification.md,
"Drafters".  :func:`batch_drafter` adapts this package's drafters: :class:`DFlashRows` runs a ``DFlashDrafter`` on
the whole batch; :class:`RowsOfDrafters` one single-request drafter per row.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dartree.block import DraftBlock
from dartree.models.drafter import DFlashDrafter
from dartree.protocols import BatchDrafter, check_drafter, is_batch_drafter
from dartree.verify.cache import pad_slots

__all__ = ["BatchDrafter", "DFlashRows", "RowsOfDrafters", "batch_drafter"]


def _check_counts(tokens: Tensor, counts: list[int], batch: int) -> None:
    if tokens.dim() != 2 or tokens.shape[0] != batch or len(counts) != batch:
        raise ValueError(f"tokens: expected [{batch}, m] with {batch} counts, got {tuple(tokens.shape)} and "
                         f"{len(counts)} counts")
    if any(not 0 <= c <= tokens.shape[1] for c in counts):
        raise ValueError(f"counts: each must lie in [0, {tokens.shape[1]}], got {counts}")


def _row_copy(template):
    """A deep copy of ``template`` sharing its ``nn.Module`` objects (read-only weights, too big to copy), so that a
    drafter wrapping another stateful drafter gets its own wrapped drafter (a shallow copy shared it across rows)."""
    memo: dict[int, object] = {}
    seen: set[int] = set()

    def share(obj: object, depth: int) -> None:
        if id(obj) in seen or depth > 6:
            return
        seen.add(id(obj))
        if isinstance(obj, nn.Module):
            memo[id(obj)] = obj
        elif isinstance(obj, dict):
            for v in obj.values():
                share(v, depth + 1)
        elif isinstance(obj, list | tuple | set):
            for v in obj:
                share(v, depth + 1)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            for v in vars(obj).values():
                share(v, depth + 1)

    share(template, 0)
    return copy.deepcopy(template, memo)


class RowsOfDrafters:
    """One single-request drafter per row, each a deep copy of ``template`` reset at :meth:`start`: row r's blocks
    are what ``template`` would draft for that row alone, so batched decoding takes the same rounds as ``generate``."""

    def __init__(self, template) -> None:
        check_drafter(template)
        self.template = template
        self.target_layer_ids = tuple(template.target_layer_ids)
        self.rows: list = []

    def start(self, batch_size: int) -> None:
        self.rows = []
        for _ in range(batch_size):
            row = _row_copy(self.template)      # its own state all the way down; the models are shared
            row.reset()
            self.rows.append(row)

    def append_rows(self, hidden_states: Tensor | None, tokens: Tensor, counts: list[int]) -> None:
        _check_counts(tokens, counts, len(self.rows))
        for r, (row, c) in enumerate(zip(self.rows, counts, strict=True)):
            h = None if hidden_states is None else hidden_states[r: r + 1, :c]
            row.append_context(h, tokens[r: r + 1, :c])

    def draft_rows(self, roots: Tensor) -> DraftBlock:
        if roots.shape != (len(self.rows),):
            raise ValueError(f"roots: expected shape [{len(self.rows)}], got {tuple(roots.shape)}")
        blocks = [row.draft(roots[r: r + 1]) for r, row in enumerate(self.rows)]
        hidden = None
        if all(b.hidden is not None for b in blocks):
            hidden = torch.cat([b.hidden for b in blocks])
        return DraftBlock(logits=torch.cat([b.logits for b in blocks]), root=roots, hidden=hidden)

    def keep_rows(self, rows: list[int]) -> None:
        self.rows = [self.rows[r] for r in rows]

    def add_rows(self, hidden_states: Tensor | None, tokens: Tensor, counts: list[int]) -> None:
        old = self.rows
        self.start(len(counts))
        self.append_rows(hidden_states, tokens, counts)
        self.rows = old + self.rows


class DFlashRows:
    """A :class:`DFlashDrafter` over a batch with per-row contexts, all rows in one forward.

    Context keys/values live in right-padded per-layer buffers ``[b, kv, capacity, hd]`` (row r's ``lengths[r]``
    entries first); ``append_rows`` scatters the new entries' keys/values to slots ``lengths[r] + j``,
    ``draft_rows`` puts row r's block at positions ``lengths[r] ..`` and masks each row's padding.  Equal to the
    single-request :meth:`~DFlashDrafter.draft` of each row up to float rounding.
    """

    def __init__(self, drafter: DFlashDrafter) -> None:
        self.drafter = drafter
        self.target_layer_ids = drafter.target_layer_ids
        self.lengths: list[int] = []
        self._kv: list[tuple[Tensor, Tensor]] = []

    def start(self, batch_size: int) -> None:
        self.lengths = [0] * batch_size
        c, weight = self.drafter.config, self.drafter.fc.weight      # zeroed buffers of 64 slots, grown by pad_slots
        shape = (batch_size, c.num_key_value_heads, 64, c.head_dim)
        self._kv = [(weight.new_zeros(shape), weight.new_zeros(shape)) for _ in self.drafter.layers]

    @torch.no_grad()
    def append_rows(self, hidden_states: Tensor | None, tokens: Tensor, counts: list[int]) -> None:
        b = len(self.lengths)
        _check_counts(tokens, counts, b)
        if b == 0:
            return
        if hidden_states is None:
            raise ValueError("hidden_states: the DFlash drafter needs the target's hidden states, got None")
        m = hidden_states.shape[1]
        if m == 0:
            return
        feats = self.drafter.context_features(hidden_states)
        device = feats.device
        lengths = torch.tensor(self.lengths, dtype=torch.int64, device=device)
        positions = lengths[:, None] + torch.arange(m, device=device)                 # [b, m]
        need, cap = max(self.lengths) + m, self._kv[0][0].shape[2]
        if need > cap:                                                                # grow by doubling
            self._kv = [(pad_slots(k, max(need, 2 * cap)), pad_slots(v, max(need, 2 * cap))) for k, v in self._kv]
        new = self.drafter.context_key_values(feats, positions)
        for (k, v), (k1, v1) in zip(self._kv, new, strict=True):
            # entries past a row's count land in that row's padding, which nothing reads
            idx = positions[:, None, :, None].expand(b, k1.shape[1], m, k1.shape[3])
            k.scatter_(2, idx, k1)
            v.scatter_(2, idx, v1)
        self.lengths = [n + c for n, c in zip(self.lengths, counts, strict=True)]

    @torch.no_grad()
    def draft_rows(self, roots: Tensor) -> DraftBlock:
        d = self.drafter
        b = len(self.lengths)
        if not isinstance(roots, Tensor) or roots.dtype != torch.int64 or roots.shape != (b,):
            raise ValueError(f"roots: expected an int64 tensor of shape [{b}]")
        width = max(self.lengths)
        device = roots.device
        lengths = torch.tensor(self.lengths, dtype=torch.int64, device=device)
        positions = lengths[:, None] + torch.arange(d.block_size, device=device)      # [b, block]
        cols = torch.arange(width + d.block_size, device=device)
        mask = (cols[None, :] < lengths[:, None]) | (cols[None, :] >= width)            # [b, c + block]
        mask = mask[:, None, None, :].expand(b, 1, d.block_size, width + d.block_size)
        ctx = [(k[:, :, :width], v[:, :, :width]) for k, v in self._kv]
        hidden = d.block_hidden(roots[:, None], positions, ctx, mask)[:, d.config.first_slot:]
        logits = F.linear(hidden, d.lm_head_as(hidden.dtype))
        return DraftBlock(logits=logits, root=roots, hidden=hidden)

    def keep_rows(self, rows: list[int]) -> None:
        index = torch.tensor(rows, dtype=torch.int64, device=self._kv[0][0].device)
        self._kv = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self._kv]
        self.lengths = [self.lengths[r] for r in rows]

    def add_rows(self, hidden_states: Tensor | None, tokens: Tensor, counts: list[int]) -> None:
        old_kv, old_lengths = self._kv, self.lengths
        self.start(len(counts))
        self.append_rows(hidden_states, tokens, counts)
        if not old_lengths:
            return
        cap = max(old_kv[0][0].shape[2], self._kv[0][0].shape[2])
        self._kv = [(torch.cat([pad_slots(k0, cap), pad_slots(k1, cap)]),
                     torch.cat([pad_slots(v0, cap), pad_slots(v1, cap)]))
                    for (k0, v0), (k1, v1) in zip(old_kv, self._kv, strict=True)]
        self.lengths = old_lengths + self.lengths


def batch_drafter(drafter) -> BatchDrafter:
    """The batch form of ``drafter``: itself if it has the batch methods, :class:`DFlashRows` for a
    :class:`DFlashDrafter`, otherwise :class:`RowsOfDrafters` (one copy per row)."""
    if is_batch_drafter(drafter):
        return drafter
    if isinstance(drafter, DFlashDrafter):
        return DFlashRows(drafter)
    return RowsOfDrafters(drafter)
