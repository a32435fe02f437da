"""KV-cache compaction: keep some sequence slots of a transformers cache, in a given order.

After a tree forward the cache holds ``prefix + n`` slots (the committed prefix and every tree node).
Committing keeps the prefix, the root and the accepted nodes, in order; transformers has no API that
gathers arbitrary positions, so we index ``cache.layers[i].keys / .values`` along the sequence axis
(dim -2) ourselves.

Supported: ``DynamicCache`` and ``StaticCache`` whose layers all attend to the full sequence
(``DynamicLayer`` / ``StaticLayer``).  Sliding-window and linear-attention layers drop or fold old
positions, so a gather is not defined for them: they raise ``ValueError``.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers.cache_utils import Cache, DynamicLayer, StaticLayer

__all__ = ["keep_indices", "gather_cache", "compact_tail", "cache_length", "cache_layers", "move_slots", "cut_cache",
           "select_rows", "merge_rows"]


def cache_layers(cache: Cache) -> list:
    """The layers of ``cache`` (each a ``DynamicLayer`` or ``StaticLayer``; any other kind is refused)."""
    if not isinstance(cache, Cache):
        raise ValueError(f"cache: expected a transformers Cache, got {type(cache).__name__}")
    for i, layer in enumerate(cache.layers):
        if type(layer) not in (DynamicLayer, StaticLayer):
            raise ValueError(f"cache: layer {i} is a {type(layer).__name__}; only full-attention DynamicLayer "
                             f"and StaticLayer can be compacted")
    return cache.layers


def cache_length(cache: Cache) -> int:
    """Slots in use (a Python int; a ``StaticLayer`` keeps it on the device, so this syncs for static caches)."""
    layers = cache_layers(cache)
    if not layers or not layers[0].is_initialized:
        return 0
    return int(layers[0].get_seq_length())


def keep_indices(prefix_len: int, accepted: Tensor, count: int) -> Tensor:
    """int64 ``[b, prefix_len + count]``: cache slots of the prefix, then of the first ``count``
    accepted nodes (root first; node i sits at slot ``prefix_len + i``).

    Shape:
        accepted: int64 ``[b, n]`` accepted node indices, root first (``VerifyResult.accepted``);
                  the first ``count`` must be valid in every row.
    """
    if count < 1 or count > accepted.shape[1]:
        raise ValueError(f"count: expected 1 <= count <= {accepted.shape[1]}, got {count}")
    b = accepted.shape[0]
    prefix = torch.arange(prefix_len, device=accepted.device, dtype=torch.int64).expand(b, prefix_len)
    return torch.cat([prefix, prefix_len + accepted[:, :count]], dim=1)


def gather_cache(cache: Cache, keep: Tensor) -> None:
    """Compact ``cache`` in place to the slots ``keep`` (per row, in order).

    Afterwards the cache holds ``keep.shape[1]`` slots: slot k of row r is the old slot ``keep[r, k]``.
    A ``StaticCache`` keeps its buffers (static addresses) and moves the kept slots to the front.

    Shape:
        keep: int64 ``[b, k]`` (every index below the current length; not checked, to avoid a sync).
    """
    layers = cache_layers(cache)
    if not isinstance(keep, Tensor) or keep.dtype != torch.int64 or keep.dim() != 2:
        raise ValueError("keep: expected an int64 tensor [b, k]")
    k = keep.shape[1]
    live = [layer for layer in layers if layer.is_initialized]
    for layer in live:                                  # check everything before touching anything
        if keep.shape[0] != layer.keys.shape[0]:
            raise ValueError(f"keep: batch {keep.shape[0]} differs from the cache's batch {layer.keys.shape[0]}")
        if isinstance(layer, StaticLayer) and k > layer.max_cache_len:
            raise ValueError(f"keep: {k} slots exceed the static cache's capacity {layer.max_cache_len}")
    for layer in live:
        b, heads, _, _ = layer.keys.shape
        idx = keep.to(layer.keys.device)[:, None, :, None]
        keys = torch.gather(layer.keys, 2, idx.expand(b, heads, k, layer.keys.shape[-1]))
        values = torch.gather(layer.values, 2, idx.expand(b, heads, k, layer.values.shape[-1]))
        if isinstance(layer, StaticLayer):
            layer.keys[:, :, :k] = keys                 # in place: static buffers keep their address
            layer.values[:, :, :k] = values
            layer.cumulative_length.fill_(k)
        else:
            layer.keys = keys
            layer.values = values


def compact_tail(cache: Cache, prefix_len: int, nodes: Tensor, host_nodes: list[int] | None = None) -> None:
    """Keep the first ``prefix_len`` slots untouched and move the tree slots ``prefix_len + nodes``
    (per row, in order) right after them; drop everything else.

    Same result as ``gather_cache(cache, keep_indices(prefix_len, nodes, nodes.shape[1]))`` but in
    O(kept tree slots) per layer instead of O(whole cache): the committed prefix is never copied.

    ``host_nodes`` (batch 1: ``nodes[0]`` as a Python list, when the caller already has it on the
    host) lets the leading nodes that already sit in place (``nodes[j] == j``: the root, and the
    first nodes of a path through the tree's first slots, e.g. every node of a chain) stay untouched;
    only the rest is copied, with one ``index_select`` per tensor.

    Shape:
        nodes: int64 ``[b, c]`` tree node indices to keep (root first; ``c >= 1``), every
        ``prefix_len + nodes`` below the current length (not checked, to avoid a sync).
    """
    layers = cache_layers(cache)
    if not isinstance(nodes, Tensor) or nodes.dtype != torch.int64 or nodes.dim() != 2 or nodes.shape[1] < 1:
        raise ValueError("nodes: expected an int64 tensor [b, c] with c >= 1")
    if isinstance(prefix_len, bool) or not isinstance(prefix_len, int) or prefix_len < 0:
        raise ValueError(f"prefix_len: expected an int >= 0, got {prefix_len!r}")
    c = nodes.shape[1]
    live = [layer for layer in layers if layer.is_initialized]
    for layer in live:                                  # check everything before touching anything
        if nodes.shape[0] != layer.keys.shape[0]:
            raise ValueError(f"nodes: batch {nodes.shape[0]} differs from the cache's batch {layer.keys.shape[0]}")
    if host_nodes is not None:
        if nodes.shape[0] != 1 or len(host_nodes) != c:
            raise ValueError(f"host_nodes: expected the {c} nodes of a batch-1 nodes tensor, got {len(host_nodes)}")
        _compact_host(live, prefix_len, host_nodes)
        return
    idx_cache: dict[torch.device, Tensor] = {}
    for layer in live:
        b, heads, _, _ = layer.keys.shape
        device = layer.keys.device
        if device not in idx_cache:
            idx_cache[device] = (nodes.to(device) + prefix_len)[:, None, :, None]
        idx = idx_cache[device]
        keys = torch.gather(layer.keys, 2, idx.expand(b, heads, c, layer.keys.shape[-1]))
        values = torch.gather(layer.values, 2, idx.expand(b, heads, c, layer.values.shape[-1]))
        layer.keys[:, :, prefix_len:prefix_len + c] = keys       # gathered first: overlap is safe
        layer.values[:, :, prefix_len:prefix_len + c] = values
        if isinstance(layer, StaticLayer):
            layer.cumulative_length.fill_(prefix_len + c)
        else:                                           # a view: the next update concatenates anyway
            layer.keys = layer.keys[:, :, :prefix_len + c]
            layer.values = layer.values[:, :, :prefix_len + c]


def _compact_host(layers: list, prefix_len: int, nodes: list[int]) -> None:
    """Batch-1 :func:`compact_tail` with the kept nodes known on the host."""
    c = len(nodes)
    skip = 0
    while skip < c and nodes[skip] == skip:
        skip += 1
    src: dict[torch.device, Tensor] = {}
    for layer in layers:
        if skip < c:
            device = layer.keys.device
            if device not in src:
                src[device] = torch.tensor(nodes[skip:], dtype=torch.int64, device=device) + prefix_len
            dst = slice(prefix_len + skip, prefix_len + c)
            layer.keys[:, :, dst] = layer.keys.index_select(2, src[device])     # selected first: overlap is safe
            layer.values[:, :, dst] = layer.values.index_select(2, src[device])
        if isinstance(layer, StaticLayer):
            layer.cumulative_length.fill_(prefix_len + c)
        else:
            layer.keys = layer.keys[:, :, :prefix_len + c]
            layer.values = layer.values[:, :, :prefix_len + c]


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
        if not layer.is_initialized:
            continue
        if isinstance(layer, StaticLayer):
            layer.cumulative_length.fill_(width)
        else:
            layer.keys = layer.keys[:, :, :width]
            layer.values = layer.values[:, :, :width]


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
    x = x[:, :, :width]
    if x.shape[2] < width:
        x = torch.cat([x, x.new_zeros(x.shape[0], x.shape[1], width - x.shape[2], x.shape[3])], dim=2)
    return x


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
