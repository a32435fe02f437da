"""Write drafter checkpoints that the reference loaders read back (and :func:`load_drafter` too).

:func:`save_drafter` writes the z-lab DFlash, the Domino (bias-free ``gru_head``) or the DeepSpec DSpark
layout (a ``markov_head``, or any ``shift_label`` drafter), with the config keys each reference reads where
it reads them; :func:`save_gru_head` / :func:`save_markov_head` write this project's head-only directories.
A format no reference can read is refused instead of written.  Keys and sources: docs/checkpoints.md.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file
from torch import Tensor, nn

from dartree.models.drafter import DFlashConfig, DFlashDrafter
from dartree.models.heads import GRUHead, MarkovHead

__all__ = ["save_drafter", "save_gru_head", "save_markov_head", "DSPARK_NUM_ANCHORS"]

DSPARK_NUM_ANCHORS = 512          # DeepSpec's training-time anchors per sample; unused at inference


def _backbone_config(config: DFlashConfig) -> dict:
    if config.num_target_layers is None:
        raise ValueError("drafter: config.num_target_layers is None; the reference loaders read it "
                         "(set DFlashConfig.num_target_layers to the target's decoder layer count)")
    rope = dict(config.rope_parameters) if config.rope_parameters else {"rope_type": "default",
                                                                        "rope_theta": config.rope_theta}
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.intermediate_size,
        "vocab_size": config.vocab_size,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        "rope_theta": config.rope_theta,
        "rope_scaling": dict(rope) if config.rope_parameters else None,
        "rope_parameters": rope,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "is_causal": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "layer_types": ["full_attention"] * config.num_hidden_layers,
        "tie_word_embeddings": False,
        "num_target_layers": config.num_target_layers,
        "block_size": config.block_size,
        "dtype": "float32",
        "torch_dtype": "float32",
    }


def _tensors(module: nn.Module, prefix: str = "") -> dict[str, Tensor]:
    return {prefix + k: v.detach().contiguous().clone() for k, v in module.state_dict().items()}


def _write(path: str | Path, config: dict, tensors: dict[str, Tensor],
           drafter_config: DFlashConfig | None = None) -> Path:
    if drafter_config is not None:          # a head-only checkpoint: the block size of the drafter it corrects
        config["block_size"] = drafter_config.block_size
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def _gru_flags(head: GRUHead) -> dict:
    return {"gru_hidden_dim": head.gru_hidden_dim, "emb_dim": head.emb_dim, "pure_draft_prefix_len": head.prefix_len,
            "use_bias_norm": head.bias_norm is not None, "use_bias_gate": head.bias_gate is not None}


def save_drafter(
    drafter: DFlashDrafter,
    path: str | Path,
    gru_head: GRUHead | None = None,
    markov_head: MarkovHead | None = None,
) -> Path:
    """Write ``drafter`` as DFlash, as Domino (with ``gru_head``) or as DSpark (with ``markov_head``,
    or without one when ``drafter.config.shift_label`` is true: DeepSpec's markov_rank-0 "DFlash")."""
    if gru_head is not None and markov_head is not None:
        raise ValueError("markov_head: no released format carries both a Domino and a DSpark head")
    c = drafter.config
    config = _backbone_config(c)
    tensors = {k: v for k, v in _tensors(drafter).items() if not k.startswith("confidence_head.")}
    draft = {"block_size": c.block_size, "mask_token_id": c.mask_token_id, "target_layer_ids": list(c.target_layer_ids)}
    if gru_head is not None:
        if gru_head.bias:
            raise ValueError("gru_head: the released Domino head is bias-free and its loader ignores bias "
                             "tensors; save a biased head with save_gru_head")
        draft.update(projector_type="domino", shift_label=c.shift_label, **_gru_flags(gru_head))
        config.update(emb_dim=gru_head.emb_dim, dflash_config=draft)
        tensors.update(_tensors(gru_head))
        return _write(path, config, tensors)
    if markov_head is None and not c.shift_label:
        config["dflash_config"] = {**draft, "shift_label": False}
        return _write(path, config, tensors)
    # DeepSpec DSpark: every slot of [root, mask, ...] is a proposal
    if not c.shift_label:
        raise ValueError("markov_head: DeepSpec reads every slot of a DSpark block as a proposal, but this drafter "
                         "drops slot 0 (config.shift_label is false); save the head with save_markov_head")
    confidence = getattr(drafter, "confidence_head", None)
    rank = 0 if markov_head is None else markov_head.markov_rank
    config.update(draft, architectures=["Qwen3DSparkModel"], num_anchors=DSPARK_NUM_ANCHORS, markov_rank=rank,
                  enable_confidence_head=confidence is not None)
    if rank:
        config["markov_head_type"] = "vanilla"
        tensors.update(_tensors(markov_head, "markov_head."))
    if confidence is not None:
        config["confidence_head_with_markov"] = confidence.in_features == c.hidden_size + rank and rank > 0
        tensors.update(_tensors(confidence, "confidence_head.proj."))
    tensors["embed_tokens.weight"] = drafter.embedding_weight.detach().float().contiguous().clone()
    tensors["lm_head.weight"] = drafter.lm_head_weight.detach().float().contiguous().clone()
    return _write(path, config, tensors)


def save_gru_head(head: GRUHead, path: str | Path, drafter_config: DFlashConfig | None = None) -> Path:
    """Write a head-only GRU (Domino) checkpoint (biased or bias-free; the tensors say which)."""
    config = {"head_type": "gru", "hidden_size": head.hidden_size, "vocab_size": head.vocab_size, **_gru_flags(head)}
    if head.bias_norm is not None:
        config["rms_norm_eps"] = head.bias_norm.eps
    return _write(path, config, _tensors(head), drafter_config)


def save_markov_head(head: MarkovHead, path: str | Path, drafter_config: DFlashConfig | None = None) -> Path:
    """Write a head-only Markov (DSpark vanilla) checkpoint."""
    config = {"head_type": "markov", "vocab_size": head.vocab_size, "markov_rank": head.markov_rank,
              "markov_head_type": "vanilla"}
    return _write(path, config, _tensors(head, "markov_head."), drafter_config)
