"""Released DFlash / Domino / DSpark checkpoints, written here in each release's exact format, load
and draft as the formulas of their references say: which slot is depth d, bias-free heads, bias_norm
and bias_gate, target layer -1, rope_scaling; unsupported features are refused."""

from __future__ import annotations

import pytest
import torch

from dartree.models import load_drafter
from tests.models import release_formats as rf
from tests.models.conftest import make_target

TOL = 1e-4          # the goal: max abs diff in fp32 against an independent computation


@pytest.fixture(scope="module")
def target():
    model = make_target()
    with torch.no_grad():
        model.lm_head.weight.div_(30.0)      # ordinary logit scale: the fp32 tolerance is absolute
    return model


def _context(target, layer_ids, n=7, seed=5):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 100, (1, n), generator=g)
    with torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True)
    hidden = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)   # i = -1: the embedding output
    return ids, hidden


def _draft(drafter, ids, hidden):
    drafter.reset()
    drafter.append_context(hidden[:, :-1])
    return drafter.draft(ids[:, -1])


def _reference_slots(config, tensors, target, ids, hidden):
    """lm_head(H) of every block slot [root, mask, ...], from the formulas (float64)."""
    block_ids = torch.full((1, config["block_size"]), rf.MASK)
    block_ids[0, 0] = ids[0, -1]
    h = rf.block_hidden(config, tensors, hidden[:, :-1], block_ids, target.get_input_embeddings().weight)
    return h, h @ target.lm_head.weight.double().T


def _dflash_dir(tmp_path, name="dflash", **extra):
    config = rf.qwen3_keys(architectures=["DFlashDraftModel"], block_size=rf.BLOCK,
                           dflash_config={"mask_token_id": rf.MASK, "target_layer_ids": [1, 3]})
    config.update(extra)
    tensors = rf.backbone_tensors(2)
    return rf.write(tmp_path / name, config, tensors), config, tensors


def test_dflash_release_drops_slot_zero(tmp_path, target):
    path, config, tensors = _dflash_dir(tmp_path)
    drafter = load_drafter(path, target=target)
    assert not drafter.config.shift_label and drafter.gamma == rf.BLOCK - 1
    ids, hidden = _context(target, [1, 3])
    block = _draft(drafter, ids, hidden)
    _, want = _reference_slots(config, tensors, target, ids, hidden)
    assert (block.logits.double() - want[:, 1:]).abs().max() <= TOL          # depth d = slot d


def test_same_weights_in_the_two_layouts_are_one_slot_apart(tmp_path, target):
    """The layout bug the issue describes: a shifted checkpoint read as DFlash is one depth off."""
    path, config, tensors = _dflash_dir(tmp_path)
    shifted = dict(config, architectures=["Qwen3DSparkModel"], mask_token_id=rf.MASK, target_layer_ids=[1, 3],
                   num_anchors=8, markov_rank=0, enable_confidence_head=False)
    del shifted["dflash_config"]
    plain = load_drafter(path, target=target)
    spark = load_drafter(rf.write(tmp_path / "spark", shifted, tensors), target=target)
    ids, hidden = _context(target, [1, 3])
    a, b = _draft(plain, ids, hidden), _draft(spark, ids, hidden)
    assert spark.gamma == rf.BLOCK == plain.gamma + 1
    torch.testing.assert_close(b.logits[:, 1:], a.logits, atol=1e-6, rtol=0)   # DSpark depth d + 1 = DFlash d
    assert (b.logits[:, :-1] - a.logits).abs().max() > 1e-2                  # and not the same depth


@pytest.mark.parametrize("shift_label, norm, gate", [(True, False, False), (False, True, False), (True, True, True)])
def test_domino_release_bias_free_head_corrects_along_a_path(tmp_path, target, shift_label, norm, gate):
    config = rf.qwen3_keys(architectures=["DFlashDraftModel"], block_size=rf.BLOCK, emb_dim=rf.EMB,
                           dflash_config={"mask_token_id": rf.MASK, "target_layer_ids": [1, 3],
                                          "projector_type": "domino", "gru_hidden_dim": rf.GRU, "emb_dim": rf.EMB,
                                          "shift_label": shift_label, "use_bias_norm": norm, "use_bias_gate": gate})
    head_w = rf.domino_head_tensors(norm, gate)
    tensors = rf.backbone_tensors(2) | head_w
    drafter = load_drafter(rf.write(tmp_path / "domino", config, tensors), target=target)
    head = drafter.heads["gru"]
    assert not head.bias and head.prefix_len == 0               # pure_draft_prefix_len absent -> 0
    assert drafter.gamma == (rf.BLOCK if shift_label else rf.BLOCK - 1)
    ids, hidden = _context(target, [1, 3])
    block = _draft(drafter, ids, hidden)
    h, base = _reference_slots(config, tensors, target, ids, hidden)
    first = 0 if shift_label else 1
    assert (block.logits.double() - base[:, first:]).abs().max() <= TOL

    emb = target.get_input_embeddings().weight
    everything = torch.arange(rf.VOCAB)[None]
    state, path, worst, changed = head.initial_state(block)[:, None], [int(ids[0, -1])], 0.0, 0.0
    for d in range(1, block.gamma + 1):
        got = head.logits(block, d, state, everything)[0, 0].double()
        z = h[0, first + d - 1]
        correction = rf.domino_correction(head_w, z, rf.gru_state(head_w, emb, torch.tensor(path)), norm, gate)
        worst = max(worst, (got - base[0, first + d - 1] - correction).abs().max().item())
        plain = rf.domino_correction(head_w, z, rf.gru_state(head_w, emb, torch.tensor(path)), False, False)
        changed = max(changed, (correction - plain).abs().max().item())
        token = int(got.argmax())
        path.append(token)
        if d < block.gamma:
            state = head.advance(block, d, state, torch.tensor([[token]]))
    assert worst <= TOL
    assert (changed > 1e-3) == (norm or gate)                    # the norm / gate do change the correction


