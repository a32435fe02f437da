"""The heads' fast paths against the formulations they replace: the GRU input-gate table against
torch's GRU cell, the gathered-row corrections against the einsum form, and the caches' invalidation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dartree.block import DraftBlock
from dartree.models import heads as heads_module
from dartree.models.heads import GRUHead
from tests.models.conftest import HIDDEN, VOCAB

TOL = {"atol": 1e-6, "rtol": 1e-5}


def gru_cell_step(head: GRUHead, tokens: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """The step as torch computes it: embedding, then ``torch._VF.gru_cell`` (no table)."""
    g = head.prefix_gru
    x = F.embedding(tokens, head.embedding_weight).reshape(-1, HIDDEN)
    h = torch._VF.gru_cell(x, states.reshape(-1, states.shape[-1]), g.weight_ih_l0, g.weight_hh_l0,
                           g.bias_ih_l0 if head.bias else None, g.bias_hh_l0 if head.bias else None)
    return h.view(states.shape)


def einsum_logits(head: GRUHead, block: DraftBlock, depth: int, states: torch.Tensor, cand: torch.Tensor):
    """The corrected logits written with einsum over the gathered rows (the previous formulation)."""
    fc1, fc2 = head.embed_proj[0], head.embed_proj[2]
    h_d = block.hidden[:, depth - 1][:, None, :]
    s = states if head.bias_norm is None else head.bias_norm(states)
    mid = F.silu(F.linear(h_d, fc1.weight[:, :HIDDEN], fc1.bias) + F.linear(s, fc1.weight[:, HIDDEN:]))
    correction = torch.einsum("bme,bke->bmk", mid, fc2.weight[cand])
    if head.bias:
        correction = correction + fc2.bias[cand][:, None, :]
    if head.bias_gate is not None:
        correction = torch.sigmoid(head.bias_gate(h_d)) * correction
    return torch.gather(block.logits[:, depth - 1], 1, cand)[:, None, :] + correction


def make_block(b: int = 2, gamma: int = 4, seed: int = 0) -> DraftBlock:
    gen = torch.Generator().manual_seed(seed)
    return DraftBlock(logits=torch.randn(b, gamma, VOCAB, generator=gen),
                      root=torch.randint(0, VOCAB, (b,), generator=gen),
                      hidden=torch.randn(b, gamma, HIDDEN, generator=gen))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("m", [1, 5])
def test_gate_table_step_equals_the_gru_cell(tiny_heads, bias, m):
    gru = tiny_heads[0]
    head = GRUHead(HIDDEN, VOCAB, 12, 16, bias=bias, embedding=gru.embedding_weight)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0.0, 0.5)
        tokens = torch.randint(0, VOCAB, (3, m))
        states = torch.randn(3, m, 12)
        assert head._gate_table(torch.float32) is not None
        torch.testing.assert_close(head.gru_step(tokens, states), gru_cell_step(head, tokens, states), **TOL)
        head.prefix_gru.weight_ih_l0.mul_(-1.0)                      # in place: the table is rebuilt
        torch.testing.assert_close(head.gru_step(tokens, states), gru_cell_step(head, tokens, states), **TOL)


def test_without_the_table_the_step_is_the_gru_cell(tiny_heads, monkeypatch):
    gru = tiny_heads[0]
    monkeypatch.setattr(heads_module, "GATE_TABLE_LIMIT", 0)
    tokens, states = torch.randint(0, VOCAB, (2, 3)), torch.randn(2, 3, 12)
    with torch.no_grad():
        assert gru._gate_table(torch.float32) is None
        assert torch.equal(gru.gru_step(tokens, states), gru_cell_step(gru, tokens, states))


@pytest.mark.parametrize("bias, norm, gate", [(True, False, False), (False, True, True)])
def test_gathered_rows_equal_the_einsum_form(tiny_heads, bias, norm, gate):
    gru = tiny_heads[0]
    head = GRUHead(HIDDEN, VOCAB, 12, 16, prefix_len=1, bias=bias, bias_norm=norm, bias_gate=gate,
                   embedding=gru.embedding_weight)
    block = make_block()
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0.0, 0.5)
        states, cand = torch.randn(2, 4, 12), torch.randint(0, VOCAB, (2, 6))
        for depth in (2, 4):
            torch.testing.assert_close(head.logits(block, depth, states, cand),
                                       einsum_logits(head, block, depth, states, cand), **TOL)
        head.embed_proj[2].weight.mul_(2.0)                          # in place: the row table is rebuilt
        torch.testing.assert_close(head.logits(block, 3, states, cand),
                                   einsum_logits(head, block, 3, states, cand), **TOL)


def test_logits_stay_differentiable_under_autograd(tiny_heads):
    gru = tiny_heads[0]
    head = GRUHead(HIDDEN, VOCAB, 12, 16, prefix_len=1, embedding=gru.embedding_weight.detach())
    block = make_block()
    with torch.no_grad():
        head.logits(block, 2, torch.randn(2, 3, 12), torch.randint(0, VOCAB, (2, 5)))    # fills the caches
    head.logits(block, 2, torch.randn(2, 3, 12), torch.randint(0, VOCAB, (2, 5))).sum().backward()
    assert head.embed_proj[0].weight.grad is not None and head.embed_proj[2].weight.grad is not None
    assert head.embed_proj[2].bias.grad is not None
