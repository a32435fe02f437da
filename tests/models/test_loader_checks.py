"""Loader inputs a careless script or an odd checkpoint gives: clear errors, and the layer rules of the
references (a 2-layer target, an explicit -1) accepted and drafted as they draft."""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from dartree.models import load_drafter, load_head
from dartree.models.drafter import MAX_BLOCK_SIZE, DFlashConfig, dflash_target_layer_ids
from tests.models import release_formats as rf
from tests.models.test_release_formats import TOL, _context, _dflash_dir, _draft, _reference_slots


@pytest.fixture(scope="module")
def target():
    from tests.models.conftest import make_target

    model = make_target()
    with torch.no_grad():
        model.lm_head.weight.div_(30.0)
    return model


def two_layer_target() -> Qwen3ForCausalLM:
    torch.manual_seed(3)
    config = Qwen3Config(vocab_size=rf.VOCAB, hidden_size=rf.HIDDEN, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                         tie_word_embeddings=False, attn_implementation="sdpa")
    return Qwen3ForCausalLM(config).eval().requires_grad_(False)


# ------------------------------------------------------------------------------------ path argument
@pytest.mark.parametrize("path", [None, 123, 1.5, b"/tmp", ["dir"]])
def test_path_of_the_wrong_type(path) -> None:
    with pytest.raises(ValueError, match=r"^path: expected a local checkpoint directory \(str or os.PathLike\)"):
        load_drafter(path)
    with pytest.raises(ValueError, match=r"^path: expected a local checkpoint directory"):
        load_head(path)


def test_unreadable_folder_is_a_clear_error(tmp_path, monkeypatch) -> None:
    path, _, _ = _dflash_dir(tmp_path)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == path else real(p, mode, **kw))
    with pytest.raises(ValueError, match=rf"^path: cannot read the checkpoint directory '{path}'.*permission denied"):
        load_drafter(path)


def test_permission_error_anywhere_in_the_folder(tmp_path, monkeypatch) -> None:
    """Tests run as root (chmod does not block reads): raise PermissionError where the OS would."""
    path, _, _ = _dflash_dir(tmp_path)

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "is_dir", denied)
    with pytest.raises(ValueError, match=rf"^path: cannot read the checkpoint directory '{path}'.*Permission denied"):
        load_drafter(path)
    monkeypatch.undo()
    monkeypatch.setattr(Path, "glob", denied)
    with pytest.raises(ValueError, match=r"^path: cannot read the checkpoint directory .*Permission denied"):
        load_drafter(path)
    monkeypatch.undo()
    monkeypatch.setattr(Path, "read_text", denied)
    with pytest.raises(ValueError, match=r"^config: cannot read .*config.json.*Permission denied"):
        load_drafter(path)


# --------------------------------------------------------------------------------------- config values
@pytest.mark.parametrize("block_size", [10**9, MAX_BLOCK_SIZE + 1, 1, 0])
def test_absurd_block_size_is_refused_before_allocating(tmp_path, block_size: int) -> None:
    path, config, tensors = _dflash_dir(tmp_path, block_size=block_size)
    with pytest.raises(ValueError, match=r"config.json key 'block_size': expected an integer"):
        load_drafter(path)
    with pytest.raises(ValueError, match=rf"^block_size: expected an int in \[2, {MAX_BLOCK_SIZE}\]"):
        DFlashConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=8, vocab_size=11, target_layer_ids=[0], mask_token_id=1, block_size=block_size)


@pytest.mark.parametrize("eps", [float("nan"), -1e-6, 0.0, float("inf"), 1.0, 1e30])
def test_rms_norm_eps_must_be_a_small_positive_number(tmp_path, eps: float) -> None:
    """An epsilon of 1 or more flattens every norm (1e30: every round accepted nothing, silently)."""
    path, config, tensors = _dflash_dir(tmp_path, rms_norm_eps=eps)
    with pytest.raises(ValueError, match=r"config.json key 'rms_norm_eps': expected a number in \(0, 1\)"):
        load_drafter(path)
    with pytest.raises(ValueError, match=r"^rms_norm_eps: expected a number in \(0, 1\)"):
        DFlashConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=8, vocab_size=11, target_layer_ids=[0], mask_token_id=1, rms_norm_eps=eps)


