"""LeanForward and kmajor.linear: the same bits as the model's own forward and as F.linear."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import dartree.models.lean as lean_module
from dartree.models import kmajor
from dartree.models.pointwise import signed_sin
from dartree.models.target import HFTarget
from tests.verify.helpers import one_thread, random_tree  # noqa: F401 (autouse fixture)

V = 97


def model_of(arch: str, attn: str = "sdpa", act: str = "silu", seed: int = 0):
    torch.manual_seed(seed)
    common = dict(vocab_size=V, hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, attn_implementation=attn, hidden_act=act,
                  initializer_range=0.2)
    if arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **common))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(attention_bias=True, mlp_bias=True, **common))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        model = MistralForCausalLM(MistralConfig(sliding_window=None, **common))
    return model.eval()


def outputs_equal(a, b) -> None:
    assert torch.equal(a.logits, b.logits)
    for x, y in ((a.hidden, b.hidden), (a.final, b.final)):
        assert (x is None) == (y is None)
        if x is not None:
            assert torch.equal(x, y)


@pytest.mark.parametrize("kind", ["dynamic", "static"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2", "mistral"])
def test_lean_forward_equals_the_models_own(arch, attn, kind):
    model = model_of(arch, attn)
    size = 96 if kind == "static" else None
    mine = HFTarget(model, layer_ids=(-1, 0, 2), cache=kind, max_cache_len=size)
    theirs = HFTarget(model, layer_ids=(-1, 0, 2), cache=kind, max_cache_len=size, forward="hf")
    assert mine.forward_path == "lean" and mine.forward_note is None and theirs.forward_path == "hf"
    # torch 2.13 CPU: grouped sdpa passes the probe with a dynamic cache only (a static cache's masked padding
    # changes sdpa's bits there: HF's attention function runs instead)
    assert mine._lean.grouped == (attn == "sdpa" and kind == "dynamic")
    prompt = torch.randint(0, V, (1, 30), generator=torch.Generator().manual_seed(1))
    outputs_equal(mine.prefill(prompt), theirs.prefill(prompt))
    for logits in ("all", "root"):
        tree = random_tree([17], seed=5, vocab=V)
        outputs_equal(mine.forward_tree(mine.tree_inputs(tree), logits),
                      theirs.forward_tree(theirs.tree_inputs(tree), logits))
        accepted = torch.tensor([[0, 1, 3]])
        mine.commit(accepted, 2)
        theirs.commit(accepted, 2)
    for m, logits in ((1, "all"), (4, "all"), (12, "last")):      # extend causally after a past
        ids = torch.randint(0, V, (1, m), generator=torch.Generator().manual_seed(m))
        outputs_equal(mine.extend(ids, logits), theirs.extend(ids, logits))


def test_cache_buffers_survive_crop_compaction_and_replacement():
    """The lean forward's in-place key/value buffers (a DynamicLayer holds prefix views of them) give the
    model's own numbers after a rollback, a commit, a cache replaced by other code, and a regrowth."""
    model = model_of("qwen3", seed=6)
    mine, theirs = HFTarget(model, layer_ids=(1,)), HFTarget(model, layer_ids=(1,), forward="hf")
    prompt = torch.randint(0, V, (1, 20), generator=torch.Generator().manual_seed(2))
    outputs_equal(mine.prefill(prompt), theirs.prefill(prompt))
    for step in range(30):                                   # 20 + 30 * (1..17) slots: the buffers regrow
        tree = random_tree([17], seed=step, vocab=V)
        outputs_equal(mine.forward_tree(mine.tree_inputs(tree)), theirs.forward_tree(theirs.tree_inputs(tree)))
        if step % 3 == 0:
            mine.rollback()
            theirs.rollback()
            continue
        accepted = torch.tensor([[0, 2, 5]]) if step % 2 else torch.tensor([[0, 1, 2]])
        mine.commit(accepted, 3)
        theirs.commit(accepted, 3)
        if step == 10:                                       # other code replaces the tensors: new buffers
            for layer in mine.cache.layers:
                layer.keys, layer.values = layer.keys.clone(), layer.values.clone()
    ids = torch.randint(0, V, (1, 5), generator=torch.Generator().manual_seed(9))
    outputs_equal(mine.extend(ids), theirs.extend(ids))
    for a, b in zip(mine.cache.layers, theirs.cache.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_a_model_cast_after_its_probe_is_probed_again_and_stays_exact_in_bf16():
    from dartree.models.target import _LEAN

    model = model_of("qwen3", seed=7)
    HFTarget(model)
    model.to(torch.bfloat16)
    mine, theirs = HFTarget(model, layer_ids=(0, 2)), HFTarget(model, layer_ids=(0, 2), forward="hf")
    assert len(_LEAN[model]) == 2 and mine.forward_path == "lean"
    prompt = torch.randint(0, V, (1, 30), generator=torch.Generator().manual_seed(1))
    outputs_equal(mine.prefill(prompt), theirs.prefill(prompt))
    tree = random_tree([17], seed=5, vocab=V)
    outputs_equal(mine.forward_tree(mine.tree_inputs(tree)), theirs.forward_tree(theirs.tree_inputs(tree)))


def test_unsupported_layout_runs_the_models_forward():
    model = model_of("qwen3", act="gelu")
    target = HFTarget(model)
    assert target.forward_path == "hf" and "activation" in target.forward_note
    with pytest.raises(ValueError, match="forward: 'lean' cannot run Qwen3ForCausalLM: activation"):
        HFTarget(model, forward="lean")
    with pytest.raises(ValueError, match="forward: expected one of"):
        HFTarget(model, forward="fast")


def test_q_and_k_norms_with_different_epsilons_run_the_models_forward():
    """q and k are normed as one tensor with one epsilon: a model whose two differ is not one the lean forward runs."""
    model = model_of("qwen3")
    model.model.layers[1].self_attn.k_norm.variance_epsilon = 1e-3
    target = HFTarget(model)
    assert target.forward_path == "hf" and "different epsilons" in target.forward_note


def test_probe_refuses_a_lean_forward_that_differs(monkeypatch):
    """The probe compares before use: a lean forward one ulp off is never used."""
    def rotate_off(x, cos, sin):
        half = x.shape[-1] // 2
        return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin) * (1 + 2 ** -20)

    def rotate_signed_off(x, cos, sin_signed):
        return (x * cos) + x.roll(x.shape[-1] // 2, -1) * sin_signed * (1 + 2 ** -20)

    monkeypatch.setattr(lean_module, "rotate", rotate_off)
    monkeypatch.setattr(lean_module, "rotate_signed", rotate_signed_off)
    model = model_of("llama", seed=3)
    target = HFTarget(model)
    assert target.forward_path == "hf" and "differ" in target.forward_note


def test_probe_falls_back_to_hfs_attention_function_where_grouped_sdpa_differs(monkeypatch):
    real_sdpa = lean_module._sdpa

    def sdpa_off(q, k, v, mask, scaling, groups):
        return real_sdpa(q, k, v, mask, scaling, groups) * (1 + 2 ** -20)

    monkeypatch.setattr(lean_module, "_sdpa", sdpa_off)
    target = HFTarget(model_of("qwen3", seed=5))
    assert target.forward_path == "lean" and not target._lean.grouped


@pytest.mark.parametrize("capacity", [None, 64])
def test_the_accelerator_branch_of_the_sdpa_path_is_exact(capacity):
    """Off the CPU sdpa models keep HF's attention function (no grouped sdpa): checked here on CPU tensors
    through the same probe."""
    from dartree.models.target import _probe_equal

    model = model_of("qwen3", seed=8)
    lean = lean_module.LeanForward(model, grouped=False)
    assert not lean.grouped and _probe_equal(model, lean, capacity) is None


def test_a_lean_forward_that_raises_on_the_probe_leaves_the_models_own(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(lean_module, "_append", broken)
    target = HFTarget(model_of("llama", seed=9))
    assert target.forward_path == "hf" and "RuntimeError: shape mismatch" in target.forward_note
    out = target.prefill(torch.tensor([[1, 2, 3]]))
    assert out.logits.shape == (1, 3, V)


def test_weights_edited_in_place_are_seen():
    model = model_of("qwen3", seed=4)
    mine, theirs = HFTarget(model, layer_ids=(1,)), HFTarget(model, layer_ids=(1,), forward="hf")
    prompt = torch.arange(40)[None] % V
    outputs_equal(mine.prefill(prompt), theirs.prefill(prompt))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.25)
    outputs_equal(mine.prefill(prompt), theirs.prefill(prompt))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(37, 111), (256, 768), (128, 384)])
