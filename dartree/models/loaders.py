"""Read and write drafter checkpoints in the released formats, from a local directory only (nothing is downloaded).

A checkpoint is ``config.json`` plus ``*.safetensors`` in the DFlash (z-lab), Domino or DSpark (DeepSpec)
format, each read as its authors' code reads it; one rule decides the format, and anything ambiguous or
unsupported is a ``ValueError`` naming the file and the key.  :func:`load_drafter`, :func:`load_head`,
:func:`load_target` and the writers; formats, keys, refusals and sources: docs/checkpoints.md.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import NoReturn

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor, nn

from dartree.models.drafter import (
    MAX_BLOCK_SIZE,
    DFlashConfig,
    DFlashDrafter,
    RotaryEmbedding,
    dflash_target_layer_ids,
)
from dartree.models.heads import GRUHead, MarkovHead
from dartree.models.writers import save_drafter, save_gru_head, save_markov_head

__all__ = ["load_drafter", "load_target", "load_head", "save_drafter", "save_gru_head", "save_markov_head",
           "DOMINO_PROJECTORS"]

DOMINO_PROJECTORS = ("domino", "causal_v5")
_GRU_PREFIXES = ("prefix_gru.", "embed_proj.", "bias_norm.", "bias_gate.")
_MARKOV_PREFIX = "markov_head."
_MISSING = object()
_FLOAT_ONLY = "expected a floating dtype (float32, bfloat16, float16): integer (quantised) weights are not supported"


# ------------------------------------------------------------------------------ the config file
class CheckpointConfig:
    """A ``config.json`` whose every read names the file and the key when the value is bad."""

    def __init__(self, raw: dict, file: Path) -> None:
        self.raw, self.file = raw, file
        draft = {} if raw.get("dflash_config") is None else raw["dflash_config"]
        if not isinstance(draft, dict):
            self.fail("dflash_config", f"expected a JSON object, got {type(draft).__name__}")
        self.draft = draft

    def fail(self, key: str, why: str) -> NoReturn:
        raise ValueError(f"config: {self.file} key {key!r}: {why}")

    def value(self, key: str, default: object = _MISSING, where: str = "any") -> object:
        """The value of ``key`` in ``dflash_config`` and/or at the top level (``where``: ``"any"``,
        ``"dflash"`` or ``"top"``); both present and different is an ambiguous config."""
        top = self.raw.get(key) if where != "dflash" else None
        sub = self.draft.get(key) if where != "top" else None
        if sub is not None and top is not None and sub != top:
            self.fail(key, f"dflash_config has {sub!r} but the top level has {top!r}; the reference "
                           f"loaders disagree on which one wins, so the config is ambiguous")
        got = sub if sub is not None else top
        if got is None:
            if default is _MISSING:
                raise ValueError(f"config: {self.file} lacks {key!r}")
            return default
        return got

    def int(self, key: str, default: object = _MISSING, minimum: int | None = None, where: str = "any",
            maximum: int | None = None) -> int:
        v = self.value(key, default, where)
        if v is default:
            return v
        if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, float) and v.is_integer())):
            self.fail(key, f"expected an integer, got {v!r}")
        if minimum is not None and v < minimum:
            self.fail(key, f"expected an integer >= {minimum}, got {v!r}")
        if maximum is not None and v > maximum:
            self.fail(key, f"expected an integer <= {maximum}, got {v!r}")
        return int(v)

    def float(self, key: str, default: object = _MISSING, where: str = "any", below: float | None = None) -> float:
        """A number; with ``below``, one in ``(0, below)``."""
        v = self.value(key, default, where)
        if v is default:
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            self.fail(key, f"expected a number, got {v!r}")
        if below is not None and not 0 < v < below:
            self.fail(key, f"expected a number in (0, {below:g}), got {v!r}")
        return float(v)

    def bool(self, key: str, default: object = _MISSING, where: str = "any") -> bool:
        v = self.value(key, default, where)
        if v is default:
            return v
        if not isinstance(v, bool):
            self.fail(key, f"expected true or false, got {v!r}")
        return v

    def int_list(self, key: str, where: str = "any") -> list[int]:
        v = self.value(key, where=where)
        if not isinstance(v, list) or not v or any(isinstance(i, bool) or not isinstance(i, int) for i in v):
            self.fail(key, f"expected a non-empty list of integers, got {v!r}")
        return list(v)


def _read_config(path: Path) -> CheckpointConfig:
    file = path / "config.json"
    if not file.is_file():
        raise ValueError(f"path: {str(path)!r} has no config.json")
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"config: cannot read {file}: {e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"config: {file} is not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"config: {file} must hold a JSON object, got a JSON {type(raw).__name__}")
    return CheckpointConfig(raw, file)


def _read_weights(path: Path) -> dict[str, Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"path: {str(path)!r} has no *.safetensors weights")
    weights: dict[str, Tensor] = {}
    for f in files:
        try:
            tensors = load_file(str(f))
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise ValueError(f"weights: {f} is not a readable safetensors file: {e}") from None
        for name, tensor in tensors.items():
            if name in weights:
                raise ValueError(f"weights: tensor {name!r} appears in more than one safetensors file of {path}")
            weights[name] = tensor
    return weights


def _read_dir(path: str | Path) -> tuple[Path, CheckpointConfig, dict[str, Tensor]]:
    if isinstance(path, bytes) or not isinstance(path, str | os.PathLike):
        raise ValueError(f"path: expected a local checkpoint directory (str or os.PathLike), got "
                         f"{type(path).__name__} {path!r}")
    path = Path(path)
    try:
        if not path.is_dir():
            raise ValueError(f"path: {str(path)!r} is not a local directory (checkpoints are never downloaded)")
        if not os.access(path, os.R_OK | os.X_OK):
            raise PermissionError(f"permission denied: {str(path)!r}")
        return path, _read_config(path), _read_weights(path)
    except OSError as e:         # PermissionError and friends on the folder, its listing or a file
        raise ValueError(f"path: cannot read the checkpoint directory {str(path)!r}: {e}") from None


# ---------------------------------------------------------------------------- format and layout
_DEEPSPEC_KEYS = ("num_anchors", "markov_rank")


def _format(config: CheckpointConfig) -> str:
    """``"dspark"``, ``"domino"`` or ``"dflash"``, by the one rule of docs/checkpoints.md, "Supported formats"."""
    archs = config.raw.get("architectures") or []
    if not isinstance(archs, list):
        config.fail("architectures", f"expected a list of names, got {archs!r}")
    if any("DFlash2" in str(a) for a in archs) or "conv_kernel_size" in config.draft:
        config.fail("architectures", "DFlash2 drafters (convolutions, candidate selector) are not supported")
    deepspec_keys = [k for k in _DEEPSPEC_KEYS if k in config.raw]
    dspark = any("DSpark" in str(a) for a in archs)
    if not dspark and deepspec_keys:
        if not any("DFlash" in str(a) for a in archs):
            config.fail(deepspec_keys[0], f"DeepSpec keys {deepspec_keys} but architectures {archs!r} names neither "
                                          f"a DSpark model (every slot a proposal) nor a DFlash one (slot 0 dropped); "
                                          f"set architectures to ['Qwen3DSparkModel'] or ['DFlashDraftModel']")
        warnings.warn(f"config: {config.file}: architectures {archs!r} is a DFlash model, so the DeepSpec keys "
                      f"{deepspec_keys} are ignored (as z-lab's loader ignores them) and the z-lab layout is read "
                      f"(slot 0 dropped); set architectures to ['Qwen3DSparkModel'] for a DeepSpec checkpoint",
                      stacklevel=3)
    projector = config.value("projector_type", None, where="dflash")
    if dspark and projector is not None:
        config.fail("projector_type", "a DeepSpec (DSpark) config with a Domino projector is ambiguous")
    if projector is not None and projector not in DOMINO_PROJECTORS:
        config.fail("projector_type", f"expected one of {DOMINO_PROJECTORS}, got {projector!r}")
    return "dspark" if dspark else "domino" if projector is not None else "dflash"


def _shift_label(config: CheckpointConfig, kind: str) -> bool:
    """The block layout: True = every slot is a proposal (depth d = slot d - 1)."""
    shift = config.bool("shift_label", None)             # either place (both different: refused)
    if kind == "dspark":
        if shift is False:
            config.fail("shift_label", "DeepSpec reads every slot of a DSpark block as a proposal; "
                                       "shift_label false contradicts the format")
        return True
    if kind == "dflash" and shift:
        config.fail("shift_label", "z-lab's DFlash loader ignores shift_label and drops slot 0; a drafter "
                                   "trained with shifted labels is a Domino (projector_type) or DSpark checkpoint")
    if shift and config.draft.get("shift_label") is None:
        config.fail("shift_label", "Domino reads shift_label from dflash_config (a top-level true is ignored there "
                                   "and slot 0 dropped); move it into dflash_config")
    return bool(shift)


def _check_supported(config: CheckpointConfig) -> None:
    raw = config.raw
    layer_types = raw.get("layer_types")
    if layer_types is not None and (not isinstance(layer_types, list)
                                    or any(t != "full_attention" for t in layer_types)):
        config.fail("layer_types", f"only full attention is supported, got {layer_types!r} "
                                   f"(sliding-window draft layers are not implemented)")
    if raw.get("use_sliding_window"):
        config.fail("use_sliding_window", "sliding-window draft layers are not supported")
    if config.value("is_causal", False, where="any"):
        config.fail("is_causal", "causal draft attention is not supported (the block attends non-causally)")
    if raw.get("attention_bias"):
        config.fail("attention_bias", "attention biases are not supported (Qwen3 drafters have none)")
    if raw.get("hidden_act", "silu") != "silu":
        config.fail("hidden_act", f"only 'silu' is supported, got {raw['hidden_act']!r}")
    for key, neutral in (("input_embedding_scale", 1.0), ("output_multiplier", 1.0)):
        if config.float(key, neutral) != neutral:
            config.fail(key, f"only {neutral} is supported")
    if config.float("final_logit_softcapping", 0.0) > 0:
        config.fail("final_logit_softcapping", "logit soft-capping is not supported")
    if "target_hidden_size" in config.draft and config.draft["target_hidden_size"] != raw.get("hidden_size"):
        config.fail("target_hidden_size", "a target hidden size different from the drafter's is not supported")


_POSITION_DEPENDENT_ROPE = ("dynamic", "longrope")
"""Rope types whose frequencies depend on the longest position of a forward (see docs/checkpoints.md)."""


def _rope(config: CheckpointConfig) -> tuple[float, dict | None, int]:
    """rope_theta, the scaled rope dict (None for the default RoPE), max_position_embeddings:
    standardised by transformers' own ``Qwen3Config`` (``rope_scaling`` or ``rope_parameters``)."""
    from transformers import Qwen3Config

    keys = ("rope_parameters", "rope_scaling", "rope_theta", "max_position_embeddings",
            "original_max_position_embeddings", "partial_rotary_factor")
    kwargs = {k: config.raw[k] for k in keys if config.raw.get(k) is not None}
    for key in ("rope_parameters", "rope_scaling"):
        if key in kwargs and not isinstance(kwargs[key], dict):
            config.fail(key, f"expected a JSON object, got {kwargs[key]!r}")
    try:
        hf = Qwen3Config(**{k: (dict(v) if isinstance(v, dict) else v) for k, v in kwargs.items()})
        params = dict(hf.rope_parameters)
    except (TypeError, ValueError, KeyError) as e:
        config.fail("rope_scaling", f"transformers rejects the rope settings: {e}")
    theta = params.get("rope_theta", 10000.0)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        config.fail("rope_theta", f"expected a number, got {theta!r}")
    scaled = None if params.get("rope_type", "default") == "default" else params
    if params.get("rope_type") in _POSITION_DEPENDENT_ROPE:
        limit = params.get("original_max_position_embeddings", hf.max_position_embeddings)
        warnings.warn(f"config: {config.file} rope_type {params['rope_type']!r}: draft logits equal the reference "
                      f"drafter's up to position {limit}; past it they can differ slightly (the reference rotates "
                      "context keys in a later call; see docs/checkpoints.md). Decoding stays lossless.",
                      stacklevel=3)
    return float(theta), scaled, int(hf.max_position_embeddings)