def test_target_layer_ids_must_be_distinct(tmp_path) -> None:
    path, config, tensors = _dflash_dir(tmp_path, dflash_config={"mask_token_id": rf.MASK, "target_layer_ids": [3, 3]})
    with pytest.raises(ValueError, match=r"target_layer_ids: expected distinct layers, got \[3, 3\]"):
        load_drafter(path)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_drafter_or_head_with_non_finite_weights_names_the_tensor(tmp_path, value: float) -> None:
    from tests.models.test_loaders import _rewrite

    path, config, tensors = _dflash_dir(tmp_path)
    bad = tensors["layers.1.mlp.down_proj.weight"].clone()
    bad[0, 0] = value
    _rewrite(path, add={"layers.1.mlp.down_proj.weight": bad})
    with pytest.raises(ValueError, match=r"^weights: layers\.1\.mlp\.down_proj\.weight in .* holds 1 NaN or "
                                         r"infinite value\(s\) of \d+; expected finite weights"):
        load_drafter(path)


@pytest.mark.parametrize("field,value", [
    ("target_layer_ids", [1.5, 2]), ("target_layer_ids", "12"), ("target_layer_ids", [True]),
    ("rope_theta", float("nan")), ("rope_theta", -1.0), ("num_target_layers", 0), ("num_target_layers", 2.0),
    ("mask_token_id", 1.0), ("head_dim", 0),
])
def test_dflash_config_refuses_values_it_used_to_cast(field: str, value) -> None:
    fields = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=8, vocab_size=11, target_layer_ids=[0], mask_token_id=1)
    with pytest.raises(ValueError, match=rf"^{field}:"):
        DFlashConfig(**{**fields, field: value})


@pytest.mark.parametrize("dtype", [torch.int32, torch.int8, torch.bool])
def test_integer_weights_are_refused_not_cast(tmp_path, dtype) -> None:
    path, config, tensors = _dflash_dir(tmp_path)
    tensors["fc.weight"] = tensors["fc.weight"].to(dtype)
    rf.write(path, config, tensors)
    with pytest.raises(ValueError, match=rf"^weights: fc.weight in .* is {dtype}; expected a floating dtype"):
        load_drafter(path)


def test_integer_shared_embedding_is_refused(tmp_path) -> None:
    path, config, tensors = _dflash_dir(tmp_path)
    tensors |= {"embed_tokens.weight": torch.zeros(rf.VOCAB, rf.HIDDEN, dtype=torch.int64),
                "lm_head.weight": torch.zeros(rf.VOCAB, rf.HIDDEN)}
    rf.write(path, config, tensors)
    with pytest.raises(ValueError, match=r"^weights: embed_tokens.weight in .* is torch.int64"):
        load_drafter(path)


# ----------------------------------------------------------------------------------------- the format
@pytest.mark.parametrize("stray", [{"num_anchors": 512}, {"markov_rank": 0}, {"num_anchors": 8, "markov_rank": 0}])
def test_stray_deepspec_keys_do_not_switch_a_dflash_config_to_the_shifted_layout(tmp_path, target, stray) -> None:
    path, config, tensors = _dflash_dir(tmp_path)
    plain = load_drafter(path, target=target)
    stray_path = rf.write(tmp_path / "stray", {**config, **stray}, tensors)
    with pytest.warns(UserWarning, match=r"DeepSpec keys .* are ignored .*slot 0 dropped"):
        loaded = load_drafter(stray_path, target=target)
    assert not loaded.config.shift_label and loaded.gamma == plain.gamma == rf.BLOCK - 1
    ids, hidden = _context(target, [1, 3])
    torch.testing.assert_close(_draft(loaded, ids, hidden).logits, _draft(plain, ids, hidden).logits, atol=0, rtol=0)


