"""The heads' fast paths against the formulations they replace: the GRU input-gate table against
torch's GRU cell, the gathered-row corrections against the einsum form, and the caches' invalidation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dartree import make_builder
from dartree.block import DraftBlock
from dartree.fast import ops
from dartree.models import heads as heads_module
from dartree.models.heads import GRUHead
from dartree.timing import TimedHead
from tests.models.conftest import HIDDEN, VOCAB
from tests.strategies import random_logits

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


# ------------------------------------------------------------------ prepare_block (issue 20)
def _prepared_variants(tiny_heads):
    gru, markov = tiny_heads
    plain = GRUHead(HIDDEN, VOCAB, 12, 16, prefix_len=0, bias=False, embedding=gru.embedding_weight)
    gated = GRUHead(HIDDEN, VOCAB, 12, 16, prefix_len=2, bias=False, bias_norm=True, bias_gate=True,
                    embedding=gru.embedding_weight)
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for head in (plain, gated):
            for p in head.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return {"gru": gru, "gru-bias-free": plain.eval(), "gru-norm-gate": gated.eval(), "markov": markov}


class Unprepared:
    """A head's protocol calls without its ``prepare_block``."""

    def __init__(self, head) -> None:
        self.head = head
        self.initial_state, self.logits, self.advance = head.initial_state, head.logits, head.advance
        self.advance_logits = head.advance_logits


@pytest.mark.parametrize("which", ["gru", "gru-bias-free", "gru-norm-gate", "markov"])
@pytest.mark.parametrize("m", [1, 5, 12])
@pytest.mark.parametrize("b", [3, 1])
def test_prepared_steps_are_the_protocol_calls_bit_for_bit(tiny_heads, which, m, b):
    """``prepare_block(block, C)``'s calls give the bits of ``logits`` / ``advance_logits`` with ``C[:, d - 1]``,
    at every depth (prefix depths included), for one and for many branches of one and of several rows."""
    head = _prepared_variants(tiny_heads)[which]
    block = make_block(b=b, gamma=6, seed=m)
    gen = torch.Generator().manual_seed(m)
    cands = torch.stack([torch.stack([torch.randperm(VOCAB, generator=gen)[:9] for _ in range(6)]) for _ in range(b)])
    with torch.inference_mode():
        steps = head.prepare_block(block, cands)
        states = head.initial_state(block)[:, None].expand(-1, m, -1).contiguous()
        assert torch.equal(steps.logits(1, states), head.logits(block, 1, states, cands[:, 0]))
        for depth in range(1, block.gamma):
            tokens = torch.randint(0, VOCAB, (b, m), generator=gen)
            new, logits = steps.advance_logits(depth, states, tokens)
            want_new, want = head.advance_logits(block, depth, states, tokens, cands[:, depth])
            assert torch.equal(new, want_new) and torch.equal(logits, want)
            assert torch.equal(steps.logits(depth + 1, new), head.logits(block, depth + 1, new, cands[:, depth]))
            states = new
        with pytest.raises(ValueError, match="depth"):
            steps.advance_logits(block.gamma, states, tokens)        # the last depth is never advanced


def test_prepare_block_refuses_bad_candidates_and_declines_under_autograd(tiny_heads):
    gru, markov = tiny_heads
    block = make_block(b=2, gamma=4)
    good = torch.zeros(2, 4, 3, dtype=torch.int64)
    for head in (gru, markov):
        for bad in (good[:, :3], good.float(), good[0], "tokens"):
            with pytest.raises(ValueError, match=r"candidates: expected an int64 tensor \[2, 4, K\]"):
                head.prepare_block(block, bad)
    with pytest.raises(ValueError, match="block.hidden"):
        gru.prepare_block(DraftBlock(logits=block.logits, root=block.root), good)
    assert gru.prepare_block(block, good) is None                       # grad on, weights trainable: None
    with torch.no_grad():
        assert gru.prepare_block(block, good) is not None


@pytest.mark.parametrize("kernels", ["host", "torch"])
@pytest.mark.parametrize("name", ["dartree-pruned", "dartree-fixed", "corrected-chain", "corrected-chain-ddtree"])
def test_builders_with_a_prepared_head_build_the_trees_of_the_protocol_calls(tiny_heads, name, kernels):
    """Every depth-wise fast builder (compiled host loop and torch twin) builds the same tree, scores bit
    for bit, whether the head prepares the block or answers the protocol calls."""
    cfg = {"topk": 6} | ({} if name == "corrected-chain" else {"budget": 14})
    cfg |= {"width": 4} if name == "dartree-pruned" else {}
    for which, head in _prepared_variants(tiny_heads).items():
        block = make_block(b=2, gamma=5, seed=len(which))
        with torch.inference_mode(), ops.force_backend(kernels):
            builder = make_builder(name, backend="fast", **cfg)
            timed = TimedHead(head)
            trees = [builder.build(block, h) for h in (head, Unprepared(head), timed)]
            cands = torch.zeros(block.batch_size, block.gamma, 2, dtype=torch.int64)
            assert head.prepare_block(block, cands) is not None, which    # the first build took the prepared path
        for tree in trees[1:]:
            assert tree.canonical() == trees[0].canonical() and torch.equal(tree.scores, trees[0].scores), which
        seconds, calls = timed.take()
        assert calls >= 2 and seconds > 0.0           # the prepared calls are timed and counted


