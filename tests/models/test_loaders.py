"""Checkpoint loaders: DFlash / Domino / DSpark directories, round trips and clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from dartree.block import DraftBlock
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


def _bias_free_head(embedding, seed=4) -> GRUHead:
    torch.manual_seed(seed)
    head = GRUHead(32, 111, 12, 16, prefix_len=0, bias=False, bias_norm=True, bias_gate=True, embedding=embedding)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0.0, 0.5)
    return head.eval()


def test_domino_round_trip(tmp_path, tiny_target, tiny_drafter):
    gru = _bias_free_head(tiny_target.get_input_embeddings().weight)
    save_drafter(tiny_drafter, tmp_path / "d", gru_head=gru)
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["dflash_config"]["projector_type"] == "domino" and config["emb_dim"] == 16
    assert config["dflash_config"]["use_bias_norm"] and config["dflash_config"]["use_bias_gate"]
    assert config["block_size"] == config["dflash_config"]["block_size"] == 5      # the references read either
    loaded = load_drafter(tmp_path / "d", target=tiny_target)
    _same_state(tiny_drafter, loaded)
    assert set(loaded.heads) == {"gru"}
    _same_state(gru, loaded.heads["gru"])
    assert loaded.heads["gru"].embedding_weight is tiny_target.get_input_embeddings().weight
    block = DraftBlock(logits=torch.randn(1, 4, 111), root=torch.tensor([3]), hidden=torch.randn(1, 4, 32))
    s = gru.initial_state(block)[:, None]
    cands = torch.arange(111)[None]
    assert torch.equal(loaded.heads["gru"].logits(block, 2, s, cands), gru.logits(block, 2, s, cands))
    with pytest.raises(ValueError, match="bias-free"):
        save_drafter(tiny_drafter, tmp_path / "e", gru_head=GRUHead(32, 111, 12, 16))


def test_dspark_round_trip(tmp_path, tiny_target, tiny_heads, tiny_hidden):
    """A shifted-layout drafter with a Markov head and a confidence head: DeepSpec's keys and tensors."""
    from safetensors.torch import load_file

    from tests.models.conftest import make_drafter

    _, markov = tiny_heads
    drafter = make_drafter(tiny_target)
    drafter.config.shift_label = True
    drafter.confidence_head = torch.nn.Linear(32, 1)
    save_drafter(drafter, tmp_path / "d", markov_head=markov)
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3DSparkModel"] and "dflash_config" not in config
    for key in ("block_size", "mask_token_id", "target_layer_ids", "num_anchors", "enable_confidence_head",
                "markov_rank", "markov_head_type", "confidence_head_with_markov", "layer_types"):
        assert key in config, key
    names = set(load_file(str(tmp_path / "d" / "model.safetensors")))
    assert {"embed_tokens.weight", "lm_head.weight", "markov_head.markov_w1.weight",
            "confidence_head.proj.weight"} <= names
    loaded = load_drafter(tmp_path / "d")                     # no target: the checkpoint's own matrices
    _same_state(drafter, loaded)
    _same_state(markov, loaded.heads["markov"])
    assert loaded.config.shift_label and loaded.gamma == 5
    ids = torch.randint(0, 100, (2, 8))
    hidden = tiny_hidden(tiny_target, ids, loaded.target_layer_ids)
    assert torch.equal(_draft(loaded, ids, hidden).logits, _draft(drafter, ids, hidden).logits)
    with pytest.raises(ValueError, match="shift_label"):      # a DFlash-layout drafter cannot be DSpark
        save_drafter(make_drafter(tiny_target), tmp_path / "e", markov_head=markov)


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


