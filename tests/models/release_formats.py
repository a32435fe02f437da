"""Release-format checkpoints built from documented facts, and an independent forward to compare with.

Facts (sources in docs/checkpoints.md): z-lab DFlash keeps ``mask_token_id`` / ``target_layer_ids``
in ``dflash_config`` and reads ``config.block_size``; Domino adds ``projector_type``,
``gru_hidden_dim``, ``emb_dim`` (top level), ``use_bias_norm``, ``use_bias_gate``, ``shift_label``,
a bias-free ``prefix_gru`` / ``embed_proj``; DeepSpec DSpark keeps everything at the top level with
``num_anchors``, ``markov_rank``, ``enable_confidence_head`` and ships ``embed_tokens`` / ``lm_head``.
Released weights are bfloat16.  The forward below is written from the formulas (not from any
implementation): it recomputes the whole block with full attention over [context; block].
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS, VOCAB = 32, 4, 2, 8, 40, 2, 111
TARGET_LAYERS, BLOCK, MASK = 5, 5, 110
EMB, GRU = 16, 12


def qwen3_keys(**extra) -> dict:
    config = {"model_type": "qwen3", "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
              "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "intermediate_size": INTER, "vocab_size": VOCAB,
              "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 256,
              "attention_bias": False, "tie_word_embeddings": False, "num_target_layers": TARGET_LAYERS}
    config.update(extra)
    return config


def backbone_tensors(n_features: int, seed: int = 0) -> dict[str, Tensor]:
    """DFlash backbone weights with the release names, in bfloat16 (norm weights away from 1)."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape, scale=0.2):
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)

    def norm(n):
        return (0.5 + torch.rand(n, generator=g)).to(torch.bfloat16)

    t = {"fc.weight": w(HIDDEN, n_features * HIDDEN), "hidden_norm.weight": norm(HIDDEN), "norm.weight": norm(HIDDEN)}
    for i in range(LAYERS):
        p = f"layers.{i}."
        t |= {p + "self_attn.q_proj.weight": w(HEADS * HEAD_DIM, HIDDEN),
              p + "self_attn.k_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
              p + "self_attn.v_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
              p + "self_attn.o_proj.weight": w(HIDDEN, HEADS * HEAD_DIM),
              p + "self_attn.q_norm.weight": norm(HEAD_DIM), p + "self_attn.k_norm.weight": norm(HEAD_DIM),
              p + "mlp.gate_proj.weight": w(INTER, HIDDEN), p + "mlp.up_proj.weight": w(INTER, HIDDEN),
              p + "mlp.down_proj.weight": w(HIDDEN, INTER),
              p + "input_layernorm.weight": norm(HIDDEN), p + "post_attention_layernorm.weight": norm(HIDDEN)}
    return t


def domino_head_tensors(norm: bool, gate: bool, seed: int = 3) -> dict[str, Tensor]:
    """Bias-free Domino head: nn.GRU(H, G, bias=False) names, embed_proj Linear-SiLU-Linear without bias."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape, scale=0.5):
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)

    t = {"prefix_gru.weight_ih_l0": w(3 * GRU, HIDDEN), "prefix_gru.weight_hh_l0": w(3 * GRU, GRU),
         "embed_proj.0.weight": w(EMB, HIDDEN + GRU), "embed_proj.2.weight": w(VOCAB, EMB, scale=2.0)}
    if norm:
        t["bias_norm.weight"] = (0.5 + torch.rand(GRU, generator=g)).to(torch.bfloat16)
    if gate:
        t |= {"bias_gate.0.weight": w(EMB, HIDDEN), "bias_gate.2.weight": w(1, EMB), "bias_gate.2.bias": w(1)}
    return t


def write(path: Path, config: dict, tensors: dict[str, Tensor]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    return path


# ------------------------------------------------------------------------------ the formulas
def rms(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    x = x.double()
    return weight.double() * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def cos_sin(config: dict, positions: Tensor) -> tuple[Tensor, Tensor]:
    """RoPE tables as the references build them: transformers' Qwen3RotaryEmbedding(config)."""
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    keys = ("hidden_size", "num_attention_heads", "head_dim", "max_position_embeddings", "rope_theta",
            "rope_scaling", "rope_parameters")
    rotary = Qwen3RotaryEmbedding(Qwen3Config(**{k: config[k] for k in keys if config.get(k) is not None}))
    x = torch.zeros(1, dtype=torch.float64)
    cos, sin = rotary(x, positions[None])
    return cos[0].double(), sin[0].double()