def test_a_plain_dflash_config_loads_without_a_warning(tmp_path, target) -> None:
    path, _, _ = _dflash_dir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_drafter(path, target=target)


@pytest.mark.parametrize("where", ["top", "dflash_config"])
def test_shift_label_true_in_a_dflash_config_is_refused_in_either_place(tmp_path, where: str) -> None:
    path, config, tensors = _dflash_dir(tmp_path)
    if where == "top":
        config["shift_label"] = True
    else:
        config["dflash_config"]["shift_label"] = True
    rf.write(path, config, tensors)
    with pytest.raises(ValueError, match=r"config.json key 'shift_label': z-lab's DFlash loader ignores shift_label"):
        load_drafter(path)


def test_shift_label_false_at_the_top_is_the_default(tmp_path, target) -> None:
    path, config, tensors = _dflash_dir(tmp_path, shift_label=False)
    assert not load_drafter(path, target=target).config.shift_label


def test_domino_reads_shift_label_from_dflash_config_only(tmp_path) -> None:
    config = rf.qwen3_keys(architectures=["DFlashDraftModel"], block_size=rf.BLOCK, emb_dim=rf.EMB, shift_label=True,
                           dflash_config={"mask_token_id": rf.MASK, "target_layer_ids": [1, 3],
                                          "projector_type": "domino", "gru_hidden_dim": rf.GRU})
    tensors = rf.backbone_tensors(2) | rf.domino_head_tensors(False, False)
    path = rf.write(tmp_path / "domino", config, tensors)
    with pytest.raises(ValueError, match=r"key 'shift_label': Domino reads shift_label from dflash_config"):
        load_drafter(path)
    config["dflash_config"]["shift_label"] = True           # both places, same value: the layout Domino reads
    assert load_drafter(rf.write(path, config, tensors)).config.shift_label


