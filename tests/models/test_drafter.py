"""DFlashDrafter: protocol, shapes, the context cache, and training/decoding consistency."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from dartree.block import DraftBlock
from dartree.decode import Drafter
from dartree.models.drafter import DFlashConfig, DFlashDrafter, dflash_target_layer_ids
from dartree.training.drafter import anchored_blocks


def test_target_layer_ids_match_released_spacing():
    assert dflash_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert dflash_target_layer_ids(28, 1) == [14]
    assert dflash_target_layer_ids(6, 2) == [1, 3]
    with pytest.raises(ValueError, match="num_draft_layers"):
        dflash_target_layer_ids(6, 0)


def test_conforms_to_the_decoder_protocol(tiny_drafter):
    assert isinstance(tiny_drafter, Drafter)
    assert tiny_drafter.gamma == tiny_drafter.block_size - 1 == 4
    assert tiny_drafter.target_layer_ids == (1, 2)


def test_shares_but_does_not_own_the_target_matrices(tiny_target, tiny_drafter):
    emb, head = tiny_target.get_input_embeddings().weight, tiny_target.lm_head.weight
    assert tiny_drafter.embedding_weight is emb and tiny_drafter.lm_head_weight is head
    assert all(p is not emb and p is not head for p in tiny_drafter.parameters())
    assert not any("embed" in k or "lm_head" in k for k in tiny_drafter.state_dict())


def test_draft_shapes_and_logits_are_lm_head_of_hidden(tiny_target, tiny_drafter, tiny_hidden):
    ids = torch.randint(0, 100, (3, 9))
    tiny_drafter.reset()
    tiny_drafter.append_context(tiny_hidden(tiny_target, ids[:, :-1], tiny_drafter.target_layer_ids), ids[:, :-1])
    block = tiny_drafter.draft(ids[:, -1])
    assert isinstance(block, DraftBlock)
    assert block.logits.shape == (3, 4, 111) and block.hidden.shape == (3, 4, 32)
    assert torch.equal(block.root, ids[:, -1])
    assert_close(block.logits, tiny_target.lm_head(block.hidden))
    assert tiny_drafter.context_length == 8


def test_incremental_context_equals_one_shot_and_draft_keeps_nothing(tiny_target, tiny_drafter, tiny_hidden):
    ids = torch.randint(0, 100, (2, 12))
    hidden = tiny_hidden(tiny_target, ids, tiny_drafter.target_layer_ids)
    tiny_drafter.reset()
    tiny_drafter.append_context(hidden[:, :11])
    once = tiny_drafter.draft(ids[:, 11])
    again = tiny_drafter.draft(ids[:, 11])
    assert torch.equal(once.logits, again.logits)
    tiny_drafter.reset()
    for lo, hi in ((0, 4), (4, 5), (5, 5), (5, 11)):
        tiny_drafter.append_context(hidden[:, lo:hi], ids[:, lo:hi])
    assert_close(tiny_drafter.draft(ids[:, 11]).logits, once.logits)
    # crop undoes an append
    tiny_drafter.append_context(hidden[:, 11:12])
    tiny_drafter.crop(11)
    assert_close(tiny_drafter.draft(ids[:, 11]).logits, once.logits)


def test_empty_context_drafts(tiny_drafter):
    tiny_drafter.reset()
    block = tiny_drafter.draft(torch.tensor([5]))
    assert block.logits.shape == (1, 4, 111) and torch.isfinite(block.logits).all()


def test_training_path_equals_decoding_path(tiny_target, tiny_drafter, tiny_hidden):
    """Many anchored blocks in one masked forward == one draft() per anchor with that prefix as context."""
    ids = torch.randint(0, 100, (2, 16))
    hidden = tiny_hidden(tiny_target, ids, tiny_drafter.target_layer_ids)
    anchors = torch.tensor([[3, 9, 0], [11, 1, 6]])
    with torch.no_grad():
        batched = anchored_blocks(tiny_drafter, hidden, ids, anchors)        # [2, 3, gamma, H]
    for s in range(2):
        for a in range(3):
            p = int(anchors[s, a])
            tiny_drafter.reset()
            tiny_drafter.append_context(hidden[s : s + 1, :p])
            block = tiny_drafter.draft(ids[s : s + 1, p])
            assert_close(batched[s, a], block.hidden[0], atol=1e-5, rtol=1e-5)


def test_bad_inputs(tiny_target, tiny_drafter):
    with pytest.raises(ValueError, match="hidden_states"):
        tiny_drafter.append_context(torch.zeros(1, 3, 10))
    with pytest.raises(ValueError, match="tokens"):
        tiny_drafter.append_context(torch.zeros(1, 3, 64), torch.zeros(1, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="root"):
        tiny_drafter.draft(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="length"):
        tiny_drafter.crop(99)
    unbound = DFlashDrafter(tiny_drafter.config)
    with pytest.raises(ValueError, match="bind"):
        unbound.draft(torch.tensor([1]))
    with pytest.raises(ValueError, match="block_size"):
        DFlashConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                     intermediate_size=8, vocab_size=10, target_layer_ids=[0], mask_token_id=9, block_size=1)
    with pytest.raises(ValueError, match="mask_token_id"):
        DFlashConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                     intermediate_size=8, vocab_size=10, target_layer_ids=[0], mask_token_id=10)


def test_decoding_with_the_drafter_is_lossless(tiny_target, tiny_drafter):
    """A random drafter still gives the target's greedy output (every token is verified)."""
    import dartree
    from dartree.decode import SpeculativeDecoder

    prompt = torch.randint(0, 100, (1, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = tiny_target.generate(prompt, max_new_tokens=12, do_sample=False, min_new_tokens=12,
                                   pad_token_id=0, eos_token_id=None)[:, 7:]
    builder = dartree.make_builder("ddtree", backend="ref", budget=8, topk=4)
    out = SpeculativeDecoder(tiny_target, tiny_drafter, builder).generate(prompt, max_new_tokens=12)
    assert torch.equal(out.tokens, ref)
