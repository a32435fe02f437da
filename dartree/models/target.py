"""HFTarget: any Hugging Face causal LM as a speculative-decoding target.

:class:`HFTarget` owns the KV cache, which between calls holds the committed tokens *except the last one*
(the next tree's root).  A round is ``tree_inputs`` -> ``forward_tree`` (slots pending) -> verify ->
``commit``; ``extend`` appends causally (prefill, AR).  Every forward returns the hidden states of
``layer_ids`` that drafters condition on.  Details: docs/verification.md, "HFTarget".
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformers.cache_utils import Cache, DynamicCache, StaticCache

from dartree.arguments import check_int
from dartree.models.hf_compat import cache_kwargs, parameters
from dartree.models.lean import LeanForward, lean_forward
from dartree.tree import DraftTree
from dartree.verify.cache import cache_layers, compact_tail, cut_cache, merge_rows, move_slots, select_rows
from dartree.verify.inputs import ATTENTION_IMPLEMENTATIONS, TreeInputBuffer, TreeInputs, tree_inputs

__all__ = ["HFTarget", "TargetOutput", "CACHE_KINDS"]

CACHE_KINDS = ("dynamic", "static")
FORWARDS = ("auto", "lean", "hf")

#: model -> {attention implementation: (LeanForward or None, why not)}: the probe runs once per model
_LEAN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


#: slots the probe fills (a static cache needs at least this capacity for the lean forward)
PROBE_SLOTS = 45


def _mask_for(mask: Tensor, attn_implementation: str, dtype: torch.dtype) -> Tensor:
    """A bool attention mask in the form the attention implementation takes (eager: additive float)."""
    if attn_implementation != "eager":
        return mask
    low = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=mask.device)
    return torch.where(mask, torch.zeros((), dtype=dtype, device=mask.device), low)


def _new_cache(config, capacity: int | None) -> Cache:
    """An empty cache: static of ``capacity`` slots, or dynamic (``None``)."""
    if capacity is None:
        return DynamicCache(config=config)
    return StaticCache(config=config, max_cache_len=capacity)


def _probe_equal(model: nn.Module, lean: LeanForward, capacity: int | None) -> str | None:
    """Run the model and ``lean`` on the same inputs and caches (static of ``capacity`` slots, or dynamic): a
    prefill, a tree-masked forward, an AR step and a causal extend, every hidden state and logit compared bit
    for bit.  The reason they differ, or ``None``."""
    config = model.config
    text = config.get_text_config(decoder=True)
    vocab, layers = int(text.vocab_size), int(text.num_hidden_layers)
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    ids = (torch.arange(PROBE_SLOTS, device=device, dtype=torch.int64) * 7919 + 3) % vocab
    kv = 40 if capacity is None else capacity
    keys, query = torch.arange(kv, device=device)[None, :] - 24, torch.arange(16, device=device)[:, None]
    # the prefix, the node itself and some of its ancestors; no column past the 16 tree slots
    allowed = ((keys < 0) | (keys == query) | ((keys < query) & (keys % 3 == 0))) & (keys < 16)
    mask = _mask_for(allowed[None, None], config._attn_implementation, dtype)
    steps = ((ids[None, :24], torch.arange(24, device=device)[None], None),
             (ids[None, 24:40],
              24 + torch.tensor([0, 1, 1, 2, 2, 3, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7], device=device)[None], mask),
             (ids[None, 40:41], torch.full((1, 1), 32, device=device), None),
             (ids[None, 41:45], torch.arange(33, 37, device=device)[None], None))
    every = tuple(range(layers + 1))
    with torch.no_grad():
        theirs_cache, mine_cache = _new_cache(config, capacity), _new_cache(config, capacity)
        for step, (x, pos, m) in enumerate(steps):
            theirs = model(input_ids=x, position_ids=pos, attention_mask=m, use_cache=True, output_hidden_states=True,
                           **cache_kwargs(model.forward, theirs_cache))
            logits, hidden, _ = lean(x, pos, m, mine_cache, every)
            if not torch.equal(theirs.logits, logits):
                return f"logits differ (forward {step})"
            for i in every:
                if not torch.equal(theirs.hidden_states[i], hidden[i]):
                    return f"hidden state {i} differs (forward {step})"
    return None


def _lean_for(model: nn.Module, capacity: int | None) -> tuple[LeanForward | None, str | None]:
    """The probed :class:`LeanForward` of ``model`` for a dynamic cache (``capacity=None``) or a static one,
    cached per model, attention implementation, capacity, dtype and device (a cast or move is probed again)."""
    param = next(model.parameters())
    key = (model.config._attn_implementation, capacity, param.dtype, param.device)
    per_model = _LEAN.setdefault(model, {})
    if key not in per_model:
        lean, why = lean_forward(model)
        if lean is not None and capacity is not None and capacity < PROBE_SLOTS:
            lean, why = None, f"a static cache of {capacity} slots is too small to probe (< {PROBE_SLOTS})"
        if lean is not None:
            # grouped sdpa first; where the probe finds other bits (a static cache's masked padding can change
            # sdpa's kernel), HF's attention function
            for grouped in (True, False):
                lean = lean if grouped else LeanForward(model, grouped=False)
                try:
                    why = _probe_equal(model, lean, capacity)
                except (RuntimeError, ValueError, TypeError, AttributeError, IndexError) as e:
                    # an optimisation never stops a model from running: its own forward runs instead
                    why = f"the lean forward failed on the probe ({type(e).__name__}: {e})"
                if why is None:
                    break
            else:
                lean = None
        per_model[key] = (lean, why)
    return per_model[key]


@dataclass(frozen=True)
class TargetOutput:
    """Target logits (and captured hidden states) at the positions of one forward.

    Shape:
        logits: float ``[b, m, V]`` next-token logits (``[b, 1, V]``: position 0 only, ``logits="root"``).
        hidden: float ``[b, m, len(layer_ids) * H]``, or ``None`` without ``layer_ids``.
        final:  float ``[b, m, H]`` final-normed hidden states (``logits="root"`` only: rows for
                :meth:`HFTarget.head_logits`), else ``None``.
    """

    logits: Tensor
    hidden: Tensor | None
    final: Tensor | None = None


def _check_causal_lm(model: nn.Module, config) -> None:
    """Reject, at construction, models that cannot score next tokens causally (e.g. ``BertModel``)."""
    name = type(model).__name__
    head = model.get_output_embeddings() if callable(getattr(model, "get_output_embeddings", None)) else None
    if head is None:
        raise ValueError(f"model: {name} has no language-model head (get_output_embeddings() is None); "
                         f"expected a causal LM such as AutoModelForCausalLM, not a bare encoder / base model")
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"model: {name} is an encoder-decoder model; tree verification needs a decoder-only causal LM")
    if getattr(config, "is_decoder", True) is False:
        raise ValueError(f"model: {name} attends bidirectionally (config.is_decoder=False); "
                         f"expected a causal LM (AutoModelForCausalLM)")
    if callable(getattr(model, "can_generate", None)) and not model.can_generate():
        raise ValueError(f"model: {name} cannot generate (can_generate() is False); expected a causal LM")


class HFTarget:
    """Prefill, tree forward, commit and hidden-state capture around a HF causal LM.

    Args:
        model: a ``transformers`` causal LM with ``config._attn_implementation`` ``"eager"`` or ``"sdpa"``,
            in eval mode on its device.
        layer_ids: decoder layers whose hidden states are captured (``[0, num_layers)``; -1: the embedding
            output, HF's ``hidden_states[0]``).
        cache: ``"dynamic"`` or ``"static"``; max_cache_len: a static cache's capacity (default:
            ``config.max_position_embeddings``).
        forward: ``"auto"`` (the lean forward where its probe equals the model's, else the model's own),
            ``"lean"`` (required: an error says why not) or ``"hf"``; :attr:`forward_path` says which runs.
    """

    def __init__(
        self,
        model: nn.Module,
        layer_ids: tuple[int, ...] | list[int] = (),
        cache: str = "dynamic",
        max_cache_len: int | None = None,
        forward: str = "auto",
    ) -> None:
        config = getattr(model, "config", None)
        if not isinstance(model, nn.Module) or config is None:
            raise ValueError(f"model: expected a transformers causal LM module, got {type(model).__name__}")
        impl = getattr(config, "_attn_implementation", None)
        if impl not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(f"model: config._attn_implementation must be one of {ATTENTION_IMPLEMENTATIONS} "
                             f"(tree attention needs an arbitrary mask), got {impl!r}")
        _check_causal_lm(model, config)
        text_config = config.get_text_config(decoder=True)
        num_layers = int(text_config.num_hidden_layers)
        layer_ids = tuple(layer_ids)
        bad = [i for i in layer_ids if isinstance(i, bool) or not isinstance(i, int) or not -1 <= i < num_layers]
        if bad:
            raise ValueError(f"layer_ids: each must be an int in [0, {num_layers}) or -1 (the embedding output), "
                             f"got {list(layer_ids)}")
        if cache not in CACHE_KINDS:
            raise ValueError(f"cache: expected one of {CACHE_KINDS}, got {cache!r}")
        self.max_positions: int | None = getattr(text_config, "max_position_embeddings", None)
        if cache == "static":
            if max_cache_len is None:
                max_cache_len = self.max_positions
            check_int("max_cache_len", max_cache_len)
        elif max_cache_len is not None:
            raise ValueError("max_cache_len: only meaningful with cache='static'")
        if forward not in FORWARDS:
            raise ValueError(f"forward: expected one of {FORWARDS}, got {forward!r}")
        self.model = model
        self.layer_ids = layer_ids
        self.cache_kind = cache
        self.max_cache_len = max_cache_len
        self.attn_implementation: str = impl
        self.vocab_size = int(text_config.vocab_size)
        self.hidden_size = int(text_config.hidden_size)
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self._cache: Cache | None = None
        self._lengths: list[int] = []   # committed slots per row (Python ints: no device sync)
        self._width = 0                 # max(_lengths): cache columns in use
        self._uniform = True            # every row holds _width slots (no padding columns)
        self._pending: int | None = None   # slots appended by forward_tree / forward_next, awaiting commit
        self._inputs = TreeInputBuffer(self.device)
        self._lm_head = model.get_output_embeddings()
        self._first = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._rows_apart: bool | None = None
        probe = _new_cache(self.model.config, self.max_cache_len)
        kinds = sorted({type(layer).__name__ for layer in probe.layers} - {"DynamicLayer", "StaticLayer"})
        if kinds:
            raise ValueError(f"model: its cache has {kinds} layers; tree verification needs full-attention "
                             f"layers whose KV slots can be gathered (DynamicLayer / StaticLayer)")
        self._lean: LeanForward | None = None
        #: why the model's own forward runs (``None`` when the lean one does)
        self.forward_note: str | None = "forward='hf'"
        if forward != "hf":
            self._lean, self.forward_note = _lean_for(model, max_cache_len if cache == "static" else None)
            if self._lean is None and forward == "lean":
                raise ValueError(f"forward: 'lean' cannot run {type(model).__name__}: {self.forward_note}")

    @property
    def forward_path(self) -> str:
        """``"lean"`` or ``"hf"``: which forward :meth:`prefill`, :meth:`extend` and :meth:`forward_tree` run."""
        return "hf" if self._lean is None else "lean"

    # ------------------------------------------------------------------------------------ state
    @property
    def cache(self) -> Cache | None:
        return self._cache

    @property
    def lengths(self) -> list[int]:
        """Committed slots of each row (Python ints: no device sync; a copy)."""
        return list(self._lengths)

    @property
    def batch_size(self) -> int:
        return len(self._lengths)

    @property
    def length(self) -> int:
        """Cache columns in use: the longest row's committed slots (excludes pending tree slots)."""
        return self._width

    @property
    def capacity(self) -> int | None:
        """Most slots the cache can hold (``None``: unbounded dynamic cache)."""
        return self.max_cache_len

    def lengths_tensor(self) -> Tensor:
        """int64 ``[b]`` committed slots per row, on the target's device."""
        return torch.tensor(self._lengths, dtype=torch.int64, device=self.device)

    def reset(self) -> None:
        """Forget everything: a fresh, empty cache."""
        self._cache = _new_cache(self.model.config, self.max_cache_len)
        self._set_lengths([])
        self._pending = None

    def _set_lengths(self, lengths: list[int]) -> None:
        self._lengths = lengths
        self._width = max(lengths, default=0)
        self._uniform = all(n == self._width for n in lengths)

    # --------------------------------------------------------------------------------- forwards
    def _check_ids(self, input_ids: Tensor) -> None:
        if not isinstance(input_ids, Tensor) or input_ids.dtype != torch.int64 or input_ids.dim() != 2:
            raise ValueError("input_ids: expected an int64 tensor [b, m]")

    @property
    def keeps_logits(self) -> bool:
        """Whether the model's forward takes ``logits_to_keep`` (then prefills run the LM head on the
        positions they use only, as the references do; otherwise they slice full logits)."""
        return "logits_to_keep" in (parameters(self.model.forward) or ())

    def _run(self, input_ids: Tensor, position_ids: Tensor, attention_mask: Tensor | None,
             root_only: bool = False, keep: int | Tensor | None = None) -> TargetOutput:
        """One forward.  ``root_only``: logits of position 0 plus every final hidden state; ``keep``:
        HF's ``logits_to_keep`` (an int keeps the last positions, a 1-D tensor those indices)."""
        if self._lean is not None:
            logits, states, final = self._lean(
                input_ids, position_ids, attention_mask, self._cache, tuple(i + 1 for i in self.layer_ids),
                self._first if root_only else 0 if keep is None else keep, root_only)
            hidden = (states[0] if len(states) == 1 else torch.cat(states, dim=-1)) if states else None
            return TargetOutput(logits=logits, hidden=hidden, final=final)
        if root_only:
            extra = {"logits_to_keep": self._first}
        elif keep is not None and self.keeps_logits:
            extra = {"logits_to_keep": keep}
        else:
            extra = {}
        out = self.model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            use_cache=True,
            **cache_kwargs(self.model.forward, self._cache),
            output_hidden_states=bool(self.layer_ids) or root_only,
            **extra,
        )
        hidden = None
        if self.layer_ids:
            hidden = torch.cat([out.hidden_states[i + 1] for i in self.layer_ids], dim=-1)
        logits = out.logits
        if keep is not None and not extra:          # no logits_to_keep: slice what the caller asked for
            logits = logits[:, -keep:] if isinstance(keep, int) else logits[:, keep.to(logits.device)]
        return TargetOutput(logits=logits, hidden=hidden, final=out.hidden_states[-1] if root_only else None)

    @property
    def scores_rows_apart(self) -> bool:
        """Whether ``forward_tree(..., logits="root")`` + :meth:`head_logits` may replace full logits: on the CPU, when
        a one-time probe shows the logits are the output embedding of the last hidden state (no soft-capping or
        scaling) and ``logits_to_keep`` is taken; greedy rounds then run the LM head only on the nodes the walk
        visits.  On accelerators the full LM head is one cheap call."""
        if self._rows_apart is None:
            self._rows_apart = False
            if self.device.type == "cpu":
                ids = torch.zeros(1, 2, dtype=torch.int64, device=self.device)
                try:
                    with torch.no_grad():
                        out = self.model(input_ids=ids, use_cache=False, output_hidden_states=True,
                                         logits_to_keep=self._first)
                        mine = self.head_logits(out.hidden_states[-1][:, 0])
                except (TypeError, ValueError, AttributeError):
                    return False
                self._rows_apart = tuple(out.logits.shape) == (1, 1, self.vocab_size) and torch.equal(
                    out.logits[:, 0], mine)
        return self._rows_apart

    @torch.no_grad()
    def head_logits(self, final: Tensor) -> Tensor:
        """The LM head on final-normed hidden states (``TargetOutput.final`` rows).  Shape: ``[..., H] -> [..., V]``."""
        return self._lm_head(final)

    def _check_room(self, count: int, name: str) -> None:
        if self.max_cache_len is not None and self._width + count > self.max_cache_len:
            raise ValueError(f"{name}: {count} more slots after the longest row ({self._width}) exceed the static "
                             f"cache's capacity {self.max_cache_len}")

    def _check_idle(self, name: str) -> None:
        if self._pending is not None:
            raise ValueError(f"{name}: a forward is pending; commit or rollback first")

    def _kv_len(self, n: int) -> int:
        return self.max_cache_len if self.cache_kind == "static" else self._width + n

    @torch.no_grad()
    def prefill(self, input_ids: Tensor | list[Tensor], logits: str = "all") -> TargetOutput:
        """Reset the cache and run the prompt rows causally: ``input_ids`` int64 ``[b, m]``, or a list of 1-D
        contexts of any lengths (right-padded in the cache and the outputs).  ``logits="last"``: the LM head on each
        row's last position only (``logits_to_keep``, as the references prefill; ``[b, 1, V]``), ``"all"``: every one.
        """
        if logits not in ("all", "last"):
            raise ValueError(f"logits: expected 'all' or 'last', got {logits!r}")
        if isinstance(input_ids, list | tuple):
            lengths = [int(c.shape[0]) for c in input_ids]
            if not lengths:
                raise ValueError("input_ids: expected at least one row")
            if len(set(lengths)) > 1:
                return self._prefill_ragged(list(input_ids), lengths, logits)
            input_ids = torch.stack([c.to(self.device, torch.int64) for c in input_ids])
        self._check_ids(input_ids)
        if self.max_cache_len is not None and input_ids.shape[1] > self.max_cache_len:
            raise ValueError(f"input_ids: {input_ids.shape[1]} tokens exceed the static cache's capacity "
                             f"{self.max_cache_len}")
        self.reset()
        self._set_lengths([0] * input_ids.shape[0])
        return self.extend(input_ids, logits)

    def _prefill_ragged(self, contexts: list[Tensor], lengths: list[int], logits: str) -> TargetOutput:
        m, b = max(lengths), len(contexts)
        if self.capacity is not None and m > self.capacity:
            raise ValueError(f"input_ids: {m} tokens exceed the static cache's capacity {self.capacity}")
        if logits == "last" and min(lengths) == 0:
            raise ValueError("input_ids: logits='last' needs at least one token in every row")
        self.reset()
        ids = torch.zeros(b, m, dtype=torch.int64, device=self.device)
        for r, c in enumerate(contexts):
            ids[r, : lengths[r]] = c.to(self.device)
        self._set_lengths(lengths)
        kv = self.max_cache_len if self.cache_kind == "static" else m
        q = torch.arange(m, device=self.device)[:, None]
        k = torch.arange(kv, device=self.device)[None, :]
        own = self.lengths_tensor()[:, None, None]
        # causal within the row's own tokens; a padding query sees only itself (a finite softmax row)
        mask = (k <= q)[None] & ((k < own) | (k == q)[None])
        keep = None
        if logits == "last":
            ends = sorted({n - 1 for n in lengths})           # HF keeps these columns for every row
            keep = torch.tensor(ends, dtype=torch.int64, device=self.device)
        out = self._run(ids, torch.arange(m, device=self.device).expand(b, m), self._mask(mask[:, None]), keep=keep)
        if keep is not None:
            column = torch.tensor([ends.index(n - 1) for n in lengths], dtype=torch.int64, device=out.logits.device)
            out = TargetOutput(out.logits[torch.arange(b, device=column.device), column][:, None], out.hidden,
                               out.final)
        cut_cache(self._cache, self._width)
        return out

    def _mask(self, mask: Tensor) -> Tensor:
        return _mask_for(mask, self.attn_implementation, self.dtype)

    @torch.no_grad()
    def extend(self, input_ids: Tensor, logits: str = "all") -> TargetOutput:
        """Append ``input_ids`` (int64 ``[b, m]``) causally to the cache of rows of one length (``logits`` as in
        :meth:`prefill`)."""
        self._check_ids(input_ids)
        if logits not in ("all", "last"):
            raise ValueError(f"logits: expected 'all' or 'last', got {logits!r}")
        self._check_idle("input_ids")
        if self._cache is None:
            self.reset()
        b, m = input_ids.shape
        if not self._lengths:
            self._set_lengths([0] * b)
        if not self._uniform or b != len(self._lengths):
            raise ValueError(f"input_ids: extend appends to {len(self._lengths)} rows of one length; the cache holds "
                             f"rows of lengths {self._lengths} (use forward_next / forward_tree)")
        if m == 0:
            width = len(self.layer_ids) * self.hidden_size
            hidden = torch.zeros(b, 0, width, dtype=self.dtype, device=self.device) if self.layer_ids else None
            return TargetOutput(torch.zeros(b, 0, self.vocab_size, dtype=self.dtype, device=self.device), hidden)
        self._check_room(m, "input_ids")
        positions = torch.arange(self._width, self._width + m, device=self.device).expand(b, m)
        out = self._run(input_ids.to(self.device), positions, None, keep=1 if logits == "last" and m > 1 else None)
        self._set_lengths([self._width + m] * b)
        return out

    def tree_inputs(self, tree: DraftTree) -> TreeInputs:
        """Inputs that score row ``r`` of ``tree`` right after that row's committed slots
        (``dartree.verify.tree_inputs``); a one-row tree is filled into this target's :class:`TreeInputBuffer`,
        whose mask the next call overwrites: forward it first."""
        if not isinstance(tree, DraftTree):
            raise ValueError(f"tree: expected a DraftTree, got {type(tree).__name__}")
        if tree.batch_size != max(1, len(self._lengths)):
            raise ValueError(f"tree: {tree.batch_size} rows, the cache holds {len(self._lengths)}")
        self._check_room(tree.max_nodes, "tree")
        if tree.batch_size == 1 and tree.device == self.device:    # the decoding loop: refill buffers
            return self._inputs.fill(tree, self._width, kv_len=self.max_cache_len)     # None: a dynamic cache
        if self._uniform:
            return tree_inputs(tree, self._width, kv_len=self.max_cache_len)
        return tree_inputs(tree, self.lengths_tensor().to(tree.device), cache_len=self._width,
                           kv_len=self._kv_len(tree.max_nodes))

    @torch.no_grad()
    def forward_tree(self, inputs: TreeInputs, logits: str = "all") -> TargetOutput:
        """Score every tree node of every row in one forward; the n node slots stay pending until ``commit``.

        ``logits="root"``: the LM head on node 0 only, and every node's final hidden state in ``final``
        (:attr:`scores_rows_apart`); ``"all"``: every node.  Returns logits ``[b, n, V]`` (node i's predict the next).
        """
        if logits not in ("all", "root"):
            raise ValueError(f"logits: expected 'all' or 'root', got {logits!r}")
        self._check_idle("inputs")
        if self._cache is None:
            self.reset()
        n = inputs.input_ids.shape[1]
        if inputs.kv_len != self._kv_len(n) or inputs.input_ids.shape[0] != max(1, len(self._lengths)):
            raise ValueError(f"inputs: built for {inputs.kv_len} key columns and {inputs.input_ids.shape[0]} rows, "
                             f"the cache needs {self._kv_len(n)}; build them with target.tree_inputs(tree)")
        self._check_room(n, "inputs")
        mask = inputs.mask_for(self.attn_implementation, self.dtype)
        out = self._run(inputs.input_ids.to(self.device), inputs.position_ids.to(self.device), mask,
                        root_only=logits == "root")
        if not self._lengths:
            self._set_lengths([0] * inputs.input_ids.shape[0])
        self._pending = n
        return out

    @torch.no_grad()
    def forward_next(self, ids: Tensor) -> TargetOutput:
        """One causal step per row (the AR round): ``ids[r]`` (int64 ``[b]``) at position ``lengths[r]``;
        pending until commit.  Logits ``[b, 1, V]``."""
        self._check_idle("ids")
        b = len(self._lengths)
        if ids.shape != (b,):
            raise ValueError(f"ids: expected shape [{b}], got {tuple(ids.shape)}")
        self._check_room(1, "ids")
        w = self._width
        if self._uniform:                   # no padding column: plain causal attention
            positions, mask = torch.full((b, 1), w, dtype=torch.int64, device=self.device), None
        else:
            lengths = self.lengths_tensor()
            cols = torch.arange(self._kv_len(1), device=self.device)[None, :]
            positions, mask = lengths[:, None], self._mask(((cols < lengths[:, None]) | (cols == w))[:, None, None])
        out = self._run(ids[:, None].to(self.device), positions, mask)
        self._pending = 1
        return out

    @torch.no_grad()
    def commit(self, accepted: Tensor, count: int | list[int], host_nodes: list[int] | None = None) -> None:
        """Keep, per row, the committed prefix plus the first ``count`` (or ``count[r]``) accepted pending slots:
        ``accepted`` int64 ``[b, c]`` pending slot indices (-1 past a row's count is fine), ``c >= max(count)``.
        ``host_nodes``: ``accepted[0, :count]`` as a list (batch 1): nodes already in place are not copied."""
        if self._pending is None:
            raise ValueError("accepted: no forward is pending")
        b, pending = len(self._lengths), self._pending
        counts = [count] * b if isinstance(count, int) and not isinstance(count, bool) else count
        if not isinstance(counts, list) or len(counts) != b or any(
                isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= pending for k in counts):
            raise ValueError(f"count: expected an int (or {b} ints) in [1, {pending}], got {count!r}")
        c, w = max(counts), self._width
        if accepted.dim() != 2 or accepted.shape[0] != b or accepted.shape[1] < c:
            raise ValueError(f"accepted: expected int64 [{b}, >= {c}], got {tuple(accepted.shape)}")
        if self._uniform and min(counts) == c:      # rows of one length stay so: keep the tail in place
            if c < pending or host_nodes != list(range(c)):     # else every pending slot is kept where it is
                compact_tail(self._cache, w, accepted[:, :c].to(self.device), host_nodes)
            self._set_lengths([w + c] * b)
        else:
            lengths = self.lengths_tensor()
            cols = torch.arange(c, device=self.device)
            move_slots(self._cache, accepted[:, :c].clamp(min=0).to(self.device) + w, lengths[:, None] + cols)
            self._set_lengths([n + k for n, k in zip(self._lengths, counts, strict=True)])
            cut_cache(self._cache, self._width)
        self._pending = None

    @torch.no_grad()
    def rollback(self) -> None:
        """Drop the pending slots of every row (nothing committed)."""
        if self._pending is None:
            return
        cut_cache(self._cache, self._width)
        self._pending = None

    @torch.no_grad()
    def keep_rows(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in that order); the others leave the batch and stop costing (``[]``: empty)."""
        self._check_idle("rows")
        b = len(self._lengths)
        if any(isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < b for r in rows) \
                or len(set(rows)) != len(rows):
            raise ValueError(f"rows: expected distinct row indices in [0, {b}), got {rows}")
        if rows == list(range(b)):
            return
        if not rows:
            self.reset()
            return
        select_rows(self._cache, rows)
        self._set_lengths([self._lengths[r] for r in rows])
        cut_cache(self._cache, self._width)

    @torch.no_grad()
    def add_rows(self, contexts: list[Tensor], logits: str = "all") -> TargetOutput:
        """Append rows prefilled with ``contexts`` (1-D int64 each) after the current ones (a freed slot takes a new
        request): prefilled in a cache of their own, then both padded to one width and concatenated.  Returns the
        new rows' prefill outputs."""
        self._check_idle("contexts")
        if not self._lengths:
            return self.prefill(list(contexts), logits)
        old_cache, old_lengths = self._cache, self._lengths
        out = self.prefill(list(contexts), logits)                # into a fresh cache
        new_lengths = self._lengths
        lengths = old_lengths + new_lengths
        merge_rows(old_cache, self._cache, (len(old_lengths), len(new_lengths)), max(lengths))
        self._cache = old_cache
        self._set_lengths(lengths)
        cut_cache(self._cache, self._width)
        return out

    def row_cache(self, row: int) -> list[tuple[Tensor, Tensor]]:
        """Per layer, the committed keys and values of ``row``: ``[1, heads, lengths[row], d]`` each (tests)."""
        n = self._lengths[row]
        return [(layer.keys[row: row + 1, :, :n], layer.values[row: row + 1, :, :n])
                for layer in cache_layers(self._cache) if layer.is_initialized]