# ----------------------------------------------------------------------------------------- layer rules
def _formula(t: int, n: int) -> list[int]:
    """z-lab's build_target_layer_ids, written out (dflash/model.py)."""
    if n == 1:
        return [t // 2]
    return [round(1 + i * (t - 4) / (n - 1)) for i in range(n)]


def test_the_written_formula_equals_z_labs_own() -> None:
    """``_formula`` is z-lab's ``build_target_layer_ids`` (skipped without the optional package)."""
    model = pytest.importorskip("dflash.model")
    for t in range(1, 41):
        for n in range(1, 17):
            assert model.build_target_layer_ids(t, n) == _formula(t, n), (t, n)


@pytest.mark.parametrize("t", range(1, 41))
def test_the_evenly_spaced_rule_equals_the_reference_formula(t: int) -> None:
    for n in range(1, 17):
        want = _formula(t, n)
        if min(want) >= -1 and max(want) < t:               # what hidden_states[layer + 1] can serve
            assert dflash_target_layer_ids(t, n) == want, (t, n)
        else:
            with pytest.raises(ValueError, match=r"^num_target_layers: the evenly spaced rule gives layers"):
                dflash_target_layer_ids(t, n)


def test_the_context_features_equal_the_reference_extraction() -> None:
    """z-lab's own feature extraction (``dflash.model.extract_context_feature``) on the hidden states of a
    two-layer target: the same features dartree hands its drafter (skipped without the optional package)."""
    model = pytest.importorskip("dflash.model")
    small = two_layer_target()
    ids, hidden = _context(small, [1, -1])
    with torch.no_grad():
        states = small(input_ids=ids, output_hidden_states=True).hidden_states
    torch.testing.assert_close(model.extract_context_feature(states, [1, -1]), hidden, atol=0, rtol=0)


@pytest.mark.parametrize("n,want", [(2, [1, -1]), (3, [1, 0, -1]), (4, [1, 0, 0, -1]), (5, [1, 0, 0, 0, -1]),
                                    (8, [1, 1, 0, 0, 0, 0, -1, -1])])
def test_two_layer_target_rule(n: int, want: list[int]) -> None:
    assert dflash_target_layer_ids(2, n) == want


def test_a_two_layer_target_drafter_loads_and_drafts_as_the_reference(tmp_path) -> None:
    """No target_layer_ids, num_target_layers 2, 2 draft layers: z-lab computes [1, -1] and reads
    hidden_states[2] and hidden_states[0] (the embedding output); so does dartree."""
    small = two_layer_target()
    config = rf.qwen3_keys(architectures=["DFlashDraftModel"], block_size=rf.BLOCK, num_target_layers=2,
                           dflash_config={"mask_token_id": rf.MASK})
    tensors = rf.backbone_tensors(2)
    drafter = load_drafter(rf.write(tmp_path / "two", config, tensors), target=small)
    assert drafter.target_layer_ids == (1, -1)
    ids, hidden = _context(small, [1, -1])
    block = _draft(drafter, ids, hidden)
    _, want = _reference_slots(config, tensors, small, ids, hidden)
    assert (block.logits.double() - want[:, 1:]).abs().max() <= TOL


def test_explicit_minus_one_in_a_plain_dflash_config(tmp_path, target) -> None:
    path, config, tensors = _dflash_dir(tmp_path)
    config["dflash_config"]["target_layer_ids"] = [-1, 3]
    drafter = load_drafter(rf.write(path, config, tensors), target=target)
    assert drafter.target_layer_ids == (-1, 3) and not drafter.config.shift_label
    ids, hidden = _context(target, [-1, 3])          # hidden_states[0] and hidden_states[4]
    block = _draft(drafter, ids, hidden)
    _, want = _reference_slots(config, tensors, target, ids, hidden)
    assert (block.logits.double() - want[:, 1:]).abs().max() <= TOL


def test_a_two_layer_target_decodes_losslessly(tmp_path) -> None:
    """End to end: the decoder's target wrapper serves layer -1 and the output is the target's greedy."""
    from dartree import SpeculativeDecoder, make_builder

    small = two_layer_target()
    config = rf.qwen3_keys(architectures=["DFlashDraftModel"], block_size=rf.BLOCK, num_target_layers=2,
                           dflash_config={"mask_token_id": rf.MASK})
    drafter = load_drafter(rf.write(tmp_path / "two", config, rf.backbone_tensors(2)), target=small)
    prompt = torch.tensor([[5, 17, 3, 40, 2]])
    out = SpeculativeDecoder(small, drafter, make_builder("ddtree", budget=6, topk=3)).generate(prompt, 12)
    with torch.no_grad():
        want = small.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)[0, 5:].tolist()
    assert torch.as_tensor(out.tokens).reshape(-1).tolist() == want




# -------------------------------------------------------------------------------------------- the target
def _saved_target(tmp_path, tie: bool = False) -> Path:
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, tie_word_embeddings=tie)
    path = tmp_path / f"target_{tie}"
    Qwen3ForCausalLM(config).save_pretrained(path)
    return path


