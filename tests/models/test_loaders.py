"""Checkpoint loaders: DFlash / Domino / DSpark directories, round trips and clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from torch.testing import assert_close

from dartree.models import load_drafter, load_head, save_drafter, save_gru_head, save_markov_head
from dartree.models.heads import GRUHead, MarkovHead


def _draft(drafter, ids, hidden):
    drafter.reset()
    drafter.append_context(hidden[:, :-1])
    return drafter.draft(ids[:, -1])


def _same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def test_dflash_round_trip(tmp_path, tiny_target, tiny_drafter, tiny_hidden):
    save_drafter(tiny_drafter, tmp_path / "d")
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["dflash_config"]["target_layer_ids"] == [1, 2] and config["dflash_config"]["block_size"] == 5
    loaded = load_drafter(tmp_path / "d", target=tiny_target)
    _same_state(tiny_drafter, loaded)
    assert loaded.heads == {} and not loaded.training
    ids = torch.randint(0, 100, (2, 8))
    hidden = tiny_hidden(tiny_target, ids, loaded.target_layer_ids)
    assert torch.equal(_draft(loaded, ids, hidden).logits, _draft(tiny_drafter, ids, hidden).logits)


def test_domino_round_trip(tmp_path, tiny_target, tiny_drafter, tiny_heads):
    gru, _ = tiny_heads
    save_drafter(tiny_drafter, tmp_path / "d", gru_head=gru)
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["dflash_config"]["projector_type"] == "domino"
    loaded = load_drafter(tmp_path / "d", target=tiny_target)
    _same_state(tiny_drafter, loaded)
    assert set(loaded.heads) == {"gru"}
    _same_state(gru, loaded.heads["gru"])
    assert loaded.heads["gru"].embedding_weight is tiny_target.get_input_embeddings().weight


def test_dspark_released_layout(tmp_path, tiny_target, tiny_drafter, tiny_heads):
    """A DSpark directory written by hand with the released names, embed/lm_head copies and a confidence head."""
    _, markov = tiny_heads
    path = tmp_path / "dspark"
    path.mkdir()
    config = {"architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "hidden_size": 32,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
              "intermediate_size": 40, "vocab_size": 111, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "num_target_layers": 5, "block_size": 5, "mask_token_id": 110, "target_layer_ids": [1, 2],
              "markov_rank": 6, "markov_head_type": "vanilla", "enable_confidence_head": True}
    (path / "config.json").write_text(json.dumps(config))
    tensors = {k: v.clone() for k, v in tiny_drafter.state_dict().items()}
    tensors["markov_head.markov_w1.weight"] = markov.markov_w1.weight.detach().clone()
    tensors["markov_head.markov_w2.weight"] = markov.markov_w2.weight.detach().clone()
    tensors["confidence_head.proj.weight"] = torch.randn(1, 38)
    tensors["confidence_head.proj.bias"] = torch.randn(1)
    tensors["embed_tokens.weight"] = tiny_target.get_input_embeddings().weight.detach().clone()
    tensors["lm_head.weight"] = tiny_target.lm_head.weight.detach().clone()
    half = sorted(tensors)[: len(tensors) // 2]  # sharded across two files
    save_file({k: tensors[k] for k in half}, str(path / "model-00001-of-00002.safetensors"))
    save_file({k: v for k, v in tensors.items() if k not in half}, str(path / "model-00002-of-00002.safetensors"))

    loaded = load_drafter(path)  # no target: uses the checkpoint's embed_tokens / lm_head
    _same_state(markov, loaded.heads["markov"])
    assert loaded.confidence_head.weight.shape == (1, 38)
    ids = torch.randint(0, 100, (1, 6))
    hidden = torch.randn(1, 6, 64)
    assert_close(_draft(loaded, ids, hidden).logits, _draft(tiny_drafter, ids, hidden).logits)


def test_dspark_round_trip(tmp_path, tiny_target, tiny_drafter, tiny_heads):
    _, markov = tiny_heads
    save_drafter(tiny_drafter, tmp_path / "d", markov_head=markov)
    loaded = load_drafter(tmp_path / "d", target=tiny_target)
    _same_state(tiny_drafter, loaded)
    _same_state(markov, loaded.heads["markov"])


def test_head_only_round_trips(tmp_path, tiny_target, tiny_drafter, tiny_heads):
    gru, markov = tiny_heads
    save_gru_head(gru, tmp_path / "g", tiny_drafter.config)
    save_markov_head(markov, tmp_path / "m")
    g, m = load_head(tmp_path / "g", target=tiny_target), load_head(tmp_path / "m")
    assert isinstance(g, GRUHead) and isinstance(m, MarkovHead)
    _same_state(gru, g)
    _same_state(markov, m)
    with pytest.raises(ValueError, match="load_head"):
        load_drafter(tmp_path / "g")


def _rewrite(path, drop: str | None = None, add: dict | None = None, reshape: str | None = None) -> None:
    from safetensors.torch import load_file

    f = path / "model.safetensors"
    tensors = load_file(str(f))
    if drop:
        del tensors[drop]
    if reshape:
        tensors[reshape] = torch.zeros(3, 3)
    tensors.update(add or {})
    save_file(tensors, str(f))


def test_missing_unexpected_and_misshapen_weights_are_named(tmp_path, tiny_drafter, tiny_heads):
    gru, _ = tiny_heads
    save_drafter(tiny_drafter, tmp_path / "a")
    _rewrite(tmp_path / "a", drop="layers.1.self_attn.k_norm.weight")
    with pytest.raises(ValueError, match=r"missing .*layers\.1\.self_attn\.k_norm\.weight"):
        load_drafter(tmp_path / "a")
    save_drafter(tiny_drafter, tmp_path / "b")
    _rewrite(tmp_path / "b", add={"layers.0.mystery.weight": torch.zeros(2)})
    with pytest.raises(ValueError, match=r"unexpected .*layers\.0\.mystery\.weight"):
        load_drafter(tmp_path / "b")
    save_drafter(tiny_drafter, tmp_path / "c", gru_head=gru)
    _rewrite(tmp_path / "c", drop="embed_proj.2.bias")
    with pytest.raises(ValueError, match=r"missing .*embed_proj\.2\.bias"):
        load_drafter(tmp_path / "c")
    save_drafter(tiny_drafter, tmp_path / "d")
    _rewrite(tmp_path / "d", reshape="fc.weight")
    with pytest.raises(ValueError, match=r"fc\.weight .*shape"):
        load_drafter(tmp_path / "d")


def test_bad_directories(tmp_path, tiny_drafter):
    with pytest.raises(ValueError, match="not a local directory"):
        load_drafter(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="config.json"):
        load_drafter(tmp_path / "empty")
    save_drafter(tiny_drafter, tmp_path / "x")
    config = json.loads((tmp_path / "x" / "config.json").read_text())
    del config["dflash_config"]["target_layer_ids"]
    (tmp_path / "x" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="target_layer_ids"):
        load_drafter(tmp_path / "x")
    config["dflash_config"].update(target_layer_ids=[1, 2], projector_type="mystery")
    (tmp_path / "x" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="projector_type"):
        load_drafter(tmp_path / "x")