def block_hidden(config: dict, w: dict[str, Tensor], target_hidden: Tensor, block_ids: Tensor,
                 embedding: Tensor) -> Tensor:
    """Final-normed hidden states of every block slot (float64).

    Shape: target_hidden ``[b, c, n * H]`` (context at positions 0..c-1), block_ids ``[b, T]`` at
    positions c..c+T-1 -> ``[b, T, H]``.
    """
    w = {k: v.double() for k, v in w.items()}
    b, c, _ = target_hidden.shape
    t = block_ids.shape[1]
    ctx = rms(target_hidden.double() @ w["fc.weight"].T, w["hidden_norm.weight"])
    x = embedding.double()[block_ids]
    cos, sin = cos_sin(config, torch.arange(c + t))
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = rms((h @ w[p + "self_attn.q_proj.weight"].T).view(b, t, HEADS, HEAD_DIM), w[p + "self_attn.q_norm.weight"])
        kv_in = torch.cat([ctx, h], dim=1)
        k = rms((kv_in @ w[p + "self_attn.k_proj.weight"].T).view(b, c + t, KV_HEADS, HEAD_DIM),
                w[p + "self_attn.k_norm.weight"])
        v = (kv_in @ w[p + "self_attn.v_proj.weight"].T).view(b, c + t, KV_HEADS, HEAD_DIM)
        q = rotate(q.transpose(1, 2), cos[c:], sin[c:])
        k = rotate(k.transpose(1, 2), cos, sin).repeat_interleave(HEADS // KV_HEADS, dim=1)
        v = v.transpose(1, 2).repeat_interleave(HEADS // KV_HEADS, dim=1)
        att = torch.softmax(q @ k.transpose(-1, -2) / HEAD_DIM**0.5, dim=-1) @ v        # every slot sees all
        x = x + att.transpose(1, 2).reshape(b, t, -1) @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        x = x + (F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)) \
            @ w[p + "mlp.down_proj.weight"].T
    return rms(x, w["norm.weight"])


def gru_state(w: dict[str, Tensor], embedding: Tensor, tokens: Tensor) -> Tensor:
    """Bias-free GRU over ``tokens`` [n] (PyTorch's r, z, n gate order); the state after the last."""
    wi, wh = w["prefix_gru.weight_ih_l0"].double(), w["prefix_gru.weight_hh_l0"].double()
    h = torch.zeros(wh.shape[1], dtype=torch.float64)
    for tok in tokens.tolist():
        gi, gh = (wi @ embedding.double()[tok]).chunk(3), (wh @ h).chunk(3)
        r, z = torch.sigmoid(gi[0] + gh[0]), torch.sigmoid(gi[1] + gh[1])
        n = torch.tanh(gi[2] + r * gh[2])
        h = (1 - z) * n + z * h
    return h


def domino_correction(w: dict[str, Tensor], z: Tensor, state: Tensor, norm: bool, gate: bool) -> Tensor:
    """``[sigmoid(gate(z)) *] W2 silu(W1 [z; bias_norm(state)])`` over the whole vocabulary (float64)."""
    w = {k: v.double() for k, v in w.items()}
    s = rms(state, w["bias_norm.weight"]) if norm else state
    c = w["embed_proj.2.weight"] @ F.silu(w["embed_proj.0.weight"] @ torch.cat([z.double(), s]))
    if gate:
        g = w["bias_gate.2.weight"] @ F.silu(w["bias_gate.0.weight"] @ z.double()) + w["bias_gate.2.bias"]
        c = torch.sigmoid(g) * c
    return c
