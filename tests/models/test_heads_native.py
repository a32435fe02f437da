"""The compiled GRU step (``dartree._native.gru_step``, :class:`dartree.models.heads._NativeSteps`) against
torch's ops bit for bit, its first-call check, and where it is declined."""

from __future__ import annotations

import contextlib

import pytest
import torch

from dartree import make_builder, native
from dartree.block import DraftBlock
from dartree.models import heads as heads_module
from dartree.models.heads import GRUHead

VOCAB, HIDDEN = 211, 48

needs_native = pytest.mark.skipif(heads_module._native_gru() is None,
                                  reason="the compiled GRU step needs dartree._native and an AVX-512 torch build")


def make_head(g: int = 32, e: int = 16, bias: bool = True, prefix_len: int = 1, seed: int = 0, **kw) -> GRUHead:
    gen = torch.Generator().manual_seed(seed)
    head = GRUHead(HIDDEN, VOCAB, g, e, prefix_len=prefix_len, bias=bias,
                   embedding=torch.randn(VOCAB, HIDDEN, generator=gen), **kw)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.4)
    return head.eval()


def make_block(b: int = 1, gamma: int = 6, seed: int = 0) -> DraftBlock:
    gen = torch.Generator().manual_seed(seed)
    return DraftBlock(logits=torch.randn(b, gamma, VOCAB, generator=gen) * 3,
                      root=torch.randint(0, VOCAB, (b,), generator=gen),
                      hidden=torch.randn(b, gamma, HIDDEN, generator=gen))


def candidates(b: int, gamma: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.stack([torch.randperm(VOCAB, generator=gen)[:k] for _ in range(gamma)])
                        for _ in range(b)])


@needs_native
@pytest.mark.parametrize("g, e, bias, prefix_len", [(32, 16, True, 1), (48, 32, False, 0), (16, 64, True, 2)])
@pytest.mark.parametrize("k", [1, 3, 20])
def test_the_compiled_step_is_torchs_bit_for_bit(g, e, bias, prefix_len, k):
    """States and logits of every depth, for row counts on both sides of the K-major switches
    (``hh_from`` / ``s_from``: a transposed and a K-major weight operand), with and without biases."""
    head = make_head(g, e, bias, prefix_len, seed=g + e + k)
    block = make_block(gamma=6, seed=k)
    cands = candidates(1, 6, k, seed=k)
    gen = torch.Generator().manual_seed(k)
    with torch.inference_mode():
        steps = head.prepare_block(block, cands)
        assert steps.native is not None
        compared = 0
        for n in (1, 2, 7, 33, 70):
            for depth in range(1, block.gamma):
                if not steps.compiled(depth, n, k):
                    assert depth < prefix_len or n * k * e < 400
                    continue
                states = torch.randn(1, n, g, generator=gen) * 2
                tokens = torch.randint(0, VOCAB, (1, n), generator=gen)
                flat = states.reshape(-1, g)
                mine = steps._native_step(steps.native, depth, states, flat, tokens, n, k)
                ref = steps._torch_step(depth, states, flat, tokens, n)
                for a, b in zip(mine, ref, strict=True):
                    assert a.shape == b.shape and torch.equal(a, b), (n, depth)
                compared += 1
        assert compared >= 2 * (block.gamma - max(prefix_len, 1))         # n = 33 and 70 at least


