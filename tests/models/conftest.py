"""Tiny random models shared by the drafter / head / loader tests (fixtures prefixed ``tiny_``)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from dartree.models.drafter import DFlashConfig, DFlashDrafter, dflash_target_layer_ids
from dartree.models.heads import GRUHead, MarkovHead

VOCAB, HIDDEN, TARGET_LAYERS = 111, 32, 5


def make_target(seed: int = 0) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=48, num_hidden_layers=TARGET_LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                         tie_word_embeddings=False, attn_implementation="sdpa")
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():  # sharp logits: greedy margins far above float noise (lossless tests)
        model.lm_head.weight.mul_(30.0)
    return model


def make_drafter(target: Qwen3ForCausalLM, block_size: int = 5, seed: int = 1) -> DFlashDrafter:
    torch.manual_seed(seed)
    config = DFlashConfig(hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=8, intermediate_size=40, vocab_size=VOCAB,
                          target_layer_ids=dflash_target_layer_ids(TARGET_LAYERS, 2), mask_token_id=VOCAB - 1,
                          block_size=block_size, num_target_layers=TARGET_LAYERS)
    drafter = DFlashDrafter(config, target=target)
    with torch.no_grad():  # norms away from 1 so that a wrong weight name would show
        for name, p in drafter.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return drafter.eval()


def make_heads(target: Qwen3ForCausalLM, seed: int = 2) -> tuple[GRUHead, MarkovHead]:
    torch.manual_seed(seed)
    gru = GRUHead(HIDDEN, VOCAB, gru_hidden_dim=12, emb_dim=16, embedding=target.get_input_embeddings().weight)
    markov = MarkovHead(VOCAB, markov_rank=6)
    with torch.no_grad():
        for p in list(gru.parameters()) + list(markov.parameters()):
            p.normal_(0.0, 0.5)
    return gru.eval(), markov.eval()


@pytest.fixture
def tiny_target() -> Qwen3ForCausalLM:
    return make_target()


@pytest.fixture
def tiny_drafter(tiny_target) -> DFlashDrafter:
    return make_drafter(tiny_target)


@pytest.fixture
def tiny_heads(tiny_target) -> tuple[GRUHead, MarkovHead]:
    return make_heads(tiny_target)


def target_hidden(target: Qwen3ForCausalLM, ids: torch.Tensor, layer_ids) -> torch.Tensor:
    """Concatenated hidden states of ``layer_ids`` for ``ids`` (one causal forward)."""
    with torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True)
    return torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)


@pytest.fixture
def tiny_hidden():
    return target_hidden