def _dflash_config(config: CheckpointConfig, kind: str) -> DFlashConfig:
    _check_supported(config)
    layers = config.int("num_hidden_layers", minimum=1, where="top")
    num_target_layers = config.int("num_target_layers", None, minimum=1, where="top")
    if config.value("target_layer_ids", None) is not None:
        target_layer_ids = config.int_list("target_layer_ids")
    elif kind == "dspark":
        raise ValueError(f"config: {config.file} lacks 'target_layer_ids' (DeepSpec requires it)")
    elif num_target_layers is None:
        raise ValueError(f"config: {config.file} lacks 'target_layer_ids', and 'num_target_layers' for the "
                         f"reference's evenly spaced fallback")
    else:
        target_layer_ids = dflash_target_layer_ids(num_target_layers, layers)
    # -1 is the embedding output in every format: DFlash and Domino read hidden_states[layer + 1] (-1 -> the
    # embeddings, hidden_states[0]), DeepSpec names it so; HFTarget serves it the same way.
    theta, scaled, max_positions = _rope(config)
    heads = config.int("num_attention_heads", minimum=1, where="top")
    head_dim = config.int("head_dim", None, minimum=2, where="top")
    fields = dict(
        hidden_size=config.int("hidden_size", minimum=1, where="top"),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=config.int("num_key_value_heads", heads, minimum=1, where="top"),
        intermediate_size=config.int("intermediate_size", minimum=1, where="top"),
        vocab_size=config.int("vocab_size", minimum=1, where="top"),
        target_layer_ids=target_layer_ids,
        mask_token_id=config.int("mask_token_id", minimum=0),
        block_size=config.int("block_size", 16, minimum=2, maximum=MAX_BLOCK_SIZE),
        head_dim=head_dim,
        rms_norm_eps=config.float("rms_norm_eps", 1e-6, where="top", below=1.0),
        rope_theta=theta,
        num_target_layers=num_target_layers,
        shift_label=_shift_label(config, kind),
        rope_parameters=scaled,
        max_position_embeddings=max_positions,
    )
    try:
        dconfig = DFlashConfig(**fields)
        RotaryEmbedding(dconfig)      # transformers' rope init: fails here, not at the first draft
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"config: {config.file}: {e}") from None
    return dconfig


