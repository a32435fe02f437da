"""The drafter's decoding fast path (``DFlashDrafter.draft`` via ``DFlashLayer.decode``) against the
general forward (``block_hidden``, the training path), and its caches (rotary table, fused weights).

Same math, different kernels (one q/k/v matmul, attention over a view of the context buffer, a 2-D
LM-head matmul): bit-identical on the zoo at batch 1 (checked when the fast path was written), equal
to rounding otherwise, hence the float32 tolerance below."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dartree.models.drafter import RMSNorm, RotaryEmbedding
from dartree.models.pointwise import signed_sin
from tests.models.conftest import make_drafter


def general_draft(drafter, root: torch.Tensor):
    """``draft`` as it was before the fast path: the general forward over [context; block]."""
    b, n = root.shape[0], drafter.context_length
    ctx = drafter._ctx if n else drafter._empty_context(b, root.device)
    positions = torch.arange(n, n + drafter.block_size)
    with torch.no_grad():
        hidden = drafter.block_hidden(root[:, None], positions, ctx)[:, drafter.config.first_slot:]
    return F.linear(hidden, drafter.lm_head_weight), hidden


@pytest.mark.parametrize("shift_label", [False, True])
@pytest.mark.parametrize("batch, context", [(1, 0), (1, 7), (3, 13)])
def test_draft_equals_the_general_forward(tiny_target, tiny_hidden, shift_label, batch, context):
    drafter = make_drafter(tiny_target)
    drafter.config.shift_label = shift_label
    ids = torch.randint(0, 100, (batch, context + 1))
    drafter.reset()
    if context:
        drafter.append_context(tiny_hidden(tiny_target, ids[:, :-1], drafter.target_layer_ids))
    logits, hidden = general_draft(drafter, ids[:, -1])
    block = drafter.draft(ids[:, -1])
    torch.testing.assert_close(block.logits, logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(block.hidden, hidden, atol=1e-5, rtol=1e-5)
    assert drafter.context_length == context                   # the block's keys/values are scratch
    again = drafter.draft(ids[:, -1])
    assert torch.equal(again.logits, block.logits)


def test_append_context_stores_the_general_key_values(tiny_target, tiny_hidden):
    drafter = make_drafter(tiny_target)
    ids = torch.randint(0, 100, (2, 10))
    hidden = tiny_hidden(tiny_target, ids, drafter.target_layer_ids)
    drafter.reset()
    for lo, hi in ((0, 3), (3, 4), (4, 10)):
        drafter.append_context(hidden[:, lo:hi])
    with torch.no_grad():
        want = drafter.context_key_values(drafter.context_features(hidden), torch.arange(10))
    for (k, v), (k_want, v_want) in zip(drafter._ctx, want, strict=True):
        torch.testing.assert_close(k, k_want, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(v, v_want, atol=1e-6, rtol=1e-5)


def test_fused_weights_follow_in_place_edits_and_new_parameters(tiny_target, tiny_hidden):
    drafter = make_drafter(tiny_target)
    ids = torch.randint(0, 100, (2, 9))
    drafter.append_context(tiny_hidden(tiny_target, ids[:, :-1], drafter.target_layer_ids))
    before = drafter.draft(ids[:, -1]).logits
    with torch.no_grad():
        drafter.layers[0].self_attn.k_proj.weight.mul_(1.5)        # in place: version counter
    drafter.layers[1].mlp.up_proj.weight = torch.nn.Parameter(drafter.layers[1].mlp.up_proj.weight * 0.5)
    after = drafter.draft(ids[:, -1]).logits
    assert not torch.allclose(after, before)
    torch.testing.assert_close(after, general_draft(drafter, ids[:, -1])[0], atol=1e-5, rtol=1e-5)


def test_empty_context_then_another_batch(tiny_target, tiny_hidden):
    drafter = make_drafter(tiny_target)
    drafter.reset()
    drafter.draft(torch.tensor([3]))                                 # allocates batch-1 buffers
    ids = torch.randint(0, 100, (2, 6))
    drafter.append_context(tiny_hidden(tiny_target, ids[:, :-1], drafter.target_layer_ids))
    torch.testing.assert_close(drafter.draft(ids[:, -1]).logits, general_draft(drafter, ids[:, -1])[0],
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rope_parameters", [None, {"rope_type": "linear", "factor": 4.0}])
def test_rotary_table_equals_the_forward_across_growth(tiny_drafter, rope_parameters):
    config = tiny_drafter.config
    config.rope_parameters = rope_parameters
    config._check_rope()
    rotary = RotaryEmbedding(config)
    like = torch.zeros(1)
    for start, count in ((0, 5), (250, 16), (1000, 33), (3, 4)):          # the table grows past 256, then 512
        cos, sin = rotary.table(start, count, like)
        ref_cos, ref_sin = rotary(like, torch.arange(start, start + count))
        assert torch.equal(cos, ref_cos) and torch.equal(sin, signed_sin(ref_sin))


@pytest.mark.parametrize("shape", [(1, 16, 256), (3, 5, 111), (2, 7, 4, 8)])
def test_rms_norm_fast_path_is_bit_identical(shape):
    torch.manual_seed(0)
    norm = RMSNorm(shape[-1], 1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(shape) * 3.0
    explicit = norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps))
    assert torch.equal(norm(x), explicit)


def test_a_drafter_in_another_dtype_casts_the_shared_lm_head_once_and_follows_edits(tiny_target, tiny_hidden):
    """A bf16 drafter beside an fp32 target: the shared LM head is cast once (not every block, which
    also made a fresh K-major copy each time), and the cast follows an in-place edit of the head."""
    drafter = make_drafter(tiny_target).to(torch.bfloat16)
    head = drafter.lm_head_weight
    assert head.dtype == torch.float32                               # the target's: not cast by .to()
    ids = torch.randint(0, 100, (1, 8))
    drafter.append_context(tiny_hidden(tiny_target, ids[:, :-1], drafter.target_layer_ids))

    def want(block):
        return F.linear(block.hidden, head.to(torch.bfloat16))

    first = drafter.draft(ids[:, -1])
    cast = drafter.__dict__[f"_lm_head_{torch.bfloat16}"][1]
    assert first.logits.dtype == torch.bfloat16 and torch.equal(first.logits, want(first))
    assert drafter.draft(ids[:, -1]) is not None and drafter.__dict__[f"_lm_head_{torch.bfloat16}"][1] is cast
    with torch.no_grad():
        head.mul_(-1.0)                                              # the target's head edited in place
    after = drafter.draft(ids[:, -1])
    assert torch.equal(after.logits, want(after)) and not torch.equal(after.logits, first.logits)
    head = head * 0.5                                                # a new head shared: the old cast is dropped
    drafter.set_shared_weights(drafter.embedding_weight, head)
    assert f"_lm_head_{torch.bfloat16}" not in drafter.__dict__
    again = drafter.draft(ids[:, -1])
    assert torch.equal(again.logits, want(again))