def test_dspark_release_all_slots_layer_minus_one_and_markov_path(tmp_path, target):
    g = torch.Generator().manual_seed(9)
    rank = 6
    config = rf.qwen3_keys(architectures=["Qwen3DSparkModel"], block_size=rf.BLOCK, mask_token_id=rf.MASK,
                           target_layer_ids=[-1, 2], num_anchors=16, enable_confidence_head=True,
                           confidence_head_with_markov=False, markov_rank=rank, markov_head_type="vanilla",
                           layer_types=["full_attention"] * rf.LAYERS)
    w1 = torch.randn(rf.VOCAB, rank, generator=g).to(torch.bfloat16)
    w2 = torch.randn(rf.VOCAB, rank, generator=g).to(torch.bfloat16)
    tensors = rf.backbone_tensors(2) | {
        "markov_head.markov_w1.weight": w1, "markov_head.markov_w2.weight": w2,
        "confidence_head.proj.weight": torch.randn(1, rf.HIDDEN).to(torch.bfloat16),
        "confidence_head.proj.bias": torch.zeros(1, dtype=torch.bfloat16),
        "embed_tokens.weight": target.get_input_embeddings().weight.detach().to(torch.bfloat16),
        "lm_head.weight": target.lm_head.weight.detach().to(torch.bfloat16)}
    drafter = load_drafter(rf.write(tmp_path / "dspark", config, tensors))   # its own embed / lm_head
    assert drafter.config.shift_label and drafter.gamma == rf.BLOCK and drafter.target_layer_ids == (-1, 2)
    ids, hidden = _context(target, [-1, 2])
    block = _draft(drafter, ids, hidden)
    block_ids = torch.full((1, rf.BLOCK), rf.MASK)
    block_ids[0, 0] = ids[0, -1]
    h = rf.block_hidden(config, tensors, hidden[:, :-1], block_ids, tensors["embed_tokens.weight"])
    base = h @ tensors["lm_head.weight"].double().T
    assert (block.logits.double() - base).abs().max() <= TOL            # depth d = slot d - 1
    markov, state, previous = drafter.heads["markov"], None, int(ids[0, -1])
    state = markov.initial_state(block)[:, None]
    for d in range(1, block.gamma + 1):
        got = markov.logits(block, d, state, torch.arange(rf.VOCAB)[None])[0, 0].double()
        want = base[0, d - 1] + w2.double() @ w1.double()[previous]
        assert (got - want).abs().max() <= TOL
        previous = int(got.argmax())
        state = markov.advance(block, d, state, torch.tensor([[previous]]))


@pytest.mark.parametrize("scaling", [{"rope_type": "linear", "factor": 4.0},
                                     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
                                     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8}])
def test_rope_scaling_is_read_through_transformers(tmp_path, target, scaling):
    plain_path, config, tensors = _dflash_dir(tmp_path)
    scaled_path, scaled_config, _ = _dflash_dir(tmp_path, "scaled", rope_scaling=scaling)
    ids, hidden = _context(target, [1, 3], n=12)
    plain = _draft(load_drafter(plain_path, target=target), ids, hidden).logits
    scaled = _draft(load_drafter(scaled_path, target=target), ids, hidden).logits
    _, want = _reference_slots(scaled_config, tensors, target, ids, hidden)
    assert (scaled.double() - want[:, 1:]).abs().max() <= TOL
    assert (scaled - plain).abs().max() > 1e-2


