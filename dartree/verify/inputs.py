"""Tree inputs for the target: input ids, position ids and the tree attention mask (docs/verification.md,
"Tree inputs": where each node sits and what it attends to, and why a padding slot attends to itself).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dartree.arguments import check_int
from dartree.fast import ops
from dartree.tree import DraftTree

__all__ = ["TreeInputs", "TreeInputBuffer", "tree_inputs", "ATTENTION_IMPLEMENTATIONS"]

#: Attention implementations whose mask format we know: ``eager`` adds a float mask to the scores
#: (a bool mask there is silently *added* as 0/1 and gives wrong logits); ``sdpa`` takes bool.
ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa")


@dataclass(frozen=True)
class TreeInputs:
    """Everything the target needs to score a batch of trees in one forward pass.

    Shape:
        input_ids:    int64 ``[b, n]`` node tokens, 0 in padding slots.
        position_ids: int64 ``[b, n]`` ``prefix_len + depth`` (padding: ``prefix_len``).
        mask:         bool ``[b, 1, n, kv_len]`` True where a node may attend.
    """

    input_ids: Tensor
    position_ids: Tensor
    mask: Tensor

    @property
    def kv_len(self) -> int:
        return self.mask.shape[-1]

    def additive_mask(self, dtype: torch.dtype) -> Tensor:
        """float ``[b, 1, n, kv_len]``: 0 where allowed, ``finfo(dtype).min`` where masked (eager).

        ``finfo.min`` rather than ``-inf`` so that no softmax row can become NaN.
        """
        if not dtype.is_floating_point:
            raise ValueError(f"dtype: expected a floating dtype for the additive mask, got {dtype}")
        zero = torch.zeros((), dtype=dtype, device=self.mask.device)
        low = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=self.mask.device)
        return torch.where(self.mask, zero, low)

    def mask_for(self, attn_implementation: str, dtype: torch.dtype) -> Tensor:
        """The mask in the form ``attn_implementation`` expects: additive float (eager) or bool (sdpa)."""
        if attn_implementation == "eager":
            return self.additive_mask(dtype)
        if attn_implementation == "sdpa":
            return self.mask
        raise ValueError(
            f"attn_implementation: tree attention needs an arbitrary mask; expected one of "
            f"{ATTENTION_IMPLEMENTATIONS}, got {attn_implementation!r}"
        )


def tree_inputs(
    tree: DraftTree,
    prefix_len: int | Tensor,
    *,
    cache_len: int | None = None,
    kv_len: int | None = None,
) -> TreeInputs:
    """Input ids, position ids and the tree attention mask for ``tree`` after a cache of ``cache_len`` slots
    (the arguments: docs/verification.md, "Tree inputs").

    Shape:
        prefix_len: int or int64 ``[b]``.
        returns: see :class:`TreeInputs`.
    """
    b, n = tree.tokens.shape
    device = tree.device
    if isinstance(prefix_len, Tensor):
        if prefix_len.dtype != torch.int64 or prefix_len.shape != (b,):
            raise ValueError(f"prefix_len: expected an int or an int64 tensor of shape [{b}], got "
                             f"{prefix_len.dtype} {tuple(prefix_len.shape)}")
        if cache_len is None:
            raise ValueError("cache_len: required when prefix_len is a tensor")
        prefix = prefix_len.to(device)
    else:
        if isinstance(prefix_len, bool) or not isinstance(prefix_len, int) or prefix_len < 0:
            raise ValueError(f"prefix_len: expected an int >= 0 or an int64 tensor [b], got {prefix_len!r}")
        if cache_len is None:
            cache_len = prefix_len
        if prefix_len > cache_len:
            raise ValueError(f"prefix_len: {prefix_len} exceeds cache_len={cache_len}")
        prefix = torch.full((b,), prefix_len, dtype=torch.int64, device=device)
    if cache_len < 0:
        raise ValueError(f"cache_len: expected >= 0, got {cache_len}")
    if kv_len is None:
        kv_len = cache_len + n
    if kv_len < cache_len + n:
        raise ValueError(f"kv_len: {kv_len} cannot hold cache_len + n = {cache_len} + {n}")

    valid = tree.valid()
    input_ids = torch.where(valid, tree.tokens, torch.zeros_like(tree.tokens))
    position_ids = tree.positions(prefix)

    cols = torch.arange(kv_len, device=device)
    sees_prefix = cols[None, :] < prefix[:, None]                                     # [b, kv]
    mask = sees_prefix[:, None, :] & valid[:, :, None]                                # [b, n, kv]
    nodes = ops.ancestor_mask(tree.parents, tree.num_nodes)                             # [b, n, n]
    diag = torch.eye(n, dtype=torch.bool, device=device)[None]
    nodes = nodes | (diag & ~valid[:, :, None])        # a padding slot sees only itself
    mask[:, :, cache_len:cache_len + n] = nodes
    return TreeInputs(input_ids=input_ids, position_ids=position_ids, mask=mask[:, None])


class TreeInputBuffer:
    """Batch-1 tree inputs filled into a mask buffer kept across rounds, for the decoding loop: equal to
    ``tree_inputs(tree, prefix_len, kv_len=kv_len)`` (docs/verification.md, "Tree inputs").  Invariant after
    every :meth:`fill`: columns ``[0, prefix_len)`` are True and columns ``>= prefix_len + n`` are False in every
    buffer row.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._mask = torch.zeros(0, 0, dtype=torch.bool, device=self.device)
        self._host = None                 # numpy view of _mask on the CPU
        self._prefix = 0          # columns [0, _prefix) are True in every row
        self._end = 0             # columns >= _end are False in every row

    def fill(self, tree: DraftTree, prefix_len: int, kv_len: int | None = None) -> TreeInputs:
        """Inputs for the one-row ``tree`` after ``prefix_len`` cached slots (see :func:`tree_inputs`)."""
        if tree.batch_size != 1:
            raise ValueError(f"tree: TreeInputBuffer fills one-row trees, got {tree.batch_size} rows; use tree_inputs")
        check_int("prefix_len", prefix_len, low=0)
        if tree.device != self.device:
            raise ValueError(f"tree: on {tree.device}, buffer on {self.device}")
        n = tree.max_nodes
        end = prefix_len + n
        kv = end if kv_len is None else kv_len
        if kv < end:
            raise ValueError(f"kv_len: {kv} cannot hold prefix_len + n = {prefix_len} + {n}")
        rows, cols = self._mask.shape
        if self._mask.is_inference() and not torch.is_inference_mode_enabled():
            rows = cols = 0           # made in a decode (inference mode), written here outside it: a new one
        if n > rows or kv > cols:                          # grow (rarely): start from a clean buffer
            self._mask = torch.zeros(max(n, 2 * rows), max(kv, 2 * cols), dtype=torch.bool, device=self.device)
            self._host = self._mask.numpy() if self.device.type == "cpu" else None   # shares memory
            self._prefix = self._end = 0
        m = self._mask
        w = m if self._host is None else self._host        # perf: the CPU's writes through numpy (no tensor indexing)
        if prefix_len < self._prefix:                      # a shorter prefix: a new sequence
            w[:, prefix_len:max(self._prefix, self._end)] = False
            self._end = prefix_len
        elif prefix_len > self._prefix:
            w[:, self._prefix:prefix_len] = True
        self._prefix = prefix_len
        if self._end > end:
            w[:, end:self._end] = False
        if self._host is not None:         # CPU: ancestor rows on the host, parents before children
            block = self._host[:n, prefix_len:end]
            block[0] = False
            block[0, 0] = True
            for i, p in enumerate(tree.parents[0, 1:n].tolist(), start=1):
                block[i] = block[p]
                block[i, i] = True
        else:
            m[:n, prefix_len:end] = ops.ancestor_mask(tree.parents, tree.num_nodes)[0]
        self._end = end
        return TreeInputs(input_ids=tree.tokens, position_ids=tree.depths + prefix_len,
                          mask=m[None, None, :n, :kv])
