"""DFlash-style block-parallel drafter (DFlash, arXiv 2602.06036): a whole block of tokens in one forward,
conditioned on the target's hidden states at ``target_layer_ids``, with the target's token embeddings and
LM head, and the weight names of the released z-lab checkpoints.  :class:`DFlashDrafter`,
:class:`DFlashConfig`, :func:`dflash_target_layer_ids`; the session, context cache, block layout
(``shift_label``) and architecture: docs/internals.md, "The DFlash drafter"."""

from __future__ import annotations

import math
import operator
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dartree.arguments import check_int, check_number
from dartree.block import DraftBlock
from dartree.models.kmajor import KMAJOR_LIMIT_BYTES, derived, linear
from dartree.models.pointwise import rms_norm, rotate, rotate_signed, signed_sin

__all__ = ["DFlashConfig", "DFlashDrafter", "dflash_target_layer_ids", "MAX_BLOCK_SIZE"]

#: Largest ``block_size`` accepted (the released drafters use 7 to 16).  A block is
#: ``block_size`` slots through every draft layer each round and a tree is at most
#: ``dartree.builders.MAX_NODES`` nodes, so anything larger is a typo that would only fail allocating.
MAX_BLOCK_SIZE = 4096


def dflash_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The reference rule for a config without ``target_layer_ids`` (z-lab and Domino ``build_target_layer_ids``):
    one layer per draft layer, evenly spaced (docs/checkpoints.md, "Target-layer fallback")."""
    check_int("num_target_layers", num_target_layers)
    check_int("num_draft_layers", num_draft_layers)
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    ids = [int(round(start + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]
    if min(ids) < -1 or max(ids) >= num_target_layers:
        raise ValueError(f"num_target_layers: the evenly spaced rule gives layers {ids} outside [-1, "
                         f"{num_target_layers}) for {num_draft_layers} draft layers; set target_layer_ids")
    return ids


@dataclass
class DFlashConfig:
    """Shape of a DFlash drafter.  ``hidden_size`` must equal the target's hidden size."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    target_layer_ids: list[int]
    mask_token_id: int
    block_size: int = 16
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    num_target_layers: int | None = None
    extra: dict = field(default_factory=dict)
    # ---- layout and rotary embedding (docs/internals.md, "The DFlash drafter")
    shift_label: bool = False
    rope_parameters: dict | None = None       # transformers' rope dict (rope_type, factor, ...); None = default
    max_position_embeddings: int = 32768      # read by the scaled rope types (Qwen3Config's default)

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                     "intermediate_size", "vocab_size"):
            check_int(name, getattr(self, name))
        if not isinstance(self.shift_label, bool):
            raise ValueError(f"shift_label: expected a bool, got {self.shift_label!r}")
        check_int("block_size", self.block_size, 2, MAX_BLOCK_SIZE)       # the root + at least one mask slot
        check_number("rms_norm_eps", self.rms_norm_eps, lambda x: 0 < x < 1,   # an epsilon >= 1 flattens every norm
                     "expected a number in (0, 1) (RMSNorm's epsilon, typically 1e-6)")
        check_number("rope_theta", self.rope_theta, lambda x: 0 < x < math.inf, "expected a finite number > 0")
        check_int("num_target_layers", self.num_target_layers, optional=True)
        check_int("mask_token_id", self.mask_token_id, 0, self.vocab_size - 1)
        check_int("head_dim", self.head_dim, 2, optional=True)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_key_value_heads: must divide num_attention_heads={self.num_attention_heads}, "
                             f"got {self.num_key_value_heads}")
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError("head_dim: required when hidden_size is not a multiple of num_attention_heads")
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.head_dim % 2:
            raise ValueError(f"head_dim: must be even for RoPE, got {self.head_dim}")
        ids = self.target_layer_ids
        try:                # integers only (numpy ints too): a float layer such as 1.5 is a typo, not layer 1
            if isinstance(ids, str | bytes) or any(isinstance(i, bool) for i in ids):
                raise TypeError
            self.target_layer_ids = [operator.index(i) for i in ids]
        except TypeError:
            raise ValueError(f"target_layer_ids: expected a list of ints (decoder layers, -1 = the embedding "
                             f"output), got {ids!r}") from None
        top = self.num_target_layers
        if not self.target_layer_ids or min(self.target_layer_ids) < -1 \
                or (top is not None and max(self.target_layer_ids) >= top):
            limit = f"< {top}" if top is not None else "(any upper bound)"
            raise ValueError(f"target_layer_ids: expected a non-empty list of decoder layers >= 0 and {limit}, "
                             f"or -1 for the embedding output, got {self.target_layer_ids}")
        if len(set(self.target_layer_ids)) != len(self.target_layer_ids):   # the same features twice: an export bug
            raise ValueError(f"target_layer_ids: expected distinct layers, got {self.target_layer_ids}")
        self._check_rope()

    def _check_rope(self) -> None:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        check_int("max_position_embeddings", self.max_position_embeddings)
        self.rope_theta = float(self.rope_theta)
        if self.rope_parameters is None:
            return
        if not isinstance(self.rope_parameters, dict):
            raise ValueError(f"rope_parameters: expected a dict or None, got {type(self.rope_parameters).__name__}")
        params = dict(self.rope_parameters)
        kind = params.setdefault("rope_type", params.pop("type", "default"))
        supported = ("default", *ROPE_INIT_FUNCTIONS)
        if kind not in supported:
            raise ValueError(f"rope_parameters: rope_type {kind!r} is not one of transformers' {list(supported)}")
        if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
            raise ValueError("rope_parameters: partial_rotary_factor != 1 is not supported (Qwen3 rotates whole heads)")
        self.rope_theta = float(params.setdefault("rope_theta", self.rope_theta))
        self.rope_parameters = params

    @property
    def first_slot(self) -> int:
        """The block slot that proposes depth 1: 0 with ``shift_label``, else 1 (slot 0 is the root)."""
        return 0 if self.shift_label else 1

    @property
    def gamma(self) -> int:
        return self.block_size - self.first_slot

    def to_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    """RMSNorm with a learned scale (``weight``), computed in float32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # perf: torch.rms_norm's bits in fewer ops, equal to the lines below in fp32
        # (tests/models/test_drafter_fast.py); the decoding paths call forward directly (no module call)
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class RotaryEmbedding(nn.Module):
    """RoPE tables for ``config``: the default rotary embedding, or transformers' ``Qwen3RotaryEmbedding`` for every
    scaled ``rope_type`` (as the reference drafters build theirs).  The tables stay float32 whatever
    ``drafter.to(dtype)`` does (not registered buffers) and follow the device of what they rotate."""

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        params = config.rope_parameters or {"rope_type": "default"}
        self.rope_type = params["rope_type"]
        self._scaled: nn.Module | None = None
        self._inv_freq: Tensor | None = None
        self._table: tuple[Tensor, Tensor] | None = None       # perf: see table()
        if self.rope_type == "default":
            dim = config.head_dim
            self._inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        else:
            from transformers import Qwen3Config
            from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

            hf = Qwen3Config(hidden_size=config.hidden_size, num_attention_heads=config.num_attention_heads,
                             num_key_value_heads=config.num_key_value_heads, head_dim=config.head_dim,
                             max_position_embeddings=config.max_position_embeddings,
                             rope_parameters=dict(params))
            object.__setattr__(self, "_scaled", Qwen3RotaryEmbedding(hf))   # not a child: never cast

    def table(self, start: int, count: int, like: Tensor) -> tuple[Tensor, Tensor]:
        """cos and signed sin (:func:`dartree.models.pointwise.signed_sin`) of positions ``start .. start + count - 1``,
        ``[1, 1, count, head_dim]`` in ``like``'s dtype and device, from :meth:`forward`.

        perf: the default rope reads a cached table (grown by doubling; the same elementwise ops as
        :meth:`forward`, so the same bits); scaled types (``dynamic`` depends on the largest position) call it.
        """
        if self._scaled is not None:
            cos, sin = self.forward(like, torch.arange(start, start + count, device=like.device))
            return cos, signed_sin(sin)
        end = start + count
        cache = self._table
        if cache is None or cache[0].shape[2] < end or cache[0].device != like.device or cache[0].dtype != like.dtype:
            cap = max(end, 256, 2 * (cache[0].shape[2] if cache is not None else 0))
            cos, sin = self.forward(like, torch.arange(cap, device=like.device))
            cache = self._table = (cos, signed_sin(sin))
        return cache[0][:, :, start:end], cache[1][:, :, start:end]

    def forward(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos and sin, both ``[b or 1, 1, t, head_dim]`` in ``x``'s dtype.  Shape: positions ``[b, t]`` or ``[t]``."""
        if self._scaled is not None:
            if self._scaled.inv_freq.device != x.device:
                self._scaled.to(x.device)
            cos, sin = self._scaled(x, positions if positions.dim() == 2 else positions[None])
            return cos[:, None], sin[:, None]
        if self._inv_freq.device != x.device:
            self._inv_freq = self._inv_freq.to(x.device)
        angles = positions.to(torch.float32)[..., None] * self._inv_freq                 # [b, t, dim/2]
        emb = torch.cat([angles, angles], dim=-1)
        if emb.dim() == 2:
            emb = emb[None]
        return emb.cos()[:, None].to(x.dtype), emb.sin()[:, None].to(x.dtype)


