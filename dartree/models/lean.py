"""perf: a Llama-family HF causal LM's forward without its module machinery, same numbers.

``HFTarget`` uses it only after a probe shows it equal to the model's own forward bit for bit
(docs/verification.md, "The lean forward").
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.cache_utils import DynamicLayer
from transformers.masking_utils import create_causal_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from dartree.models.hf_compat import cache_kwargs
from dartree.models.kmajor import derived, exact_from, kmajor_allowed, kmajor_product, tensor_version
from dartree.models.pointwise import rms_norm, rotate, rotate_signed, signed_sin

__all__ = ["LeanForward", "MODEL_TYPES", "lean_forward"]

#: the HF model types whose decoder layers :class:`LeanForward` knows
MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")
_ACTS = {"SiLUActivation", "SiLU"}


def _rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """HF's ``*RMSNorm.forward``, op for op (its fp32 casts skipped where they are no-ops).

    perf (CPU, float32): :func:`dartree.models.pointwise.rms_norm`, HF's ops in fewer dispatches with equal bits
    (tested, and probed by ``HFTarget``).  Accelerators keep HF's ops: the fused kernel's bits there are unchecked.
    """
    dtype = x.dtype
    if dtype == torch.float32 and x.device.type == "cpu":
        return rms_norm(x, weight, eps)
    h = x if dtype == torch.float32 else x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * (h if dtype == torch.float32 else h.to(dtype))


def _append(cache, index: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """``cache.update(k, v, index)``; perf: a ``DynamicLayer``'s keys / values are kept as prefix views of buffers
    with spare slots, so an append writes the new slots in place instead of concatenating a copy of the whole
    cache (buffers grow by half when full).  Code that replaces the layer's tensors is noticed: the next append
    starts new buffers from them."""
    layer = cache.layers[index]
    if type(layer) is not DynamicLayer:
        return cache.update(k, v, index)
    if not layer.is_initialized:
        layer.lazy_initialization(k, v)
    keys, values = layer.keys, layer.values
    m = k.shape[-2]
    buffers = layer.__dict__.get("_dartree_kv")
    if keys.dim() == 4 and keys.shape[-2] > 0:
        length = keys.shape[-2]
        fits = buffers is not None and buffers[0].shape[-2] >= length + m and all(
            t.data_ptr() == buf.data_ptr() and t.stride() == buf.stride() and t.shape[:2] == buf.shape[:2]
            and t.shape[-1] == buf.shape[-1] and t.dtype == buf.dtype and t.device == buf.device
            for t, buf in ((keys, buffers[0]), (values, buffers[1])))
    else:
        length, fits = 0, False
    if not fits:
        b, heads, _, _ = k.shape
        cap = length + m + max(256, (length + m) // 2)
        new = []
        for old, x in ((keys, k), (values, v)):
            buf = x.new_empty(b, heads, cap, x.shape[-1])
            if length:
                buf[:, :, :length] = old
            new.append(buf)
        buffers = layer.__dict__["_dartree_kv"] = tuple(new)
    kbuf, vbuf = buffers
    kbuf[:, :, length:length + m] = k
    vbuf[:, :, length:length + m] = v
    layer.keys, layer.values = kbuf[:, :, :length + m], vbuf[:, :, :length + m]
    return layer.keys, layer.values


def _sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scaling: float, groups: int) -> Tensor:
    """HF's ``sdpa_attention_forward`` for these layers, with grouped-query attention inside sdpa
    instead of its copies of the keys and values (``repeat_kv``); ``[b, m, heads, d]`` out."""
    m = q.shape[2]
    causal = mask is None and m > 1
    if causal and k.shape[2] > m:        # as HF: a prefill into an empty static cache attends to its own slots
        k, v = k[:, :, :m], v[:, :, :m]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling, is_causal=causal,
                                         enable_gqa=groups > 1)
    return out.transpose(1, 2)


class _Linear:
    """One ``nn.Linear``: :func:`dartree.models.kmajor.linear` with its decisions made once (perf: a forward makes
    dozens of these calls).  Runs without autograd, on the device and dtype it was probed on."""

    __slots__ = ("params", "start", "width")

    def __init__(self, module: nn.Linear, kmajor: bool) -> None:
        w = module.weight
        self.params, self.width = module._parameters, w.shape[1]     # the live dict: no Module.__getattr__ a call
        self.start = exact_from(w.shape[1], w.shape[0], w.dtype, module.bias is not None) \
            if kmajor and w.device.type == "cpu" else None

    def __call__(self, x: Tensor) -> Tensor:
        p = self.params
        w, b = p["weight"], p.get("bias")
        if self.start is not None and x.numel() >= self.start * self.width and not torch.is_grad_enabled():
            return kmajor_product(x, w, b)
        return F.linear(x, w, b)


class _Layer:
    def __init__(self, layer: nn.Module, index: int, kmajor: bool) -> None:
        a, mlp = layer.self_attn, layer.mlp
        self.attn, self.index, self.head_dim = a, index, int(a.head_dim)
        self.q, self.k, self.v, self.o = (_Linear(getattr(a, n), kmajor)
                                          for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
        self.gate, self.up, self.down = (_Linear(getattr(mlp, n), kmajor)
                                         for n in ("gate_proj", "up_proj", "down_proj"))
        self.norm_in, self.norm_post = layer.input_layernorm, layer.post_attention_layernorm
        self.q_norm, self.k_norm = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
        self.groups = int(a.num_key_value_groups)

    def qk_norm_weight(self, heads_q: int, heads_k: int) -> Tensor:
        """``q_norm``'s weight for each of ``heads_q`` heads, then ``k_norm``'s for ``heads_k``: ``[hq + hk, d]``
        (perf: q and k are normed and rotated as one tensor, element for element the two norms' products)."""
        wq, wk = self.q_norm.weight, self.k_norm.weight
        return derived(self, "_qk_norm", [wq, wk], lambda: torch.cat([wq.detach().expand(heads_q, -1),
                                                                       wk.detach().expand(heads_k, -1)]))


def _why_not(model: nn.Module) -> str | None:
    """Why :class:`LeanForward` cannot run ``model`` (``None``: it can)."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in MODEL_TYPES:
        return f"model_type {kind!r} is not one of {MODEL_TYPES}"
    if getattr(config, "_attn_implementation", None) not in ("eager", "sdpa"):
        return f"attention {config._attn_implementation!r}"
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()):
        return "layers other than full attention"
    windowed = kind == "mistral" or getattr(config, "use_sliding_window", False)
    if getattr(config, "sliding_window", None) is not None and windowed:
        return "sliding-window attention"
    base = getattr(model, "model", None)
    head = getattr(model, "lm_head", None)
    if base is None or not isinstance(head, nn.Linear) or head.bias is not None:
        return "no .model / bias-free .lm_head Linear"
    for name in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(base, name):
            return f"no .model.{name}"
    if not isinstance(base.embed_tokens, nn.Embedding):
        return "embed_tokens is not an nn.Embedding"
    if len(base.layers) != config.num_hidden_layers:
        return "layer count differs from config.num_hidden_layers"
    norms = [base.norm]
    for layer in base.layers:
        a, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if a is None or mlp is None:
            return "a layer without self_attn / mlp"
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            if not isinstance(getattr(a, n, None), nn.Linear):
                return f"self_attn.{n} is not an nn.Linear"
        for n in ("gate_proj", "up_proj", "down_proj"):
            if not isinstance(getattr(mlp, n, None), nn.Linear):
                return f"mlp.{n} is not an nn.Linear"
        if type(getattr(mlp, "act_fn", None)).__name__ not in _ACTS:
            return f"activation {type(getattr(mlp, 'act_fn', None)).__name__}"
        if not all(hasattr(a, n) for n in ("head_dim", "scaling", "num_key_value_groups")):
            return "self_attn lacks head_dim / scaling / num_key_value_groups"
        norms += [getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None)]
        qk_norms = [getattr(a, n) for n in ("q_norm", "k_norm") if hasattr(a, n)]
        if len({getattr(n, "variance_epsilon", None) for n in qk_norms}) > 1:
            return "q_norm and k_norm with different epsilons"
        norms += qk_norms
    if any(type(n).__name__ not in _NORMS or not hasattr(n, "variance_epsilon") for n in norms):
        return "a norm other than the Llama-family RMSNorm"
    return None


def lean_forward(model: nn.Module) -> tuple[LeanForward | None, str | None]:
    """``(LeanForward(model), None)``, or ``(None, reason)`` when the model's layout is not one it knows."""
    why = _why_not(model)
    return (LeanForward(model), None) if why is None else (None, why)


class LeanForward:
    """The forward of a supported HF causal LM; check with :func:`lean_forward`.

    Args:
        model: the HF model (its weights are read at every call: edits and reloads are seen).
        grouped: with sdpa on the CPU, sdpa's own grouped-query attention instead of HF's attention function and
            its copies of the keys and values (CUDA's fused kernels take no mask with it: HF's ``use_gqa_in_sdpa``).
    """

    def __init__(self, model: nn.Module, grouped: bool = True) -> None:
        self.model = model
        self.config = model.config
        impl = self.config._attn_implementation
        self.grouped = grouped and impl == "sdpa" and next(model.parameters()).device.type == "cpu"
        base = model.model
        self._base = base
        kmajor = kmajor_allowed(model)
        self._layers = [_Layer(layer, i, kmajor) for i, layer in enumerate(base.layers)]
        self._head = _Linear(model.lm_head, kmajor)
        module = sys.modules[type(base.layers[0].self_attn).__module__]
        self._attention = ALL_ATTENTION_FUNCTIONS.get_interface(impl, module.eager_attention_forward)
        # perf: the default RoPE's cos / sin from a table on the CPU (:meth:`_rotary_rows`); other types
        # (dynamic ones change inv_freq with the length) call the module every time
        self._rope_table = getattr(base.rotary_emb, "rope_type", None) == "default"
        self._rope: tuple | None = None

    def _rotary_rows(self, h: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor, bool]:
        """``(*base.rotary_emb(h, position_ids), False)`` bit for bit, or where the table applies
        ``(cos, signed_sin(sin), True)``.  perf (CPU, default RoPE): rows of a table the module made for positions
        ``0..P-1`` (grown by half), gathered per call; each entry is elementwise in its position, so a row is the
        module's output there (tested); rebuilt when ``inv_freq`` is replaced or edited."""
        rotary = self._base.rotary_emb
        inv = rotary._buffers.get("inv_freq") if self._rope_table else None
        if inv is None or h.device.type != "cpu":
            return (*rotary(h, position_ids), False)
        need = int(position_ids.max()) + 1
        cached = self._rope
        if cached is None or cached[0] is not inv or cached[1] != tensor_version(inv) or cached[2] != h.dtype \
                or cached[3].shape[0] < need:
            size = max(need, 256, 0 if cached is None else cached[3].shape[0] * 3 // 2)
            cos, sin = rotary(h[:, :1], torch.arange(size, device=h.device)[None])     # [1, P, D] each
            cached = self._rope = (inv, tensor_version(inv), h.dtype, cos[0], signed_sin(sin[0]))
        return cached[3][position_ids], cached[4][position_ids], True

    def __call__(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        attention_mask: Tensor | None,
        cache,
        hidden_ids: tuple[int, ...] = (),
        keep: int | Tensor = 0,
        final: bool = False,
    ) -> tuple[Tensor, list[Tensor], Tensor | None]:
        """One forward that appends to ``cache`` as the model's own forward would.

        ``hidden_ids``: indices into HF's ``hidden_states`` (0: embeddings; ``i + 1``: layer ``i``; ``num_layers``:
        the final-normed state) to return, in order; ``keep``: HF's ``logits_to_keep``; ``final``: also return the
        final-normed hidden states.

        Shape:
            input_ids, position_ids: int64 ``[b, m]``; attention_mask: a prepared 4-D mask or ``None`` (causal)
            -> ``(logits [b, kept, V], [hidden [b, m, H] per hidden_ids], final [b, m, H] | None)``.
        """
        base, config = self._base, self.config
        h = F.embedding(input_ids, base.embed_tokens.weight, base.embed_tokens.padding_idx)
        if attention_mask is None:
            attention_mask = create_causal_mask(config=config, inputs_embeds=h, attention_mask=None,
                                                position_ids=position_ids, **cache_kwargs(create_causal_mask, cache))
        rows_cos, rows_sin, signed = self._rotary_rows(h, position_ids)  # [b, m, d]: one row per position
        cos, sin = rows_cos.unsqueeze(1), rows_sin.unsqueeze(1)
        turn = rotate_signed if signed else rotate
        b, m = input_ids.shape
        count = len(self._layers)
        wanted = set(hidden_ids)
        states: dict[int, Tensor] = {0: h} if 0 in wanted else {}
        attention = self._attention
        for layer in self._layers:
            a, d = layer.attn, layer.head_dim
            norm = layer.norm_in
            x = _rms(h, norm.weight, norm.variance_epsilon)
            q = layer.q(x).view(b, m, -1, d)
            k = layer.k(x).view(b, m, -1, d)
            v = layer.v(x).view(b, m, -1, d).transpose(1, 2)
            hq = q.shape[2]
            qk = torch.cat((q, k), dim=2)                                       # [b, m, hq + hk, d]
            if layer.q_norm is not None:
                qk = _rms(qk, layer.qk_norm_weight(hq, qk.shape[2] - hq), layer.q_norm.variance_epsilon)
            qk = turn(qk.transpose(1, 2), cos, sin)
            k, v = _append(cache, layer.index, qk[:, hq:], v)
            if self.grouped:
                out = _sdpa(qk[:, :hq], k, v, attention_mask, a.scaling, layer.groups)
            else:
                out, _ = attention(a, qk[:, :hq], k, v, attention_mask, dropout=0.0, scaling=a.scaling)
            h = h + layer.o(out.reshape(b, m, -1))
            norm = layer.norm_post
            x = _rms(h, norm.weight, norm.variance_epsilon)
            # perf: F.silu itself, not the module call (_why_not admits only SiLU activations)
            h = h + layer.down(F.silu(layer.gate(x)) * layer.up(x))
            if layer.index + 1 in wanted and layer.index + 1 < count:
                states[layer.index + 1] = h
        norm = base.norm
        h = _rms(h, norm.weight, norm.variance_epsilon)
        states[count] = h
        if isinstance(keep, Tensor):
            rows = h[:, keep]
        else:
            rows = h[:, -keep:] if keep else h
        logits = self._head(rows)
        return logits, [states[i] for i in hidden_ids], h if final else None