def test_kmajor_linear_is_f_linear_bit_for_bit(shape, bias):
    k, n = shape
    gen = torch.Generator().manual_seed(k + n)
    w = torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    for rows in (1, 2, 7, 10, 11, 12, 16, 17, 33, 100):
        x = torch.randn(2, rows, k, generator=gen)
        assert torch.equal(kmajor.linear(x, w, b), F.linear(x, w, b))
    copy = kmajor.kmajor_copy(w)
    assert kmajor.kmajor_copy(w) is copy and torch.equal(copy, w.t())      # one copy per weight
    with torch.no_grad():
        w.mul_(0.5)                                           # an in-place edit rebuilds the copy
    x = torch.randn(64, k, generator=gen)
    assert torch.equal(kmajor.linear(x, w, b), F.linear(x, w, b))
    assert kmajor.kmajor_copy(w) is not copy


def test_kmajor_linear_keeps_gradients():
    w = torch.randn(24, 16, requires_grad=True)
    x = torch.randn(40, 16)
    kmajor.linear(x, w).sum().backward()
    assert w.grad is not None
    torch.testing.assert_close(w.grad, x.sum(0).expand(24, 16))


def test_kmajor_copies_are_freed_with_their_weight():
    w = torch.randn(8, 4)
    kmajor.kmajor_copy(w)
    key = id(w)
    assert key in kmajor._COPIES
    del w
    assert key not in kmajor._COPIES