@needs_native
def test_the_first_call_of_a_shape_is_checked_then_compiled(monkeypatch):
    """A shape's first call runs both and keeps the compiled call after equal bits; a compiled call that
    differs warns, is never used again for that shape, and torch's result is what the caller gets."""
    head = make_head(e=32)                                             # 3 x 5 x 32 products: MKL's bmm
    block = make_block()
    cands = candidates(1, 6, 5, seed=1)
    calls = []
    real = heads_module._native_gru()

    class Spy:
        def __getattr__(self, name):
            return getattr(real, name)

        def gru_step(self, *args):
            calls.append(args[20])
            status = real.gru_step(*args)
            if args[20] == 4:                                          # the logits of 4 rows: one bit off
                logits = args[19]
                logits.view("int32")[0, 0] ^= 1
            return status

    with torch.inference_mode():
        steps = head.prepare_block(block, cands)
        monkeypatch.setattr(steps.native, "lib", Spy())
        steps.native.verdicts.clear()
        states = head.initial_state(block)[:, None].expand(-1, 3, -1).contiguous()
        tokens = cands[:, 0, :3]
        first = steps.advance_logits(1, states, tokens)
        again = steps.advance_logits(1, states, tokens)
        want = head.advance_logits(block, 1, states, tokens, cands[:, 1])
        assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(first, again, want, strict=True))
        assert calls == [3, 3] and steps.native.verdicts[(3, 5)] is True
        wide = head.initial_state(block)[:, None].expand(-1, 4, -1).contiguous()
        with pytest.warns(RuntimeWarning, match="differs from torch's ops for 4 rows and 5 candidates"):
            got = steps.advance_logits(1, wide, cands[:, 0, :4])
        assert steps.native.verdicts[(4, 5)] is False
        got_again = steps.advance_logits(1, wide, cands[:, 0, :4])
        want = head.advance_logits(block, 1, wide, cands[:, 0, :4], cands[:, 1])
        assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(got, got_again, want, strict=True))
        assert calls == [3, 3, 4]                                      # refused: never called again for 4 rows


@needs_native
def test_bad_tokens_and_bad_sizes_are_refused():
    head = make_head(e=64)
    block = make_block()
    cands = candidates(1, 6, 5, seed=2)
    with torch.inference_mode():
        steps = head.prepare_block(block, cands)
        states = head.initial_state(block)[:, None].expand(-1, 2, -1).contiguous()
        steps.native.verdicts[(2, 5)] = True
        with pytest.raises(ValueError, match=rf"tokens: ids must be in \[0, {VOCAB}\)"):
            steps.advance_logits(1, states, torch.tensor([[0, VOCAB]]))
        with pytest.raises(ValueError, match=rf"tokens: ids must be in \[0, {VOCAB}\)"):
            steps.advance_logits(1, states, torch.tensor([[-1, 0]]))
    lib = heads_module._native_gru()
    with pytest.raises(TypeError, match="expected 25 arguments"):
        lib.gru_step(1, 2)
    args = [None] * 25
    args[4] = args[10] = 0
    args[15], args[20], args[21], args[22], args[23], args[24] = 16, 1, 24, 16, 1, VOCAB    # g = 24
    with pytest.raises(ValueError, match="multiples of 16"):
        lib.gru_step(*args)


def test_the_compiled_step_is_declined_where_it_does_not_apply():
    """Several rows, widths that are not whole SLEEF vectors, a bias norm or a gate: torch's ops, and the
    same values as the protocol calls."""
    block = make_block(b=2, seed=3)
    cands = candidates(2, 6, 4, seed=3)
    one = make_block(b=1, seed=3)
    cases = [(make_head(), block, False), (make_head(g=24), one, False), (make_head(e=24), one, False),
             (make_head(bias_norm=True), one, False), (make_head(bias_gate=True), one, False),
             (make_head(), one, True)]                                   # the extension turned off
    with torch.inference_mode():
        for head, blk, off in cases:
            c = cands[: blk.batch_size]
            with native.disabled() if off else contextlib.nullcontext():
                steps = head.prepare_block(blk, c)
            assert steps.native is None
            states = head.initial_state(blk)[:, None].expand(-1, 3, -1).contiguous()
            tokens = c[:, 0, :3]
            got = steps.advance_logits(1, states, tokens)
            want = head.advance_logits(blk, 1, states, tokens, c[:, 1])
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@needs_native
@pytest.mark.parametrize("seed", range(6))
def test_dartree_pruned_builds_the_same_tree_with_the_compiled_step(seed, monkeypatch):
    """The whole build, compiled steps or torch's ops: the same nodes, order and score bits."""
    head = make_head(g=32, e=32, seed=seed)
    block = make_block(gamma=8, seed=seed)
    builder = make_builder("dartree-pruned", backend="fast", budget=12, width=4 + seed, topk=6)
    with torch.inference_mode():
        got = builder.build(block, head)
        native = head._plan().native
        assert native is not None and any(native.verdicts.values())
        head.__dict__.pop("_plan_cache")                                # the next build plans again, without it
        monkeypatch.setattr(heads_module._NativeSteps, "of", classmethod(lambda cls, h, p: None))
        want = builder.build(block, head)
        assert head._plan().native is None
    assert got.canonical() == want.canonical() and torch.equal(got.scores, want.scores)