def _fused_weight(module: nn.Module, names: tuple[str, ...]) -> Tensor:
    """perf: the weights of the linears ``names`` of ``module`` concatenated along the output dim, so that one
    matmul replaces several (each output column is the same dot product); cached by :func:`derived`."""
    ws = [getattr(module, n).weight for n in names]
    return derived(module, "_fused_" + "_".join(names), ws, lambda: torch.cat([w.detach() for w in ws]))


def _matmul(x: Tensor, w: Tensor) -> Tensor:
    """perf: ``F.linear(x, w)`` bit for bit, from a K-major copy where that is exact
    (:func:`dartree.models.kmajor.linear`); weights over 1/16 of ``KMAJOR_LIMIT_BYTES`` are not copied."""
    return linear(x, w, None, w.numel() * w.element_size() <= KMAJOR_LIMIT_BYTES // 16)


def _project(x: Tensor, module: nn.Module, names: tuple[str, ...]) -> Tensor:
    """perf: ``x`` through the linears ``names`` of ``module`` as one :func:`_matmul` (:func:`_fused_weight`)."""
    w = _fused_weight(module, names) if len(names) > 1 else getattr(module, names[0]).weight
    return _matmul(x, w)


class DFlashAttention(nn.Module):
    """Block queries attending to [context; block] keys and values (non-causal)."""

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        h, hd = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, hd
        self.rotary = RotaryEmbedding(config)
        self.q_proj = nn.Linear(h, self.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(h, self.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(h, self.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.num_heads * hd, h, bias=False)
        self.q_norm = RMSNorm(hd, config.rms_norm_eps)
        self.k_norm = RMSNorm(hd, config.rms_norm_eps)

    def key_values(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Keys (normed, rotated) and values of ``x``.  Shape: x ``[b, t, H]``; positions ``[b, t]`` or ``[t]``
        -> two ``[b, kv_heads, t, head_dim]``."""
        b, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return rotate(k, *self.rotary(k, positions)), v

    def forward(self, x: Tensor, positions: Tensor, ctx_k: Tensor, ctx_v: Tensor, mask: Tensor | None) -> Tensor:
        """Shape: x ``[b, t, H]``; ctx_k/ctx_v ``[b, kv_heads, c, head_dim]``; mask bool ``[b, 1, t, c + t]``."""
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.num_heads, self.head_dim)).transpose(1, 2)
        q = rotate(q, *self.rotary(q, positions))
        k, v = self.key_values(x, positions)
        k = torch.cat([ctx_k, k], dim=2)
        v = torch.cat([ctx_v, v], dim=2)
        # grouped-query attention inside sdpa (perf: no repeat_interleave copy of the keys / values)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / math.sqrt(self.head_dim),
                                             enable_gqa=self.num_heads != self.num_kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class DFlashMLP(nn.Module):
    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashLayer(nn.Module):
    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.self_attn = DFlashAttention(config)
        self.mlp = DFlashMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: Tensor, positions: Tensor, ctx_k: Tensor, ctx_v: Tensor, mask: Tensor | None) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))

    # ---- perf: the decoding paths of DFlashDrafter.append_context and .draft (same math as forward)
    def store_context(self, x: Tensor, cos: Tensor, sin: Tensor, k_buf: Tensor, v_buf: Tensor, start: int) -> None:
        """Write :meth:`DFlashAttention.key_values` of context features ``x`` into ``k_buf/v_buf[:, :, start:]``
        (one k/v matmul).  Shape: x ``[b, t, H]``; cos/sin ``[1, 1, t, hd]`` (sin signed); buffers
        ``[b, kv, >= start + t, hd]``."""
        a = self.self_attn
        b, t, _ = x.shape
        nkv = a.num_kv_heads * a.head_dim
        kv = _project(x, a, ("k_proj", "v_proj"))
        k = a.k_norm.forward(kv[..., :nkv].view(b, t, a.num_kv_heads, a.head_dim))
        k_buf[:, :, start:start + t] = rotate_signed(k.transpose(1, 2), cos, sin)
        v_buf[:, :, start:start + t] = kv[..., nkv:].view(b, t, a.num_kv_heads, a.head_dim).transpose(1, 2)

    def decode(self, x: Tensor, cos: Tensor, sin: Tensor, k_buf: Tensor, v_buf: Tensor, start: int) -> Tensor:
        """:meth:`forward` of one block with no mask, the context being ``k_buf/v_buf[:, :, :start]``.

        The block's keys/values go into the buffers' spare slots ``start .. start + t`` (scratch: a later append
        overwrites them), so attention reads one view instead of a concatenated copy; q/k/v and gate/up are one
        matmul each (:func:`_fused_weight`).

        Shape:
            x ``[b, t, H]``; cos/sin ``[1, 1, t, hd]`` (sin signed); k_buf/v_buf ``[b, kv, >= start + t, hd]``.
        """
        a = self.self_attn
        b, t, _ = x.shape
        nq, nkv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
        qkv = _project(self.input_layernorm.forward(x), a, ("q_proj", "k_proj", "v_proj"))
        q = rotate_signed(a.q_norm.forward(qkv[..., :nq].view(b, t, a.num_heads, a.head_dim)).transpose(1, 2), cos, sin)
        k = a.k_norm.forward(qkv[..., nq:nq + nkv].view(b, t, a.num_kv_heads, a.head_dim))
        k = rotate_signed(k.transpose(1, 2), cos, sin)
        end = start + t
        k_buf[:, :, start:end] = k
        v_buf[:, :, start:end] = qkv[..., nq + nkv:].view(b, t, a.num_kv_heads, a.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k_buf[:, :, :end], v_buf[:, :, :end],
                                             scale=1.0 / math.sqrt(a.head_dim),
                                             enable_gqa=a.num_heads != a.num_kv_heads)
        x = x + _project(out.transpose(1, 2).reshape(b, t, -1), a, ("o_proj",))
        m = self.mlp
        gate_up = _project(self.post_attention_layernorm.forward(x), m, ("gate_proj", "up_proj"))
        inter = m.gate_proj.out_features
        return x + _project(F.silu(gate_up[..., :inter]) * gate_up[..., inter:], m, ("down_proj",))


class DFlashDrafter(nn.Module):
    """Block-parallel drafter conditioned on target hidden states (docs/internals.md, "The DFlash drafter"):
    ``target``, an optional HF causal LM whose input embedding and output head it shares (:meth:`bind`);
    ``heads``, the correction heads shipped with its checkpoint."""

    def __init__(self, config: DFlashConfig, target: nn.Module | None = None) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_hidden_layers))
        self.fc = nn.Linear(len(config.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.heads: dict[str, object] = {}
        self._embedding: Tensor | None = None
        self._lm_head: Tensor | None = None
        self._kv: list[tuple[Tensor, Tensor]] | None = None    # per layer [b, kv, capacity, hd] (perf)
        self._length = 0
        self._held: list[Tensor] = []       # appended hidden states whose keys/values the next draft computes
        self._block_ids: Tensor | None = None                   # perf: [b, block_size] scratch of draft()
        if target is not None:
            self.bind(target)

    # ----------------------------------------------------------------------------- properties
    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        return tuple(self.config.target_layer_ids)

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def gamma(self) -> int:
        return self.config.gamma

    @property
    def mask_token_id(self) -> int:
        return self.config.mask_token_id

    @property
    def context_length(self) -> int:
        """Context entries held (equals the target's committed cache length during decoding)."""
        return self._length + sum(h.shape[1] for h in self._held)

    @property
    def embedding_weight(self) -> Tensor:
        """The shared token-embedding matrix ``[V, H]`` (the target's, after :meth:`bind`)."""
        if self._embedding is None:
            raise ValueError("target: the drafter is not bound to a target; call drafter.bind(target_model)")
        return self._embedding

    @property
    def lm_head_weight(self) -> Tensor:
        """The shared LM-head matrix ``[V, H]`` (the target's, after :meth:`bind`)."""
        if self._lm_head is None:
            raise ValueError("target: the drafter is not bound to a target; call drafter.bind(target_model)")
        return self._lm_head

    def lm_head_as(self, dtype: torch.dtype) -> Tensor:
        """:attr:`lm_head_weight` in ``dtype``.  perf: a drafter in another dtype than the target's shared LM head
        casts it once (rebuilt when the head is replaced or edited): a cast and a new K-major copy per block cost
        more (docs/results.md)."""
        head = self.lm_head_weight
        return head if head.dtype == dtype else derived(self, f"_lm_head_{dtype}", [head], lambda: head.to(dtype))

    def bind(self, target: nn.Module) -> DFlashDrafter:
        """Share ``target``'s input embedding and LM head (not copied, not part of ``state_dict``)."""
        emb = target.get_input_embeddings() if hasattr(target, "get_input_embeddings") else None
        head = target.get_output_embeddings() if hasattr(target, "get_output_embeddings") else None
        if emb is None or head is None:
            raise ValueError("target: expected a HF causal LM with input embeddings and an output head")
        self.set_shared_weights(emb.weight, head.weight)
        return self

    def set_shared_weights(self, embedding: Tensor, lm_head: Tensor) -> None:
        """Use ``embedding`` / ``lm_head`` (both ``[V, H]``) as the shared token matrices."""
        shape = (self.config.vocab_size, self.config.hidden_size)
        for name, w in (("embedding", embedding), ("lm_head", lm_head)):
            if not isinstance(w, Tensor) or tuple(w.shape) != shape:
                got = tuple(w.shape) if isinstance(w, Tensor) else type(w).__name__
                raise ValueError(f"{name}: expected shape {shape} (vocab_size, hidden_size), got {got}")
        # plain attributes, not registered: the target owns these parameters (no state_dict entry,
        # no gradient through drafter.parameters())
        object.__setattr__(self, "_embedding", embedding)
        object.__setattr__(self, "_lm_head", lm_head)
        for slot in [k for k in self.__dict__ if k.startswith("_lm_head_")]:
            del self.__dict__[slot]         # casts of the head shared before (lm_head_as)

    # ---------------------------------------------------------------------------- context cache
    def reset(self) -> None:
        """Forget the context (start of a new sequence)."""
        self._kv = None
        self._length = 0
        self._held = []

    # ---- context storage (perf): preallocated per-layer buffers, appended in place, grown by doubling
    @property
    def _ctx(self) -> list[tuple[Tensor, Tensor]] | None:
        """Per-layer context keys/values, ``[b, kv, context_length, hd]`` views of the buffers."""
        self._flush()
        if self._kv is None:
            return None
        n = self._length
        return [(k[:, :, :n], v[:, :, :n]) for k, v in self._kv]

    def _reserve(self, b: int, end: int, like: Tensor) -> list[tuple[Tensor, Tensor]]:
        """The buffers, grown by doubling to hold ``end`` entries (``like``: dtype and device); with an empty
        context, buffers of another batch, dtype or device are replaced."""
        kv = self._kv
        if kv is not None and not self._length and (kv[0][0].shape[0] != b or kv[0][0].dtype != like.dtype
                                                    or kv[0][0].device != like.device):
            kv = self._kv = None
        if kv is not None and kv[0][0].is_inference() and not torch.is_inference_mode_enabled():
            # made by a decode (inference mode); written in place here, outside it: copy them out once
            kv = self._kv = [(k.clone(), v.clone()) for k, v in kv]
        if kv is None or end > kv[0][0].shape[2]:
            c = self.config
            cap = max(end, 64, 2 * (kv[0][0].shape[2] if kv is not None else 0))
            grown = []
            for i in range(len(self.layers)):
                k = like.new_empty(b, c.num_key_value_heads, cap, c.head_dim)
                v = like.new_empty(b, c.num_key_value_heads, cap, c.head_dim)
                if kv is not None and self._length:
                    k[:, :, :self._length] = kv[i][0][:, :, :self._length]
                    v[:, :, :self._length] = kv[i][1][:, :, :self._length]
                grown.append((k, v))
            kv = self._kv = grown
        return kv

    def crop(self, length: int) -> None:
        """Keep only the first ``length`` context entries."""
        self._flush()
        check_int("length", length, 0, self._length)
        self._length = length          # the buffers keep their slots; later appends overwrite them

    def context_features(self, hidden_states: Tensor) -> Tensor:
        """``hidden_norm(fc(hidden_states))``.  Shape: ``[b, m, len(target_layer_ids) * H] -> [b, m, H]``."""
        self._check_hidden(hidden_states)
        w = self.fc.weight
        x = hidden_states if hidden_states.dtype == w.dtype else hidden_states.to(w.dtype)
        return self.hidden_norm.forward(_matmul(x, w))

    def _check_hidden(self, hidden_states: object) -> None:
        width = len(self.config.target_layer_ids) * self.config.hidden_size
        if not isinstance(hidden_states, Tensor) or hidden_states.dim() != 3 or hidden_states.shape[-1] != width:
            got = tuple(hidden_states.shape) if isinstance(hidden_states, Tensor) else type(hidden_states).__name__
            raise ValueError(f"hidden_states: expected [b, m, {width}] (target layers "
                             f"{list(self.target_layer_ids)} concatenated), got {got}")

    def context_key_values(self, features: Tensor, positions: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Per-layer keys/values of context features.  Shape: features ``[b, m, H]``; positions ``[b, m]`` or
        ``[m]`` -> per layer two ``[b, kv, m, hd]``."""
        return [layer.self_attn.key_values(features, positions) for layer in self.layers]

    def append_context(self, hidden_states: Tensor, tokens: Tensor | None = None) -> None:
        """Append the target's hidden states of newly cached tokens (positions ``context_length..``).

        Shape:
            hidden_states: ``[b, m, len(target_layer_ids) * H]`` (``TargetOutput.hidden``).  tokens: optional int64
            ``[b, m]``, only checked (the hidden states already hold them).
        """
        if hidden_states is None:
            raise ValueError("hidden_states: the DFlash drafter needs the target's hidden states, got None")
        self._check_hidden(hidden_states)
        b, m, _ = hidden_states.shape
        if tokens is not None and (not isinstance(tokens, Tensor) or tuple(tokens.shape) != (b, m)):
            got = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
            raise ValueError(f"tokens: expected shape {(b, m)} to match hidden_states, got {got}")
        batch = self._held[0].shape[0] if self._held else self._kv[0][0].shape[0] if self._length else b
        if batch != b:
            raise ValueError(f"hidden_states: batch {b} differs from the context's batch {batch}")
        if m:
            self._held.append(hidden_states)       # perf: computed by the next draft, in its pass (see above)

    def _take_held(self) -> Tensor | None:
        """The context features of the held appends (``[b, m, H]``) or ``None``; nothing is held after."""
        if not self._held:
            return None
        held = self._held[0] if len(self._held) == 1 else torch.cat(self._held, dim=1)
        self._held = []
        return self.context_features(held)

    def _flush(self) -> None:
        """Compute the held appends now (for a reader of the context other than :meth:`draft`)."""
        feats = self._take_held()
        if feats is None:
            return
        # perf: context_key_values(feats, arange(n, n + m)) written straight into the buffers, with one
        # k/v matmul per layer and the cached rotary table
        n, (b, m, _) = self._length, feats.shape
        kv = self._reserve(b, n + m, feats)
        cos, sin = self.layers[0].self_attn.rotary.table(n, m, feats)
        for layer, (k_buf, v_buf) in zip(self.layers, kv, strict=True):
            layer.store_context(feats, cos, sin, k_buf, v_buf, n)
        self._length += m

    def _empty_context(self, b: int, device: torch.device) -> list[tuple[Tensor, Tensor]]:
        c = self.config
        empty = torch.zeros(b, c.num_key_value_heads, 0, c.head_dim, device=device, dtype=self.fc.weight.dtype)
        return [(empty, empty) for _ in self.layers]

    # ---------------------------------------------------------------------------------- drafting
    def block_hidden(
        self,
        root: Tensor,
        positions: Tensor,
        ctx: list[tuple[Tensor, Tensor]],
        mask: Tensor | None = None,
    ) -> Tensor:
        """Final-normed hidden states of blocks ``[root, mask, ..., mask]`` (the reference forward).

        Shape:
            root: int64 ``[b, n]`` (n blocks per row); positions: ``[b, n * block_size]``; ctx: per layer keys/values
            ``[b, kv, c, hd]``; mask: bool ``[b, 1, n * block_size, c + n * block_size]`` or ``None``
            -> ``[b, n * block_size, H]``.
        """
        b, n = root.shape
        ids = torch.full((b, n, self.block_size), self.mask_token_id, dtype=torch.int64, device=root.device)
        ids[:, :, 0] = root
        x = F.embedding(ids.view(b, n * self.block_size), self.embedding_weight).to(self.fc.weight.dtype)
        for layer, (k, v) in zip(self.layers, ctx, strict=True):
            x = layer(x, positions, k, v, mask)
        return self.norm(x)

    @torch.no_grad()
    def draft(self, root: Tensor) -> DraftBlock:
        """One block: marginals of the next ``gamma`` tokens after ``root``.

        Shape:
            root: int64 ``[b]`` (the last committed token, at position ``context_length``)
            -> ``DraftBlock(logits [b, gamma, V], hidden [b, gamma, H], root [b])``.
        """
        if not isinstance(root, Tensor) or root.dtype != torch.int64 or root.dim() != 1:
            raise ValueError("root: expected an int64 tensor of shape [b]")
        b = root.shape[0]
        batch = self._held[0].shape[0] if self._held else self._kv[0][0].shape[0] if self._length else b
        if batch != b:
            raise ValueError(f"root: batch {b} differs from the context's batch {batch}")
        # perf: block_hidden(root[:, None], arange(n, n + block_size), self._ctx) as DFlashLayer.decode, with
        # reused block ids, one rotary table, only the gamma depth slots through the LM head, and the held
        # context appends stored per layer (DFlashLayer.store_context) right before the block reads them
        feats = self._take_held()
        m = 0 if feats is None else feats.shape[1]
        n, size, embedding = self._length, self.block_size, self.embedding_weight
        ids = self._block_ids
        if ids is None or ids.shape[0] != b or ids.device != root.device \
                or (ids.is_inference() and not torch.is_inference_mode_enabled()):
            ids = self._block_ids = torch.full((b, size), self.mask_token_id, dtype=torch.int64, device=root.device)
        ids[:, 0] = root
        x = F.embedding(ids, embedding)
        dtype = self.fc.weight.dtype
        if x.dtype != dtype:
            x = x.to(dtype)
        kv = self._reserve(b, n + m + size, x)
        cos, sin = self.layers[0].self_attn.rotary.table(n, m + size, x)
        if m:
            ctx_cos, ctx_sin, cos, sin = cos[:, :, :m], sin[:, :, :m], cos[:, :, m:], sin[:, :, m:]
        for layer, (k_buf, v_buf) in zip(self.layers, kv, strict=True):
            if m:
                layer.store_context(feats, ctx_cos, ctx_sin, k_buf, v_buf, n)
            x = layer.decode(x, cos, sin, k_buf, v_buf, n + m)
        self._length = n + m
        hidden = self.norm.forward(x[:, self.config.first_slot:])                              # slot -> depth
        logits = _matmul(hidden.reshape(-1, hidden.shape[-1]), self.lm_head_as(dtype))
        return DraftBlock(logits=logits.view(b, self.gamma, -1), root=root, hidden=hidden)

    def forward(self, root: Tensor) -> DraftBlock:
        """Same as :meth:`draft`."""
        return self.draft(root)