def _edit_weights(path: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    file = path / "model.safetensors"
    weights = load_file(str(file))
    edit(weights)
    save_file(weights, str(file), metadata={"format": "pt"})


@pytest.mark.parametrize("tie", [False, True])
def test_a_complete_target_loads(tmp_path, tie: bool) -> None:
    from dartree.models.loaders import load_target

    model = load_target(_saved_target(tmp_path, tie))
    assert not model.training and not any(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize("edit,message", [
    (lambda w: w.pop("model.layers.1.mlp.down_proj.weight"), r"1 missing tensor\(s\): \['model.layers.1.mlp.down_proj"),
    (lambda w: w.update({"model.extra.weight": torch.zeros(2)}), r"1 unexpected tensor\(s\): \['model.extra.weight'\]"),
])
def test_a_target_missing_or_with_extra_tensors_is_an_error(tmp_path, edit, message: str) -> None:
    from dartree.eval.bundles import local_bundle
    from dartree.models.loaders import load_target

    path = _saved_target(tmp_path)
    _edit_weights(path, edit)
    with pytest.raises(ValueError, match=rf"^target: .*{message}"):
        load_target(path)
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    Tokenizer(WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(tmp_path / "tokenizer.json"))
    drafter, _, _ = _dflash_dir(tmp_path)
    with pytest.raises(ValueError, match=rf"^target: .*{message}"):
        local_bundle(path, drafter, tokenizer=tmp_path / "tokenizer.json")


def test_a_target_with_nan_weights_is_an_error(tmp_path) -> None:
    """NaN weights decoded the end-of-text token over and over, exit 0, and lossless (AR agreed)."""
    from dartree.models.loaders import load_target

    path = _saved_target(tmp_path)

    def poison(w):
        w["model.norm.weight"][3] = float("nan")

    _edit_weights(path, poison)
    with pytest.raises(ValueError, match=r"^weights: model\.norm\.weight in .* holds 1 NaN or infinite value"):
        load_target(path)


def test_a_target_with_integer_weights_is_an_error(tmp_path) -> None:
    """transformers casts integer tensors to float32: they loaded and decoded [0, 0, ...] with exit 0."""
    from dartree.models.loaders import load_target

    path = _saved_target(tmp_path)
    _edit_weights(path, lambda w: w.update({k: v.long() for k, v in w.items()}))
    with pytest.raises(ValueError, match=r"^weights: .* in .*model.safetensors is I64; expected a floating dtype"):
        load_target(path)


def _set_config(path: Path, **values) -> None:
    config = json.loads((path / "config.json").read_text())
    config.update(values)
    (path / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("breakage", ["truncated", "empty", "string vocab", "float vocab", "list config",
                                      "shape"])
def test_a_broken_target_checkpoint_is_one_value_error_naming_it(tmp_path, breakage: str) -> None:
    """Library exceptions (safetensors, huggingface_hub's config validation, transformers) came out raw,
    and as tracebacks on the command line: each is a ValueError that names the target directory."""
    from dartree.models.loaders import load_target

    path = _saved_target(tmp_path)
    file = path / "model.safetensors"
    if breakage == "truncated":
        file.write_bytes(file.read_bytes()[:200])
    elif breakage == "empty":
        file.write_bytes(b"")
    elif breakage == "string vocab":
        _set_config(path, vocab_size="50")
    elif breakage == "float vocab":
        _set_config(path, vocab_size=50.0)
    elif breakage == "list config":
        (path / "config.json").write_text("[1, 2]")
    else:
        _set_config(path, intermediate_size=24)
    with pytest.raises(ValueError, match=rf"^target: {re.escape(str(path))} could not be loaded as a causal LM: "):
        load_target(path)


@pytest.mark.parametrize("path", [None, 3])
def test_load_target_path_of_the_wrong_type(path) -> None:
    from dartree.models.loaders import load_target

    with pytest.raises(ValueError, match=r"^target: expected a local checkpoint directory"):
        load_target(path)


@pytest.mark.parametrize("with_head", [False, True])
def test_layer_minus_one_round_trips_through_the_dflash_and_domino_writers(tmp_path, with_head: bool) -> None:
    from dartree.models import DFlashDrafter, GRUHead, save_drafter

    config = DFlashConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=8, vocab_size=111, target_layer_ids=[1, -1], mask_token_id=110,
                          block_size=5, num_target_layers=2)
    drafter = DFlashDrafter(config)
    head = GRUHead(32, 111, 12, 16, bias=False) if with_head else None
    saved = save_drafter(drafter, tmp_path / "d", gru_head=head)
    written = json.loads((saved / "config.json").read_text())
    assert written["dflash_config"]["target_layer_ids"] == [1, -1]
    loaded = load_drafter(saved)
    assert loaded.target_layer_ids == (1, -1) and ("gru" in loaded.heads) == with_head