# ----------------------------------------------------------------------------------- weights
@torch.no_grad()
def _load_into(module: nn.Module, weights: dict[str, Tensor], prefix: str, path: Path) -> None:
    """Copy ``prefix + name`` tensors into ``module``'s state; pop them from ``weights``."""
    state = module.state_dict()
    missing = [prefix + k for k in state if prefix + k not in weights]
    if missing:
        raise ValueError(f"weights: {path} is missing {len(missing)} tensor(s): {missing[:8]}")
    for k, param in state.items():
        t = weights.pop(prefix + k)
        if tuple(t.shape) != tuple(param.shape):
            raise ValueError(f"weights: {prefix + k} in {path} has shape {tuple(t.shape)}, "
                             f"the config implies {tuple(param.shape)}")
        _check_float(prefix + k, t, path)
        param.copy_(t.to(param.dtype))


def _check_float(name: str, tensor: Tensor, path: Path) -> None:
    """Weights are floating point and finite: integer weights (quantised, or a broken export) are not cast
    silently, and a NaN or infinite weight would decode garbage or fail far from its cause."""
    if not tensor.is_floating_point():
        raise ValueError(f"weights: {name} in {path} is {tensor.dtype}; {_FLOAT_ONLY}")
    _check_finite(name, tensor, path)