def test_kmajor_allowed_only_on_the_cpu_within_the_limit():
    model = model_of("qwen3")
    assert kmajor.kmajor_allowed(model)
    assert not kmajor.kmajor_allowed(model, limit=kmajor.linear_bytes(model) - 1)


@pytest.mark.parametrize("shape", [(1, 1, 256), (1, 17, 256), (3, 5, 64), (1, 17, 6, 64), (2, 9, 3, 128)])
def test_the_lean_rms_norm_is_hf_rmsnorm_bit_for_bit(shape):
    """torch.rms_norm (one op) in float32, a per-head weight multiplied after it, gives the bits of HF's
    RMSNorm (x * rsqrt(mean(x ** 2) + eps), then weight *), and bf16 keeps HF's casts."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    from dartree.models.lean import _rms

    g = torch.Generator().manual_seed(sum(shape))
    for scale in (1e-3, 1.0, 50.0):
        x = torch.randn(*shape, generator=g) * scale
        norm = Qwen3RMSNorm(shape[-1], eps=1e-6)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(shape[-1], generator=g))
            assert torch.equal(_rms(x, norm.weight, 1e-6), norm(x))
            heads = torch.randn(*shape[2:], generator=g) if len(shape) == 4 else norm.weight
            want = heads * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
            assert torch.equal(_rms(x, heads, 1e-6), want)
            low = norm.to(torch.bfloat16)
            assert torch.equal(_rms(x.bfloat16(), low.weight, 1e-6), low(x.bfloat16()))


def test_the_rotary_table_gives_the_modules_cos_and_sin_bit_for_bit():
    """The lean forward's cos / sin rows, gathered from a table it grows on demand, equal the model's
    rotary module at every position asked for (ragged rows, positions past the table), and an edited
    inv_freq rebuilds the table."""
    model = model_of("qwen3")
    lean, why = lean_module.lean_forward(model)
    assert why is None
    rotary = model.model.rotary_emb
    h = torch.zeros(2, 3, model.config.hidden_size)
    g = torch.Generator().manual_seed(3)
    for high in (40, 300, 1000):                        # the last two grow the table
        positions = torch.randint(0, high, (2, 17), generator=g)
        (cos, sin), (got_cos, got_sin, signed) = rotary(h, positions), lean._rotary_rows(h, positions)
        assert signed and torch.equal(got_cos, cos) and torch.equal(got_sin, signed_sin(sin))
    assert lean._rope[3].shape[0] > int(positions.max()) > 300
    with torch.no_grad():
        rotary.inv_freq.mul_(0.5)                       # edited in place: the table follows
    positions = torch.arange(5)[None]
    (cos, sin), (got_cos, got_sin, _) = rotary(h, positions), lean._rotary_rows(h, positions)
    assert torch.equal(got_cos, cos) and torch.equal(got_sin, signed_sin(sin))