def test_root_states_kept_per_token_are_the_computed_ones_and_follow_the_weights(tiny_heads):
    """A one-row block's root state comes from the per-token cache: the bits of the step itself, a copy
    the caller may edit, and recomputed after a weight is edited in place."""
    gru = _prepared_variants(tiny_heads)["gru-norm-gate"]
    one = make_block(b=1, gamma=4, seed=3)
    with torch.no_grad():
        first = gru.initial_state(one)
        assert torch.equal(first, gru._root_state(one))
        first.add_(1.0)                                                 # the caller's copy
        again = gru.initial_state(one)
        assert torch.equal(again, gru._root_state(one)) and not torch.equal(again, first)
        gru.prefix_gru.weight_hh_l0.mul_(0.5)
        gru.prefix_gru.bias_ih_l0.mul_(-1.0) if gru.bias else gru.prefix_gru.weight_ih_l0.mul_(-1.0)
        edited = gru.initial_state(one)
        assert torch.equal(edited, gru._root_state(one)) and not torch.equal(edited, again)
        three = make_block(b=3, gamma=4, seed=3)                        # more rows: computed, not cached
        assert torch.equal(gru.initial_state(three), gru._root_state(three))


@st.composite
def prepared_cases(draw):
    b, gamma = draw(st.integers(1, 3)), draw(st.integers(2, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    block = make_block(b=b, gamma=gamma, seed=seed)
    if draw(st.booleans()):                                             # ties in candidates and scores
        block = DraftBlock(logits=random_logits(seed, (b, gamma, VOCAB), True), root=block.root, hidden=block.hidden)
    name = draw(st.sampled_from(["dartree-pruned", "dartree-fixed", "corrected-chain"]))
    cfg = {"topk": draw(st.sampled_from([1, 3, 8]))}
    if name != "corrected-chain":
        cfg["budget"] = draw(st.sampled_from([1, 4, 16, 400]))
    if name == "dartree-pruned":
        cfg |= {"width": draw(st.sampled_from([1, 3, 12])), "beta": draw(st.sampled_from([0.0, -0.2]))}
    return block, name, cfg, draw(st.sampled_from(["gru", "gru-bias-free", "gru-norm-gate", "markov"])), \
        draw(st.sampled_from(["host", "torch"]))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # not mutated
@given(case=prepared_cases())
def test_prepared_and_protocol_calls_build_the_same_tree_on_random_blocks(tiny_heads, case):
    block, name, cfg, which, kernels = case
    head = _prepared_variants(tiny_heads)[which]
    with torch.inference_mode(), ops.force_backend(kernels):
        builder = make_builder(name, backend="fast", **cfg)
        got, want = builder.build(block, head), builder.build(block, Unprepared(head))
    assert got.canonical() == want.canonical() and torch.equal(got.scores, want.scores)


@pytest.mark.parametrize("which", ["gru", "gru-norm-gate"])
def test_block_terms_of_a_row_do_not_depend_on_its_batch(tiny_heads, which):
    """fc1's hidden half and the gate of a one-row block (one product, no unbind / stack) are the bits of
    the same row inside a three-row block and of the per-row product they stand for, cached or from the plan."""
    head = _prepared_variants(tiny_heads)[which]
    three = make_block(b=3, gamma=5, seed=4)
    fc1 = head.embed_proj[0]
    with torch.no_grad():
        part3, gate3 = head._block_terms(three, head._plan())
        cached = head._block_terms(three)
        assert torch.equal(cached[0], part3) and (gate3 is None or torch.equal(cached[1], gate3))
        for r in range(3):
            one = DraftBlock(logits=three.logits[r : r + 1], root=three.root[r : r + 1], hidden=three.hidden[r : r + 1])
            part1, gate1 = head._block_terms(one, head._plan())
            want = F.linear(three.hidden[r], fc1.weight[:, :HIDDEN], fc1.bias)
            assert part1.shape == (1, 5, 16) and torch.equal(part1[0], want) and torch.equal(part3[r], want)
            if head.bias_gate is None:
                assert gate1 is None and gate3 is None
            else:
                assert torch.equal(gate1[0], head._gate(three.hidden[r])) and torch.equal(gate3[r], gate1[0])