def _check_finite(name: str, tensor: Tensor, path: Path) -> None:
    if not bool(torch.isfinite(tensor).all()):
        bad = int((~torch.isfinite(tensor)).sum())
        raise ValueError(f"weights: {name} in {path} holds {bad} NaN or infinite value(s) of {tensor.numel()}; "
                         "expected finite weights (a diverged or broken checkpoint)")


def _gru_head_from(config: CheckpointConfig, weights: dict[str, Tensor], hidden_size: int, vocab_size: int,
                   path: Path) -> GRUHead:
    emb_dim = config.int("emb_dim", minimum=1)
    gru_hidden = config.int("gru_hidden_dim", config.raw.get("emb_dim", hidden_size // 4), minimum=1)
    head = GRUHead(hidden_size, vocab_size, gru_hidden, emb_dim,
                   prefix_len=config.int("pure_draft_prefix_len", 0, minimum=0),
                   bias="prefix_gru.bias_ih_l0" in weights,        # released Domino heads are bias-free
                   bias_norm=config.bool("use_bias_norm", False),
                   bias_gate=config.bool("use_bias_gate", False),
                   norm_eps=config.float("rms_norm_eps", 1e-6, where="top", below=1.0))
    _load_into(head, weights, "", path)
    return head.requires_grad_(False).eval()       # inference: no autograd graph in the builders


def _markov_head_from(config: CheckpointConfig, weights: dict[str, Tensor], vocab_size: int, path: Path) -> MarkovHead:
    kind = config.value("markov_head_type", "vanilla")
    if kind != "vanilla":
        config.fail("markov_head_type", f"{kind!r} is not supported (only the vanilla DSpark Markov head)")
    head = MarkovHead(vocab_size, config.int("markov_rank", minimum=1))
    _load_into(head, weights, _MARKOV_PREFIX, path)
    return head.requires_grad_(False).eval()


def _split(weights: dict[str, Tensor], prefixes: tuple[str, ...]) -> dict[str, Tensor]:
    """Pop and return the tensors whose names start with one of ``prefixes``."""
    return {k: weights.pop(k) for k in [k for k in weights if k.startswith(prefixes)]}


def _check_consumed(weights: dict[str, Tensor], path: Path) -> None:
    if weights:
        names = sorted(weights)
        raise ValueError(f"weights: {path} has {len(names)} unexpected tensor(s): {names[:8]}")


def load_drafter(path: str | Path, target: nn.Module | None = None) -> DFlashDrafter:
    """Load a DFlash, Domino or DSpark drafter from a local directory (``config.json`` and ``*.safetensors``).

    ``target``: optional HF causal LM to share the embeddings / LM head with (``drafter.bind``).  Returns a
    float32 :class:`DFlashDrafter` in eval mode with frozen parameters, whose ``config.shift_label`` states the
    block layout and whose ``heads`` hold the checkpoint's ``"gru"`` (Domino) or ``"markov"`` (DSpark) head.
    """
    path, config, weights = _read_dir(path)
    if "head_type" in config.raw:
        raise ValueError(f"path: {path} holds a head-only checkpoint; use load_head")
    kind = _format(config)
    dconfig = _dflash_config(config, kind)
    heads: dict[str, nn.Module] = {}
    if kind == "domino":
        heads["gru"] = _gru_head_from(config, _split(weights, _GRU_PREFIXES), dconfig.hidden_size,
                                      dconfig.vocab_size, path)
    if kind == "dspark" and config.int("markov_rank", 0, minimum=0, where="top") > 0:
        heads["markov"] = _markov_head_from(config, weights, dconfig.vocab_size, path)

    drafter = DFlashDrafter(dconfig)
    embedding = weights.pop("embed_tokens.weight", None)
    lm_head = weights.pop("lm_head.weight", None)
    confidence = _split(weights, ("confidence_head.",))
    _load_into(drafter, weights, "", path)
    if confidence:
        w = confidence.get("confidence_head.proj.weight")
        if w is None or w.dim() != 2:
            raise ValueError(f"weights: {path} has confidence_head tensors but no 2-D confidence_head.proj.weight")
        drafter.confidence_head = nn.Linear(w.shape[1], w.shape[0], bias="confidence_head.proj.bias" in confidence)
        _load_into(drafter.confidence_head, confidence, "confidence_head.proj.", path)
        _check_consumed(confidence, path)
    _check_consumed(weights, path)
    if (embedding is None) != (lm_head is None):
        raise ValueError(f"weights: {path} has only one of embed_tokens.weight / lm_head.weight")
    if embedding is not None:
        _check_float("embed_tokens.weight", embedding, path)
        _check_float("lm_head.weight", lm_head, path)
        drafter.set_shared_weights(embedding.float(), lm_head.float())
        if "gru" in heads:
            heads["gru"].set_embedding(drafter.embedding_weight)
    drafter.heads = heads
    if target is not None:
        drafter.bind(target)
        for head in heads.values():
            head.bind(target)
    return drafter.requires_grad_(False).eval()


def load_head(path: str | Path, target: nn.Module | None = None) -> GRUHead | MarkovHead:
    """Load a head-only checkpoint (``config.json`` with ``head_type`` ``"gru"`` or ``"markov"``),
    in eval mode with frozen parameters (heads and drafters are loaded for inference)."""
    path, config, weights = _read_dir(path)
    kind = config.raw.get("head_type")
    if kind == "gru":
        head = _gru_head_from(config, weights, config.int("hidden_size", minimum=1),
                              config.int("vocab_size", minimum=1), path)
    elif kind == "markov":
        head = _markov_head_from(config, weights, config.int("vocab_size", minimum=1), path)
    else:
        config.fail("head_type", f"expected 'gru' or 'markov', got {kind!r}")
    _check_consumed(weights, path)
    if target is not None:
        head.bind(target)
    return head


def _check_stored_dtypes(path: Path) -> None:
    """The target's stored tensors are floating point, read from the safetensors headers: transformers casts
    whatever it loads to float32, so an integer (quantised or broken) export would decode garbage with exit 0
    (``pytorch_model.bin`` is not read here: its dtypes need the whole file)."""
    from safetensors import safe_open

    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                dtype = f.get_slice(name).get_dtype()
                if not dtype.startswith(("F", "BF")):
                    raise ValueError(f"weights: {name} in {file} is {dtype}; {_FLOAT_ONLY}")


def load_target(path: str | Path, attn_implementation: str = "sdpa") -> nn.Module:
    """A HF causal-LM target from a local directory (``local_files_only``), float32, eval mode, frozen.

    transformers initialises a missing tensor at random and drops an unexpected one, which would decode with a
    random layer and exit 0; here every missing, unexpected or mismatched tensor is a ``ValueError`` naming the
    directory and the tensors.
    """
    from transformers import AutoModelForCausalLM

    if isinstance(path, bytes) or not isinstance(path, str | os.PathLike):
        raise ValueError(f"target: expected a local checkpoint directory (str or os.PathLike), got "
                         f"{type(path).__name__} {path!r}")
    path = Path(path)
    try:
        if not (path / "config.json").is_file():
            raise ValueError(f"target: {path} is not a checkpoint directory (no config.json)")
        _check_stored_dtypes(path)
        model, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True,
                                                           attn_implementation=attn_implementation,
                                                           output_loading_info=True)
    except Exception as e:
        # unreadable or truncated files, a config.json whose values have the wrong types, a weight whose shape
        # disagrees with the config (RuntimeError), the errors of safetensors, huggingface_hub and transformers
        ours = isinstance(e, ValueError) and str(e).startswith(("target: ", "weights: "))
        if ours or not isinstance(e, ValueError | OSError | TypeError | KeyError | RuntimeError) and \
                type(e).__module__.split(".")[0] not in ("safetensors", "huggingface_hub", "transformers"):
            raise
        first = (str(e).strip().splitlines() or [""])[0]
        raise ValueError(f"target: {path} could not be loaded as a causal LM: {type(e).__name__}: {first}") from e
    problems = [f"{len(info[key])} {what} tensor(s): {sorted(map(str, info[key]))[:8]}"
                for key, what in (("missing_keys", "missing"), ("unexpected_keys", "unexpected"),
                                  ("mismatched_keys", "mismatched"))
                if info.get(key)]
    if info.get("error_msgs"):
        problems.append(f"load errors: {list(info['error_msgs'])[:4]}")
    if problems:
        raise ValueError(f"target: {path} does not match its config.json: " + "; ".join(problems)
                         + " (transformers would initialise missing tensors at random)")
    for name, param in model.named_parameters():     # NaN weights decode one token over and over, and exit 0
        _check_finite(name, param.detach(), path)
    return model.eval().requires_grad_(False)
