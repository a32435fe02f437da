"""KV-cache compaction: keep some sequence slots of a transformers cache, in a given order, along dim -2 of each
layer's keys and values (transformers has no gather API).  Full-attention ``DynamicLayer`` / ``StaticLayer`` only:
sliding-window and linear-attention layers raise ``ValueError`` (docs/verification.md, "KV-cache compaction").
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers.cache_utils import Cache, DynamicLayer, StaticLayer

from dartree.arguments import check_int

__all__ = ["compact_tail", "cache_layers", "move_slots", "cut_cache", "select_rows", "merge_rows", "pad_slots"]


def cache_layers(cache: Cache) -> list:
    """The layers of ``cache`` (each a ``DynamicLayer`` or ``StaticLayer``; any other kind is refused)."""
    if not isinstance(cache, Cache):
        raise ValueError(f"cache: expected a transformers Cache, got {type(cache).__name__}")
    for i, layer in enumerate(cache.layers):
        if type(layer) not in (DynamicLayer, StaticLayer):
            raise ValueError(f"cache: layer {i} is a {type(layer).__name__}; only full-attention DynamicLayer "
                             f"and StaticLayer can be compacted")
    return cache.layers


def compact_tail(cache: Cache, prefix_len: int, nodes: Tensor, host_nodes: list[int] | None = None) -> None:
    """Keep the first ``prefix_len`` slots untouched and move the tree slots ``prefix_len + nodes``
    (per row, in order) right after them; drop everything else (docs/verification.md, "KV-cache compaction").
    ``host_nodes``: batch 1, ``nodes[0]`` as a Python list when the caller has it on the host (the leading
    nodes already in place, ``nodes[j] == j``, are then not copied).

    Shape:
        nodes: int64 ``[b, c]`` tree node indices to keep (root first; ``c >= 1``), every
        ``prefix_len + nodes`` below the current length (not checked, to avoid a sync).
    """
    layers = cache_layers(cache)
    if not isinstance(nodes, Tensor) or nodes.dtype != torch.int64 or nodes.dim() != 2 or nodes.shape[1] < 1:
        raise ValueError("nodes: expected an int64 tensor [b, c] with c >= 1")
    check_int("prefix_len", prefix_len, low=0)
    c = nodes.shape[1]
    live = [layer for layer in layers if layer.is_initialized]
    for layer in live:                                  # check everything before touching anything
        if nodes.shape[0] != layer.keys.shape[0]:
            raise ValueError(f"nodes: batch {nodes.shape[0]} differs from the cache's batch {layer.keys.shape[0]}")
    if host_nodes is not None:
        if nodes.shape[0] != 1 or len(host_nodes) != c:
            raise ValueError(f"host_nodes: expected the {c} nodes of a batch-1 nodes tensor, got {len(host_nodes)}")
        _move_host(live, prefix_len, host_nodes)
    else:
        move_slots(cache, nodes + prefix_len, torch.arange(prefix_len, prefix_len + c, device=nodes.device)
                   .expand_as(nodes))
    for layer in live:
        _cut(layer, prefix_len + c)


def _move_host(layers: list, prefix_len: int, nodes: list[int]) -> None:
    """Batch 1, the kept nodes on the host: move those not already in place by one ``index_select`` each."""
    c = len(nodes)
    skip = 0
    while skip < c and nodes[skip] == skip:
        skip += 1
    if skip == c:
        return
    src: dict[torch.device, Tensor] = {}
    dst = slice(prefix_len + skip, prefix_len + c)
    for layer in layers:
        device = layer.keys.device
        if device not in src:
            src[device] = torch.tensor(nodes[skip:], dtype=torch.int64, device=device) + prefix_len
        layer.keys[:, :, dst] = layer.keys.index_select(2, src[device])     # selected first: overlap is safe
        layer.values[:, :, dst] = layer.values.index_select(2, src[device])


def _cut(layer, width: int) -> None:
    """Hold exactly ``width`` columns: a static layer's length, a view of a dynamic layer (the next update
    concatenates anyway)."""
    if isinstance(layer, StaticLayer):
        layer.cumulative_length.fill_(width)
    else:
        layer.keys = layer.keys.narrow(2, 0, width)          # = [:, :, :width] (perf: no index parsing)
        layer.values = layer.values.narrow(2, 0, width)


# ---------------------------------------------------------------------------------- ragged rows
# A batch of rows of different lengths shares one cache, right-padded: row r holds its committed slots in
# columns [0, lengths[r]); columns up to the longest row are padding no real query attends to.


def move_slots(cache: Cache, src: Tensor, dst: Tensor) -> None:
    """Per row, copy the slots ``src[r]`` to the columns ``dst[r]`` (gathered first: overlap is safe).

    Shape:
        src, dst: int64 ``[b, c]`` column indices (every one below the layer's length; not checked).
    """
    for layer in cache_layers(cache):
        if not layer.is_initialized:
            continue
        b, heads, _, d = layer.keys.shape
        c = src.shape[1]
        s = src.to(layer.keys.device)[:, None, :, None]
        t = dst.to(layer.keys.device)[:, None, :, None]
        keys = torch.gather(layer.keys, 2, s.expand(b, heads, c, d))
        values = torch.gather(layer.values, 2, s.expand(b, heads, c, layer.values.shape[-1]))
        layer.keys.scatter_(2, t.expand(b, heads, c, d), keys)
        layer.values.scatter_(2, t.expand(b, heads, c, layer.values.shape[-1]), values)


def cut_cache(cache: Cache, width: int) -> None:
    """Hold exactly ``width`` columns: a view of a dynamic layer, a static layer's length."""
    for layer in cache_layers(cache):
        if layer.is_initialized:
            _cut(layer, width)


def select_rows(cache: Cache, rows: list[int]) -> None:
    """Keep only the batch rows ``rows`` of every layer, in that order."""
    layers = [layer for layer in cache_layers(cache) if layer.is_initialized]
    if not layers:
        return
    index = torch.tensor(rows, dtype=torch.int64, device=layers[0].keys.device)
    for layer in layers:
        layer.keys = layer.keys.index_select(0, index)
        layer.values = layer.values.index_select(0, index)
        if isinstance(layer, StaticLayer):
            layer.batch_size = len(rows)


def _padded_to(layer, like, rows: int, width: int, name: str) -> Tensor:
    """``layer``'s keys or values, cut or zero-padded to ``width`` columns (a static layer keeps its
    capacity); zeros of ``like``'s shape for a layer that holds nothing yet."""
    ref = getattr(like, name)
    if not layer.is_initialized:
        size = ref.shape[2] if isinstance(like, StaticLayer) else width
        return ref.new_zeros(rows, ref.shape[1], size, ref.shape[3])
    x = getattr(layer, name)
    if isinstance(layer, StaticLayer):
        return x
    return pad_slots(x[:, :, :width], width)


def pad_slots(x: Tensor, cap: int) -> Tensor:
    """Keys or values ``[b, kv, c, hd]`` zero-padded to ``cap >= c`` slots."""
    return x if x.shape[2] == cap else torch.cat([x, x.new_zeros(*x.shape[:2], cap - x.shape[2], x.shape[3])], dim=2)


def merge_rows(cache: Cache, other: Cache, rows: tuple[int, int], width: int) -> None:
    """Append ``other``'s batch rows after ``cache``'s, both padded to ``width`` columns (in place in ``cache``).

    ``rows``: the batch sizes of ``cache`` and ``other``.
    """
    mine, theirs = cache_layers(cache), cache_layers(other)
    for layer, fresh in zip(mine, theirs, strict=True):
        if not layer.is_initialized and not fresh.is_initialized:
            continue
        like = layer if layer.is_initialized else fresh
        keys = [_padded_to(x, like, n, width, "keys") for x, n in ((layer, rows[0]), (fresh, rows[1]))]
        values = [_padded_to(x, like, n, width, "values") for x, n in ((layer, rows[0]), (fresh, rows[1]))]
        if not layer.is_initialized:             # take the other cache's initialised layer over
            layer.__dict__.update({k: v for k, v in fresh.__dict__.items() if k not in ("keys", "values")})
        layer.keys, layer.values = torch.cat(keys), torch.cat(values)
        if isinstance(layer, StaticLayer):
            layer.batch_size = layer.keys.shape[0]