def test_linear_rope_scaling_divides_positions(tmp_path):
    """An independent check of the rope tables themselves: linear scaling = positions / factor."""
    from dartree.models.drafter import DFlashConfig, RotaryEmbedding

    kw = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, intermediate_size=8,
              vocab_size=11, target_layer_ids=[0], mask_token_id=1, head_dim=8)
    scaled = RotaryEmbedding(DFlashConfig(**kw, rope_parameters={"rope_type": "linear", "factor": 4.0}))
    plain = RotaryEmbedding(DFlashConfig(**kw))
    x = torch.zeros(1)
    assert torch.allclose(scaled(x, torch.arange(0, 40, 4))[0], plain(x, torch.arange(10))[0], atol=1e-6)


def test_missing_target_layer_ids_uses_the_evenly_spaced_rule(tmp_path, target):
    path, config, tensors = _dflash_dir(tmp_path)
    del config["dflash_config"]["target_layer_ids"]
    drafter = load_drafter(rf.write(tmp_path / "fallback", config, tensors))
    # round(1 + i * (5 - 4) / (2 - 1)) for i = 0, 1
    assert drafter.target_layer_ids == (1, 2)


@pytest.mark.parametrize("change, key", [
    ({"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 4}, "layer_types"),
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"is_causal": True}, "is_causal"),
    ({"attention_bias": True}, "attention_bias"),
    ({"architectures": ["DFlash2DraftModel"]}, "architectures"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"block_size": 8}, "block_size"),                                   # top level 8, dflash_config 5
    ({"dflash_config": {"mask_token_id": rf.MASK, "target_layer_ids": [1, 3], "shift_label": True}}, "shift_label"),
    ({"dflash_config": {"mask_token_id": rf.MASK, "target_layer_ids": [1, 3]}, "shift_label": True}, "shift_label"),
    ({"architectures": ["Qwen3DSparkModel"], "markov_rank": 4,
      "dflash_config": {"mask_token_id": rf.MASK, "target_layer_ids": [1, 3], "projector_type": "domino"}},
     "projector_type"),
    ({"architectures": ["Qwen3DSparkModel"], "markov_rank": 4, "markov_head_type": "gated", "mask_token_id": rf.MASK,
      "target_layer_ids": [1, 3]}, "markov_head_type"),
    ({"architectures": None, "num_anchors": 512}, "num_anchors"),          # nothing decides the layout
    ({"architectures": ["Qwen3ForCausalLM"], "markov_rank": 0}, "markov_rank"),
    ({"rope_scaling": {"rope_type": "mystery", "factor": 2.0}}, "rope"),
])
def test_unsupported_or_ambiguous_configs_are_refused(tmp_path, change, key):
    path, config, tensors = _dflash_dir(tmp_path)
    config["dflash_config"]["block_size"] = rf.BLOCK
    config.update(change)
    if "markov_rank" in change:
        tensors |= {"markov_head.markov_w1.weight": torch.zeros(rf.VOCAB, 4),
                    "markov_head.markov_w2.weight": torch.zeros(rf.VOCAB, 4)}
    rf.write(path, config, tensors)
    with pytest.raises(ValueError, match=key) as info:
        load_drafter(path)
    assert "config.json" in str(info.value)


@pytest.mark.parametrize("scaling", [None, {"rope_type": "linear", "factor": 4.0}])
def test_rope_tables_stay_float32_when_the_drafter_is_cast(scaling):
    from dartree.models.drafter import DFlashConfig, DFlashDrafter

    config = DFlashConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=8, vocab_size=11, target_layer_ids=[0], mask_token_id=1, head_dim=8,
                          rope_parameters=scaling)
    rotary = DFlashDrafter(config).to(torch.bfloat16).layers[0].self_attn.rotary
    cos, _ = rotary(torch.zeros(1, dtype=torch.float32), torch.arange(3000, 3010))
    want, _ = type(rotary)(config)(torch.zeros(1, dtype=torch.float32), torch.arange(3000, 3010))
    assert torch.equal(cos, want)


def test_the_target_wrapper_serves_layer_minus_one_as_the_embedding_output(target):
    from dartree.models.target import HFTarget

    ids = torch.randint(0, 100, (1, 6))
    out = HFTarget(target, layer_ids=(-1, 2)).prefill(ids)
    embedded = target.get_input_embeddings()(ids)
    assert torch.equal(out.hidden[..., : rf.HIDDEN], embedded)
    with pytest.raises(ValueError, match="-1"):
        HFTarget(target, layer_ids=(-2,))


@pytest.mark.parametrize("scaling", [{"rope_type": "dynamic", "factor": 2.0},
                                     {"rope_type": "linear", "factor": 2.0}])
def test_position_dependent_rope_loads_with_a_warning(tmp_path, target, scaling):
    """dynamic / longrope match the reference only up to the original context: said at load, not hidden."""
    import warnings

    path, _, _ = _dflash_dir(tmp_path, "rope", rope_scaling=scaling)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_drafter(path, target=target)
    said = [str(w.message) for w in caught if "rope_type" in str(w.message)]
    assert bool(said) == (scaling["rope_type"] == "dynamic")
    assert all("up to position" in m and "lossless" in m for m in said)
