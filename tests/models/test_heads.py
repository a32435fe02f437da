"""GRU (Domino) and Markov (DSpark) heads: protocol, batched == per-branch, candidate-only scoring."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from dartree.block import DraftBlock
from dartree.models.heads import GRUHead, MarkovHead
from dartree.protocols import CorrectionHead

B, GAMMA, V, H = 3, 4, 111, 32


def make_block(seed: int = 0) -> DraftBlock:
    g = torch.Generator().manual_seed(seed)
    return DraftBlock(logits=torch.randn(B, GAMMA, V, generator=g), root=torch.randint(0, V, (B,), generator=g),
                      hidden=torch.randn(B, GAMMA, H, generator=g))


def branch_inputs(head, block: DraftBlock, m: int, seed: int = 1):
    """States of m random branches at depth 2 (root + one token each), and K candidates at depth 3."""
    g = torch.Generator().manual_seed(seed)
    s0 = head.initial_state(block)                                       # [b, S]
    tokens = torch.randint(0, V, (B, m), generator=g)
    states = head.advance(block, 1, s0[:, None, :].expand(-1, m, -1).contiguous(), tokens)
    candidates = torch.stack([torch.randperm(V, generator=g)[:7] for _ in range(B)])
    return states, candidates


@pytest.mark.parametrize("which", ["gru", "markov"])
def test_protocol(tiny_heads, which):
    head = dict(zip(["gru", "markov"], tiny_heads, strict=True))[which]
    assert isinstance(head, CorrectionHead)


@pytest.mark.parametrize("which", ["gru", "markov"])
def test_batched_branches_equal_single_branches_and_sub_blocks(tiny_heads, which):
    head = dict(zip(["gru", "markov"], tiny_heads, strict=True))[which]
    block = make_block()
    states, candidates = branch_inputs(head, block, m=5)
    with torch.no_grad():
        batched = head.logits(block, 3, states, candidates)               # [b, m, K]
        assert batched.shape == (B, 5, 7) and batched.dtype == torch.float32
        nxt = torch.randint(0, V, (B, 5))
        advanced = head.advance(block, 3, states, nxt)
        for r in range(B):
            sub = block.rows(r)
            for j in range(5):
                one = head.logits(sub, 3, states[r : r + 1, j : j + 1], candidates[r : r + 1])
                assert_close(one[0, 0], batched[r, j], atol=1e-5, rtol=1e-5)
                adv = head.advance(sub, 3, states[r : r + 1, j : j + 1], nxt[r : r + 1, j : j + 1])
                assert_close(adv[0, 0], advanced[r, j], atol=1e-6, rtol=1e-6)
        rows = torch.tensor([2, 0])
        sub = head.logits(block.rows(rows), 3, states[rows], candidates[rows])
        assert_close(sub, batched[rows], atol=1e-5, rtol=1e-5)


def test_gru_logits_are_the_full_vocab_correction_at_the_candidates(tiny_heads):
    gru, _ = tiny_heads
    block = make_block()
    states, candidates = branch_inputs(gru, block, m=2)
    with torch.no_grad():
        got = gru.logits(block, 3, states, candidates)
        full = gru.full_logits(block.logits[:, 2:3].expand(-1, 2, -1), block.hidden[:, 2:3].expand(-1, 2, -1), states)
        assert_close(got, torch.gather(full, 2, candidates[:, None, :].expand(-1, 2, -1)), atol=1e-5, rtol=1e-5)
        # depth 1 (Domino's pure-draft prefix) is the base logits
        s0 = gru.initial_state(block)[:, None]
        assert torch.equal(gru.logits(block, 1, s0, candidates)[:, 0], torch.gather(block.logits[:, 0], 1, candidates))


def test_gru_steps_equal_the_sequence_gru(tiny_heads):
    """The stepwise state used by builders equals nn.GRU over [root, t1, t2] (the training path)."""
    gru, _ = tiny_heads
    block = make_block()
    path = torch.randint(0, V, (B, 2))
    with torch.no_grad():
        s = gru.initial_state(block)[:, None]
        for d in (1, 2):
            s = gru.advance(block, d, s, path[:, d - 1 : d])
        seq = torch.cat([block.root[:, None], path], dim=1)
        out, _ = gru.prefix_gru(F.embedding(seq, gru.embedding_weight))
    assert_close(s[:, 0], out[:, -1], atol=1e-5, rtol=1e-5)


def test_markov_bias_is_the_low_rank_bigram(tiny_heads):
    _, markov = tiny_heads
    block = make_block()
    cand = torch.arange(V)[None].expand(B, -1)
    with torch.no_grad():
        s0 = markov.initial_state(block)[:, None]
        got = markov.logits(block, 1, s0, cand)[:, 0]
        want = block.logits[:, 0] + markov.markov_w2(markov.markov_w1(block.root))
    assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(markov.advance(block, 1, s0, torch.tensor([[4], [5], [6]]))[..., 0],
                       torch.tensor([[4.0], [5.0], [6.0]]))


def test_bad_inputs(tiny_heads):
    gru, markov = tiny_heads
    block = make_block()
    states, candidates = branch_inputs(gru, block, m=2)
    with pytest.raises(ValueError, match="depth"):
        gru.logits(block, 0, states, candidates)
    with pytest.raises(ValueError, match="depth"):
        markov.advance(block, GAMMA + 1, torch.zeros(B, 2, 1), torch.zeros(B, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="states"):
        gru.logits(block, 2, states[..., :3], candidates)
    with pytest.raises(ValueError, match="candidates"):
        markov.logits(block, 2, torch.zeros(B, 2, 1), candidates.float())
    with pytest.raises(ValueError, match="tokens"):
        gru.advance(block, 2, states, torch.zeros(B, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="hidden"):
        gru.logits(DraftBlock(logits=block.logits, root=block.root), 2, states, candidates)
    with pytest.raises(ValueError, match="embedding"):
        GRUHead(H, V, 4, 4).initial_state(block)
    with pytest.raises(ValueError, match="markov_rank"):
        MarkovHead(V, 0)


def _variants(tiny_heads):
    gru, markov = tiny_heads
    torch.manual_seed(7)
    emb = gru.embedding_weight
    plain = GRUHead(H, V, 12, 16, prefix_len=0, bias=False, embedding=emb)
    gated = GRUHead(H, V, 12, 16, prefix_len=2, bias=False, bias_norm=True, bias_gate=True, embedding=emb)
    for head in (plain, gated):
        with torch.no_grad():
            for p in head.parameters():
                p.normal_(0.0, 0.5)
    return {"gru": gru, "gru-bias-free": plain.eval(), "gru-norm-gate": gated.eval(), "markov": markov}


@pytest.mark.parametrize("which", ["gru", "gru-bias-free", "gru-norm-gate", "markov"])
def test_advance_logits_is_bit_identical_to_the_two_calls(tiny_heads, which):
    head = _variants(tiny_heads)[which]
    block = make_block(3)
    states, candidates = branch_inputs(head, block, m=6)
    tokens = torch.randint(0, V, (B, 6))
    with torch.no_grad():
        for depth in range(1, GAMMA):               # includes prefix depths (uncorrected) of the gated head
            new, fused = head.advance_logits(block, depth, states, tokens, candidates)
            s = head.advance(block, depth, states, tokens)
            assert torch.equal(new, s) and torch.equal(fused, head.logits(block, depth + 1, s, candidates))
    with pytest.raises(ValueError, match="advance_logits"):
        head.advance_logits(block, GAMMA, states, tokens, candidates)     # the last depth is never advanced


@pytest.mark.parametrize("which", ["gru", "gru-bias-free", "gru-norm-gate", "markov"])
def test_vocab_logits_are_the_logits_of_every_token(tiny_heads, which):
    """What sampled trees propose from: ``logits`` with the whole vocabulary as candidates, at every depth
    (the gated head's prefix depths are the base logits), for a batch of branches and a sub-block."""
    head = _variants(tiny_heads)[which]
    block = make_block(4)
    states, _ = branch_inputs(head, block, m=3)
    every = torch.arange(V).expand(B, V)
    with torch.no_grad():
        for depth in range(1, GAMMA + 1):
            got = head.vocab_logits(block, depth, states)
            assert got.shape == (B, 3, V) and got.dtype == torch.float32
            assert_close(got, head.logits(block, depth, states, every), atol=1e-5, rtol=1e-5)
        sub = head.vocab_logits(block.rows(torch.tensor([2])), 2, states[2:3])
        assert_close(sub, head.vocab_logits(block, 2, states)[2:3], atol=1e-5, rtol=1e-5)
        with pytest.raises(ValueError, match="depth"):
            head.vocab_logits(block, GAMMA + 1, states)


@pytest.mark.parametrize("which", ["gru", "gru-bias-free", "gru-norm-gate"])
@pytest.mark.parametrize("mode", ["no_grad", "inference"])
def test_vocab_logits_from_the_plan_are_the_plain_path_bit_for_bit(tiny_heads, which, mode, monkeypatch):
    """The CPU fast path of ``vocab_logits`` (the plan's weights, a depth's fc1 term kept per block) gives the
    plain path's bits, for repeated depths, a sub-block, another block and the block edited in place."""
    head = _variants(tiny_heads)[which]
    block, other = make_block(4), make_block(5)
    states, _ = branch_inputs(head, block, m=3)
    context = torch.no_grad if mode == "no_grad" else torch.inference_mode
    with context():
        assert head._plan() is not None                 # the fast path is the one tested
        asked = [(block, d) for d in (1, 2, 3, 2, GAMMA, 3)] + [(block.rows(torch.tensor([1])), 2), (other, 3)]
        fast = [head.vocab_logits(b, d, states[: b.batch_size]) for b, d in asked]
        block.hidden.mul_(2.0)
        fast.append(head.vocab_logits(block, 3, states))
        with monkeypatch.context() as patch:
            patch.setattr(head, "_plan", lambda: None)
            block.hidden.div_(2.0)
            plain = [head.vocab_logits(b, d, states[: b.batch_size]) for b, d in asked]
            block.hidden.mul_(2.0)
            plain.append(head.vocab_logits(block, 3, states))
    for got, want in zip(fast, plain, strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("which", ["gru", "gru-bias-free", "gru-norm-gate"])
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_gru_step_from_the_plan_is_the_plain_step_bit_for_bit(tiny_heads, which, rows):
    """Without autograd the GRU step takes its gate table and W_hh^T (or its K-major copy) from the plan: the
    bits of the gate table's GRU-cell arithmetic written out op by op with ``F.linear``."""
    head = _variants(tiny_heads)[which]
    torch.manual_seed(rows)
    states, tokens = torch.randn(rows, head.gru_hidden_dim), torch.randint(0, V, (rows,))
    with torch.inference_mode():
        assert head._plan() is not None
        assert torch.equal(head.gru_step(tokens, states), previous_gru_step(head, tokens, states))


def test_depth_terms_follow_the_block_and_in_place_edits(tiny_heads):
    """The per-depth cache never serves a stale value: another block, or the same one edited in place."""
    head = _variants(tiny_heads)["gru-norm-gate"]
    block = make_block(4)
    states, candidates = branch_inputs(head, block, m=3)
    with torch.no_grad():
        first = head.logits(block, 3, states, candidates)
        other = make_block(5)
        fresh = GRUHead(H, V, 12, 16, prefix_len=2, bias=False, bias_norm=True, bias_gate=True,
                        embedding=head.embedding_weight)
        fresh.load_state_dict(head.state_dict())
        assert torch.equal(head.logits(other, 3, states, candidates), fresh.logits(other, 3, states, candidates))
        block.hidden.mul_(2.0)
        assert torch.equal(head.logits(block, 3, states, candidates), fresh.logits(block, 3, states, candidates))
        assert not torch.equal(head.logits(block, 3, states, candidates), first)


def test_gate_and_norm_change_the_correction_as_specified(tiny_heads):
    """corrected = base + sigmoid(gate(H_d)) * W2 silu(W1 [H_d; rmsnorm(state)]), written out here."""
    head = _variants(tiny_heads)["gru-norm-gate"]
    block = make_block(6)
    states, _ = branch_inputs(head, block, m=2)
    everything = torch.arange(V)[None].expand(B, -1)
    with torch.no_grad():
        got = head.logits(block, 3, states, everything)
        z = block.hidden[:, 2][:, None].expand(-1, 2, -1)
        s = states * torch.rsqrt(states.pow(2).mean(-1, keepdim=True) + 1e-6) * head.bias_norm.weight
        w1, w2 = head.embed_proj[0].weight, head.embed_proj[2].weight
        g0, g2 = head.bias_gate[0].weight, head.bias_gate[2]
        gate = torch.sigmoid(F.silu(z @ g0.T) @ g2.weight.T + g2.bias)
        want = block.logits[:, 2][:, None] + gate * (F.silu(torch.cat([z, s], -1) @ w1.T) @ w2.T)
        assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert torch.equal(head.logits(block, 2, states, everything)[:, 0], block.logits[:, 1])   # prefix depth


# ---------------------------------------------------------------- the lean steps against the previous ones
def previous_gru_step(head: GRUHead, tokens: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """The GRU step before the reused buffers (commit 449f525): the gate table, then torch's GRU-cell
    arithmetic op by op, each intermediate a fresh tensor."""
    g, size = head.prefix_gru, head.gru_hidden_dim
    flat_h = states.reshape(-1, size)
    gi = F.embedding(tokens.reshape(-1), head._gate_table(states.dtype))
    gh = F.linear(flat_h, g.weight_hh_l0, g.bias_hh_l0 if head.bias else None)
    rz = gh[:, : 2 * size].add_(gi[:, : 2 * size]).sigmoid_()
    new = gi[:, 2 * size :].add(gh[:, 2 * size :].mul_(rz[:, :size])).tanh_()
    return (flat_h - new).mul_(rz[:, size:]).add_(new).view(states.shape)


def previous_gru_logits(head: GRUHead, block: DraftBlock, depth: int, states: torch.Tensor, cand: torch.Tensor):
    """The corrected logits before the in-place accumulation (commit 449f525), with fc1's hidden half
    (and the gate) taken from one product per batch row over all its depths (issue 20; before, one
    product per depth over the batch: the same sums, a different matmul kernel's rounding)."""
    base = torch.gather(block.logits[:, depth - 1], 1, cand)[:, None, :]
    if depth <= head.prefix_len:
        return base.expand(-1, states.shape[1], -1).contiguous()
    fc1, fc2 = head.embed_proj[0], head.embed_proj[2]
    w_h, w_s = fc1.weight[:, :H], fc1.weight[:, H:].contiguous()
    part = torch.stack([F.linear(row, w_h, fc1.bias)[depth - 1] for row in block.hidden])[:, None, :]
    mid = F.silu(part + F.linear(head._normed(states), w_s))
    if head.bias:
        rows = F.embedding(cand, torch.cat([fc2.weight, fc2.bias[:, None]], dim=1))
        correction = torch.bmm(mid, rows[..., :-1].transpose(1, 2)) + rows[..., -1][:, None, :]
    else:
        correction = torch.bmm(mid, F.embedding(cand, fc2.weight).transpose(1, 2))
    if head.bias_gate is not None:
        gate = torch.stack([torch.sigmoid(head.bias_gate(row))[depth - 1] for row in block.hidden])
        correction = gate[:, :, None] * correction
    return base + correction


def previous_markov_logits(head: MarkovHead, block: DraftBlock, depth: int, previous: torch.Tensor, cand):
    u = F.embedding(previous, head.markov_w1.weight)
    bias = torch.bmm(u, F.embedding(cand, head.markov_w2.weight).transpose(1, 2))
    return torch.gather(block.logits[:, depth - 1], 1, cand)[:, None, :] + bias


@pytest.mark.parametrize("which", ["gru", "gru-bias-free", "gru-norm-gate", "markov"])
@pytest.mark.parametrize("m", [1, 5, 12])
@pytest.mark.parametrize("rows", [B, 1])
def test_lean_steps_are_bit_identical_to_the_previous_formulation(tiny_heads, which, m, rows):
    """fp32: the reused-buffer GRU step, the in-place correction sums and the Markov bias give exactly
    the previous implementation's bits (same ops, same operands, additions commuted only; one state,
    ``rows == m == 1``: matrix-vector products, ``addmv`` / ``baddbmm`` for a matmul and its sum)."""
    head = _variants(tiny_heads)[which]
    block = make_block(7)
    states, candidates = branch_inputs(head, block, m=m, seed=m)
    tokens = torch.randint(0, V, (B, m), generator=torch.Generator().manual_seed(m))
    if rows == 1:                           # the second row as a one-row block
        block, states, candidates, tokens = block.rows(torch.tensor([1])), states[1:2], candidates[1:2], tokens[1:2]
    with torch.no_grad():
        for depth in range(1, GAMMA):
            new, fused = head.advance_logits(block, depth, states, tokens, candidates)
            if which == "markov":
                assert torch.equal(new[..., 0], tokens.float())
                want = previous_markov_logits(head, block, depth + 1, tokens, candidates)
            else:
                assert torch.equal(new, previous_gru_step(head, tokens, states))
                want = previous_gru_logits(head, block, depth + 1, new, candidates)
            assert torch.equal(fused, want)
            states = new
        if which != "markov":
            root = head.initial_state(block)
            assert torch.equal(root, previous_gru_step(head, block.root, torch.zeros_like(root)))


def test_gru_step_buffers_never_alias_a_returned_state(tiny_heads):
    """The step's intermediates are reused across calls; the states it returns are not."""
    head = tiny_heads[0]
    block = make_block(8)
    states, _ = branch_inputs(head, block, m=4)
    tokens = torch.randint(0, V, (B, 4), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        first = head.advance(block, 2, states, tokens)
        kept = first.clone()
        second = head.advance(block, 3, first, tokens.flip(1))
        third = head.advance(block, 3, first, tokens.flip(1))
    assert torch.equal(first, kept) and torch.equal(second, third)
    assert first.data_ptr() != second.data_ptr() != third.data_ptr()


def test_gru_step_under_autograd_is_the_gru_cell(tiny_heads):
    """States that need gradients take the differentiable path (torch's GRU cell), same values."""
    head = tiny_heads[0]
    block = make_block(9)
    states, _ = branch_inputs(head, block, m=3)
    tokens = torch.randint(0, V, (B, 3), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = head.advance(block, 2, states, tokens)
    leaf = states.detach().clone().requires_grad_(True)
    got = head.advance(block, 2, leaf, tokens)
    got.sum().backward()
    assert leaf.grad is not None and leaf.grad.abs().sum() > 0
    assert_close(got.detach(), want, atol=1e-6, rtol=1e-5)


def test_gru_step_buffers_work_across_inference_mode_and_no_grad(tiny_heads):
    """Buffers first allocated under torch.inference_mode are reused outside it (and the reverse)."""
    head = tiny_heads[0]
    block = make_block(10)
    g = torch.Generator().manual_seed(2)
    for rows in (5, 7):
        states = torch.randn(B, rows, head.gru_hidden_dim, generator=g)
        tokens = torch.randint(0, V, (B, rows), generator=g)
        first, second = (torch.inference_mode, torch.no_grad) if rows == 5 else (torch.no_grad, torch.inference_mode)
        with first():
            a = head.advance(block, 1, states, tokens)
        with second():
            b = head.advance(block, 1, states, tokens)
        assert torch.equal(a, b)


def test_the_zoo_heads_copy_and_pickle_after_a_decode():
    """After a decode a head holds derived caches (prepared plans, gate tables, step buffers); deepcopy and
    pickle still work and the copies decode the same tokens."""
    import copy
    import pickle

    from dartree import SpeculativeDecoder, make_builder
    from dartree.models import zoo

    bundle = zoo.load(zoo.DEFAULT_NAME)
    prompt = torch.tensor([5, 6, 7, 8])
    for name in ("gru", "markov"):
        builder = make_builder("dartree-pruned", backend="fast", budget=16)
        want = SpeculativeDecoder(bundle.target, bundle.drafter, builder, bundle.heads[name]).generate(prompt, 12)
        for head in (copy.deepcopy(bundle.heads[name]), pickle.loads(pickle.dumps(bundle.heads[name]))):
            got = SpeculativeDecoder(bundle.target, bundle.drafter, builder, head).generate(prompt, 12)
            assert got.tokens.tolist() == want.tokens.tolist()
