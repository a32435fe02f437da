"""Read and write drafter checkpoints in the released formats, from a local directory only.

Formats (a directory with ``config.json`` and one or more ``*.safetensors`` files):

- **DFlash** (z-lab): a Qwen3-style config (``hidden_size``, ``num_hidden_layers``,
  ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, ``intermediate_size``,
  ``vocab_size``, ``rms_norm_eps``, ``rope_parameters.rope_theta`` or ``rope_theta``,
  ``num_target_layers``) plus ``dflash_config = {block_size, mask_token_id, target_layer_ids}``
  (each also accepted at the top level).  Weights: ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``,
  ``layers.{i}.self_attn.{q,k}_norm.weight``, ``layers.{i}.mlp.{gate,up,down}_proj.weight``,
  ``layers.{i}.{input,post_attention}_layernorm.weight``, ``fc.weight``, ``hidden_norm.weight``,
  ``norm.weight``.
- **Domino**: DFlash plus ``dflash_config.projector_type`` in ``{"domino", "causal_v5"}``,
  ``gru_hidden_dim``, ``emb_dim`` (top level or in ``dflash_config``), ``pure_draft_prefix_len``;
  extra weights ``prefix_gru.{weight,bias}_{ih,hh}_l0``, ``embed_proj.{0,2}.{weight,bias}``.
  Loaded as ``drafter.heads["gru"]`` (a :class:`GRUHead`).
- **DSpark** (DeepSpec): DFlash backbone with the draft fields at the top level
  (``block_size``, ``mask_token_id``, ``target_layer_ids``, ``markov_rank``, ``markov_head_type``,
  ``enable_confidence_head``); extra weights ``markov_head.markov_w{1,2}.weight`` (vanilla head
  only), optionally ``confidence_head.proj.{weight,bias}`` (kept as ``drafter.confidence_head``,
  not used by the builders) and ``embed_tokens.weight`` / ``lm_head.weight`` (copies of the target's,
  used as the drafter's shared matrices until :meth:`DFlashDrafter.bind` is called).
  Loaded as ``drafter.heads["markov"]`` (a :class:`MarkovHead`).

Head-only directories (the bundled zoo ships its heads this way so the backbone is stored once)
have ``config.json`` with ``"head_type": "gru" | "markov"`` and the same weight names as above.

Every weight in the files must be consumed and every parameter must be found: anything else is a
``ValueError`` naming the tensors.  Nothing is ever downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from dartree.models.drafter import DFlashConfig, DFlashDrafter
from dartree.models.heads import GRUHead, MarkovHead

__all__ = [
    "load_drafter",
    "load_head",
    "save_drafter",
    "save_gru_head",
    "save_markov_head",
    "DOMINO_PROJECTORS",
]

DOMINO_PROJECTORS = ("domino", "causal_v5")
_GRU_PREFIXES = ("prefix_gru.", "embed_proj.")
_MARKOV_PREFIX = "markov_head."


# ------------------------------------------------------------------------------------- reading
def _read_dir(path: str | Path) -> tuple[Path, dict, dict[str, Tensor]]:
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"path: {str(path)!r} is not a local directory (checkpoints are never downloaded)")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"path: {str(path)!r} has no config.json")
    config = json.loads(config_file.read_text())
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"path: {str(path)!r} has no *.safetensors weights")
    weights: dict[str, Tensor] = {}
    for f in files:
        for name, tensor in load_file(str(f)).items():
            if name in weights:
                raise ValueError(f"path: tensor {name!r} appears in more than one safetensors file")
            weights[name] = tensor
    return path, config, weights


def _draft_value(config: dict, key: str, default: object = None) -> object:
    sub = config.get("dflash_config") or {}
    if key in sub:
        return sub[key]
    return config.get(key, default)


def _require(config: dict, key: str, path: Path) -> object:
    value = _draft_value(config, key)
    if value is None:
        raise ValueError(f"config: {path / 'config.json'} lacks {key!r}")
    return value


def _rope_theta(config: dict) -> float:
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(config.get("rope_theta", 10000.0))


def _dflash_config(config: dict, path: Path) -> DFlashConfig:
    num_target_layers = config.get("num_target_layers")
    target_layer_ids = _draft_value(config, "target_layer_ids")
    if target_layer_ids is None:
        raise ValueError(f"config: {path / 'config.json'} lacks 'target_layer_ids' (dflash_config or top level)")
    return DFlashConfig(
        hidden_size=int(_require(config, "hidden_size", path)),
        num_hidden_layers=int(_require(config, "num_hidden_layers", path)),
        num_attention_heads=int(_require(config, "num_attention_heads", path)),
        num_key_value_heads=int(config.get("num_key_value_heads") or config["num_attention_heads"]),
        intermediate_size=int(_require(config, "intermediate_size", path)),
        vocab_size=int(_require(config, "vocab_size", path)),
        target_layer_ids=list(target_layer_ids),
        mask_token_id=int(_require(config, "mask_token_id", path)),
        block_size=int(_draft_value(config, "block_size", 16)),
        head_dim=config.get("head_dim"),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(config),
        num_target_layers=None if num_target_layers is None else int(num_target_layers),
    )


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
        param.copy_(t.to(param.dtype))


def _gru_head_from(config: dict, weights: dict[str, Tensor], hidden_size: int, vocab_size: int, path: Path) -> GRUHead:
    gru_hidden = _draft_value(config, "gru_hidden_dim")
    emb_dim = config.get("emb_dim", _draft_value(config, "emb_dim"))
    if gru_hidden is None or emb_dim is None:
        raise ValueError(f"config: a Domino head needs 'gru_hidden_dim' and 'emb_dim' in {path / 'config.json'}")
    prefix_len = int(_draft_value(config, "pure_draft_prefix_len", 1))
    head = GRUHead(hidden_size, vocab_size, int(gru_hidden), int(emb_dim), prefix_len=prefix_len)
    with torch.no_grad():
        _load_into(head, weights, "", path)
    head.eval()
    return head


def _markov_head_from(config: dict, weights: dict[str, Tensor], vocab_size: int, path: Path,
                      prefix: str) -> MarkovHead:
    kind = _draft_value(config, "markov_head_type", "vanilla")
    if kind != "vanilla":
        raise ValueError(f"config: markov_head_type {kind!r} in {path / 'config.json'} is not supported "
                         f"(only the vanilla DSpark Markov head)")
    rank = _draft_value(config, "markov_rank")
    if rank is None or int(rank) < 1:
        raise ValueError(f"config: a Markov head needs 'markov_rank' >= 1 in {path / 'config.json'}")
    head = MarkovHead(vocab_size, int(rank))
    with torch.no_grad():
        _load_into(head, weights, prefix, path)
    head.eval()
    return head


def _split(weights: dict[str, Tensor], prefixes: tuple[str, ...]) -> dict[str, Tensor]:
    """Pop and return the tensors whose names start with one of ``prefixes``."""
    return {k: weights.pop(k) for k in [k for k in weights if k.startswith(prefixes)]}


def _check_consumed(weights: dict[str, Tensor], path: Path) -> None:
    if weights:
        names = sorted(weights)
        raise ValueError(f"weights: {path} has {len(names)} unexpected tensor(s): {names[:8]}")


def load_drafter(path: str | Path, target: nn.Module | None = None) -> DFlashDrafter:
    """Load a DFlash, Domino or DSpark drafter from a local directory (see the module docstring).

    Args:
        path: directory with ``config.json`` and ``*.safetensors``.
        target: optional HF causal LM to share embeddings / LM head with (``drafter.bind(target)``).

    Returns:
        a :class:`DFlashDrafter` in eval mode; its ``heads`` dict holds ``"gru"`` (Domino) or
        ``"markov"`` (DSpark) when the checkpoint carries one (bound to ``target`` if given).
    """
    path, config, weights = _read_dir(path)
    if "head_type" in config:
        raise ValueError(f"path: {path} holds a head-only checkpoint; use load_head")
    dconfig = _dflash_config(config, path)
    projector = _draft_value(config, "projector_type")
    is_domino = projector in DOMINO_PROJECTORS
    if projector is not None and not is_domino:
        raise ValueError(f"config: projector_type {projector!r} in {path / 'config.json'} is not supported "
                         f"(expected one of {DOMINO_PROJECTORS})")
    markov_rank = int(_draft_value(config, "markov_rank", 0) or 0)

    heads: dict[str, nn.Module] = {}
    if is_domino:
        heads["gru"] = _gru_head_from(config, _split(weights, _GRU_PREFIXES), dconfig.hidden_size,
                                      dconfig.vocab_size, path)
    if markov_rank > 0:
        heads["markov"] = _markov_head_from(config, weights, dconfig.vocab_size, path, _MARKOV_PREFIX)

    drafter = DFlashDrafter(dconfig)
    embedding = weights.pop("embed_tokens.weight", None)
    lm_head = weights.pop("lm_head.weight", None)
    confidence = _split(weights, ("confidence_head.",))
    with torch.no_grad():
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
        drafter.set_shared_weights(embedding.float(), lm_head.float())
        if "gru" in heads:
            heads["gru"].set_embedding(drafter.embedding_weight)
    drafter.heads = heads
    if target is not None:
        drafter.bind(target)
        for head in heads.values():
            head.bind(target)
    return drafter.eval()


def load_head(path: str | Path, target: nn.Module | None = None) -> GRUHead | MarkovHead:
    """Load a head-only checkpoint (``config.json`` with ``head_type`` ``"gru"`` or ``"markov"``)."""
    path, config, weights = _read_dir(path)
    kind = config.get("head_type")
    if kind == "gru":
        head = _gru_head_from(config, weights, int(config["hidden_size"]), int(config["vocab_size"]), path)
    elif kind == "markov":
        head = _markov_head_from(config, weights, int(config["vocab_size"]), path, _MARKOV_PREFIX)
    else:
        raise ValueError(f"config: head_type in {path / 'config.json'} must be 'gru' or 'markov', got {kind!r}")
    _check_consumed(weights, path)
    if target is not None:
        head.bind(target)
    return head


# ------------------------------------------------------------------------------------- writing
def _dflash_config_dict(config: DFlashConfig) -> dict:
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
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "attention_bias": False,
        "is_causal": False,
        "tie_word_embeddings": False,
        "num_target_layers": config.num_target_layers,
        "dtype": "float32",
        "dflash_config": {
            "block_size": config.block_size,
            "mask_token_id": config.mask_token_id,
            "target_layer_ids": list(config.target_layer_ids),
        },
    }


def _tensors(module: nn.Module, prefix: str = "") -> dict[str, Tensor]:
    return {prefix + k: v.detach().contiguous().clone() for k, v in module.state_dict().items()}


def _write(path: str | Path, config: dict, tensors: dict[str, Tensor]) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def save_drafter(
    drafter: DFlashDrafter,
    path: str | Path,
    gru_head: GRUHead | None = None,
    markov_head: MarkovHead | None = None,
) -> Path:
    """Write ``drafter`` as a DFlash checkpoint, or as Domino (with ``gru_head``) or DSpark (with ``markov_head``)."""
    if gru_head is not None and markov_head is not None:
        raise ValueError("markov_head: no released format carries both a Domino and a DSpark head")
    config = _dflash_config_dict(drafter.config)
    tensors = _tensors(drafter)
    if gru_head is not None:
        config["dflash_config"].update(projector_type="domino", gru_hidden_dim=gru_head.gru_hidden_dim,
                                       emb_dim=gru_head.emb_dim, pure_draft_prefix_len=gru_head.prefix_len,
                                       shift_label=False)
        config["emb_dim"] = gru_head.emb_dim
        tensors.update(_tensors(gru_head))
    if markov_head is not None:
        config["architectures"] = ["Qwen3DSparkModel"]
        draft = config.pop("dflash_config")
        config.update(draft, markov_rank=markov_head.markov_rank, markov_head_type="vanilla",
                      enable_confidence_head=False)
        tensors.update(_tensors(markov_head, _MARKOV_PREFIX))
    return _write(path, config, tensors)


def save_gru_head(head: GRUHead, path: str | Path, drafter_config: DFlashConfig | None = None) -> Path:
    """Write a head-only GRU (Domino) checkpoint."""
    config = {"head_type": "gru", "hidden_size": head.hidden_size, "vocab_size": head.vocab_size,
              "gru_hidden_dim": head.gru_hidden_dim, "emb_dim": head.emb_dim,
              "pure_draft_prefix_len": head.prefix_len}
    if drafter_config is not None:
        config["block_size"] = drafter_config.block_size
    return _write(path, config, _tensors(head))


def save_markov_head(head: MarkovHead, path: str | Path, drafter_config: DFlashConfig | None = None) -> Path:
    """Write a head-only Markov (DSpark vanilla) checkpoint."""
    config = {"head_type": "markov", "vocab_size": head.vocab_size, "markov_rank": head.markov_rank,
              "markov_head_type": "vanilla"}
    if drafter_config is not None:
        config["block_size"] = drafter_config.block_size
    return _write(path, config, _tensors(head, _MARKOV_PREFIX))