def test_missing_unexpected_and_misshapen_weights_are_named(tmp_path, tiny_target, tiny_drafter):
    save_drafter(tiny_drafter, tmp_path / "a")
    _rewrite(tmp_path / "a", drop="layers.1.self_attn.k_norm.weight")
    with pytest.raises(ValueError, match=r"missing .*layers\.1\.self_attn\.k_norm\.weight"):
        load_drafter(tmp_path / "a")
    save_drafter(tiny_drafter, tmp_path / "b")
    _rewrite(tmp_path / "b", add={"layers.0.mystery.weight": torch.zeros(2)})
    with pytest.raises(ValueError, match=r"unexpected .*layers\.0\.mystery\.weight"):
        load_drafter(tmp_path / "b")
    save_drafter(tiny_drafter, tmp_path / "c", gru_head=_bias_free_head(tiny_target.get_input_embeddings().weight))
    _rewrite(tmp_path / "c", drop="bias_gate.2.bias")
    with pytest.raises(ValueError, match=r"missing .*bias_gate\.2\.bias"):
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
    config["dflash_config"].update(projector_type="mystery")
    (tmp_path / "x" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="projector_type"):
        load_drafter(tmp_path / "x")


def test_written_dflash_config_has_what_the_reference_reads(tmp_path, tiny_drafter):
    save_drafter(tiny_drafter, tmp_path / "d")
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["block_size"] == 5 and config["num_target_layers"] == 5            # config.block_size
    assert config["dflash_config"] == {"block_size": 5, "mask_token_id": 110, "target_layer_ids": [1, 2],
                                       "shift_label": False}
    assert config["layer_types"] == ["full_attention"] * 2 and config["rope_scaling"] is None


# ------------------------------------------- issue 11 item 7: every bad file is a ValueError naming it
def test_corrupt_or_empty_safetensors_name_the_file(tmp_path, tiny_drafter):
    for name, data in (("empty", b""), ("corrupt", b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")):
        path = save_drafter(tiny_drafter, tmp_path / name)
        (path / "model.safetensors").write_bytes(data)
        with pytest.raises(ValueError, match=r"weights: .*model\.safetensors"):
            load_drafter(path)


@pytest.mark.parametrize("text, match", [("{broken", "not valid JSON"), ("[1, 2]", "JSON object"),
                                         ('"text"', "JSON object"), ('{"dflash_config": 3}', "dflash_config")])
def test_config_not_json_or_not_an_object(tmp_path, tiny_drafter, text, match):
    path = save_drafter(tiny_drafter, tmp_path / "c")
    (path / "config.json").write_text(text)
    with pytest.raises(ValueError, match=match) as info:
        load_drafter(path)
    assert "config.json" in str(info.value)


@pytest.mark.parametrize("key, value, match", [
    ("hidden_size", None, "lacks 'hidden_size'"),
    ("num_hidden_layers", "two", "'num_hidden_layers': expected an integer"),
    ("rms_norm_eps", "small", "'rms_norm_eps': expected a number"),
    ("vocab_size", 0, "'vocab_size': expected an integer >= 1"),
    ("num_attention_heads", 2.5, "'num_attention_heads': expected an integer"),
])
def test_missing_or_non_numeric_keys_name_the_file_and_key(tmp_path, tiny_drafter, key, value, match):
    path = save_drafter(tiny_drafter, tmp_path / "k")
    config = json.loads((path / "config.json").read_text())
    if value is None:
        del config[key]
    else:
        config[key] = value
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=match) as info:
        load_drafter(path)
    assert "config.json" in str(info.value)


def test_head_only_weights_must_be_finite(tmp_path, tiny_heads):
    gru, markov = tiny_heads
    from safetensors.torch import load_file

    save_markov_head(markov, tmp_path / "m")
    name, bad = next(iter(load_file(str(tmp_path / "m" / "model.safetensors")).items()))   # as the file names it
    bad.view(-1)[0] = float("nan")
    _rewrite(tmp_path / "m", add={name: bad})
    with pytest.raises(ValueError, match=rf"^weights: {name} in .* holds 1 NaN or infinite value"):
        load_head(tmp_path / "m")


def test_head_only_keys_are_checked(tmp_path, tiny_heads):
    gru, markov = tiny_heads
    save_markov_head(markov, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["markov_rank"] = "six"
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config.json key 'markov_rank'"):
        load_head(tmp_path / "m")
    save_gru_head(gru, tmp_path / "g")
    (tmp_path / "g" / "config.json").write_text(json.dumps({"head_type": "lstm"}))
    with pytest.raises(ValueError, match="head_type"):
        load_head(tmp_path / "g")
