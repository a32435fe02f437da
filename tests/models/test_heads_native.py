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
                                  reason="the compiled GRU step needs dartree._native and AVX-512 or AVX2 torch")


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


# ----------------------------------------------------------------- the compiled depth loop and whole build
class Paths:
    """Which compiled calls the builds may use, counted as they run: ``build`` (the whole build,
    ``GRUHead.native_build``), ``loop`` (the depth loop, ``_GRUSteps.native_loop``); with neither, the
    builder's per-depth calls (still the compiled steps)."""

    def __init__(self, monkeypatch) -> None:
        self.runs = {"build": 0, "loop": 0}
        self.calls = 0                                                  # gru_build calls, raising or not
        self.allowed = {"build", "loop"}
        build, native_loop, run = GRUHead.native_build, heads_module._GRUSteps.native_loop, heads_module._NativeLoop.run
        whole = heads_module._NativeBuild.run.__func__

        def whole_run(cls, *args):
            self.calls += 1
            return whole(cls, *args)

        def native_build(head, *args):
            out = build(head, *args) if "build" in self.allowed else None
            self.runs["build"] += out is not None
            return out

        def loop(steps, widths):
            return native_loop(steps, widths) if "loop" in self.allowed else None

        def loop_run(self_, *args):
            self.runs["loop"] += 1
            return run(self_, *args)

        monkeypatch.setattr(GRUHead, "native_build", native_build)
        monkeypatch.setattr(heads_module._GRUSteps, "native_loop", loop)
        monkeypatch.setattr(heads_module._NativeLoop, "run", loop_run)
        monkeypatch.setattr(heads_module._NativeBuild, "run", classmethod(whole_run))

    @contextlib.contextmanager
    def only(self, *names):
        previous, self.allowed = self.allowed, set(names)
        try:
            yield
        finally:
            self.allowed = previous


def _same_tree(a, b) -> bool:
    fields = ("tokens", "parents", "depths", "ranks", "num_nodes")
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in fields) \
        and torch.equal(a.scores.view(torch.int32), b.scores.view(torch.int32))


LOOP_CASES = [
    ("dartree-pruned", dict(budget=12, width=4, topk=6)),
    ("dartree-pruned", dict(budget=12, width=4, topk=6, bound=False)),
    ("dartree-pruned", dict(budget=20, width=9, topk=5, beta=0.0)),     # W > K: depth 1 keeps K
    ("dartree-pruned", dict(budget=8, width=1, topk=16)),               # 1 x 16 x 32 products: MKL's bmm
    ("dartree-pruned", dict(budget=30, width=6, topk=6, normalize="vocab")),
    ("dartree-fixed", dict(budget=16, topk=8)),
    ("corrected-chain", dict(topk=16)),
]


def _build_all_ways(paths, builder, block, head, timed):
    """(tree, expansion, head calls) by every path: whole build, loop, per-depth calls; and torch's ops' tree."""
    from dartree.fast import expansion

    out = {}
    for way, allowed in (("build", ("build", "loop")), ("loop", ("loop",)), ("depth", ())):
        with paths.only(*allowed):
            tree = builder.build(block, timed)
            out[way] = (tree, expansion.last(), timed.take_calls(), timed.take())
    with native.disabled():
        out["torch"] = (builder.build(block, head), None, 0, 0.0)
    return out


@needs_native
@pytest.mark.parametrize("name, fields", LOOP_CASES)
@pytest.mark.parametrize("prefix_len", [0, 1])
def test_the_compiled_build_and_loop_give_the_trees_of_the_calls_per_depth(name, fields, prefix_len, monkeypatch):
    """``gru_build`` (one C call per build) and ``gru_expand`` (one per depth loop) against the builder's own
    calls with the same compiled steps and against torch's ops: the same nodes, order and score bits, the
    same expansion record, and the same head calls counted by the decoder's proxy, which also gets the time
    of the compiled steps.  The first build of a head checks its step shapes (the loop runs); the whole
    build takes over from the second, where the first depth is not corrected (prefix_len 1)."""
    from dartree.timing import timed_head

    paths = Paths(monkeypatch)
    builder = make_builder(name, backend="fast", **fields)
    for seed in range(4):
        head = make_head(g=32, e=32, prefix_len=prefix_len, seed=seed)
        block = make_block(gamma=7, seed=seed)
        timed = timed_head(head)
        with torch.inference_mode():
            builder.build(block, timed)                                 # checks the shapes
            timed.take_calls()
            got = _build_all_ways(paths, builder, block, head, timed)
        want, want_expansion, want_calls, _ = got["depth"]
        for way in ("build", "loop", "torch"):
            assert _same_tree(got[way][0], want), (seed, way)
        for way in ("build", "loop"):
            assert got[way][1] == want_expansion and got[way][2] == want_calls and got[way][3] > 0, (seed, way)
    assert paths.runs == {"build": 4 if prefix_len == 1 else 0, "loop": 8 if prefix_len == 1 else 12}


@needs_native
def test_the_compiled_build_and_loop_stop_where_the_bound_stops(monkeypatch):
    """With the bound, they expand the depths the per-depth loop expands, no more (a deep block, a small
    budget)."""
    from dartree.timing import timed_head

    paths = Paths(monkeypatch)
    head = make_head(g=32, e=32, seed=7)
    block = make_block(gamma=12, seed=7)
    builder = make_builder("dartree-pruned", backend="fast", budget=4, width=4, topk=4)
    with torch.inference_mode():
        builder.build(block, head)
        got = _build_all_ways(paths, builder, block, head, timed_head(head))
    assert got["depth"][1].depths_saved > 0
    assert all(got[way][1] == got["depth"][1] and _same_tree(got[way][0], got["depth"][0]) for way in ("build", "loop"))
    assert paths.runs == {"build": 1, "loop": 2}


@needs_native
def test_the_compiled_build_and_loop_are_declined_where_a_step_would_not_be_compiled(monkeypatch):
    """A width whose compiled step differs from torch's (the verdict), an uncorrected second depth
    (prefix_len 2), two sequences, the chain of corrected-chain-ddtree (it traces log q) and a user's
    subclass behind the decoder's proxy: the builder's calls, and the same tree as torch's ops."""
    from dartree.timing import timed_head

    class Mine(GRUHead):
        pass

    paths = Paths(monkeypatch)
    pruned = make_builder("dartree-pruned", backend="fast", budget=12, width=4, topk=6)
    one, two = make_block(gamma=6, seed=5), make_block(b=2, gamma=6, seed=5)
    flagged = make_head(g=32, e=32, seed=5)
    with torch.inference_mode():
        flagged._plan().native.verdicts[(4, 6)] = False
    mine = make_head(g=32, e=32, seed=5)
    mine.__class__ = Mine
    cases = [(pruned, flagged, one), (pruned, make_head(g=32, e=32, prefix_len=2, seed=5), one),
             (pruned, make_head(g=32, e=32, seed=5), two),
             (make_builder("corrected-chain-ddtree", backend="fast", budget=12, topk=6), make_head(g=32, e=32), one),
             (pruned, timed_head(mine), one)]
    for builder, head, block in cases:
        with torch.inference_mode():
            got = [builder.build(block, head) for _ in range(2)]           # the second would be a whole build
            with native.disabled():
                want = builder.build(block, getattr(head, "head", head))
        assert all(_same_tree(tree, want) for tree in got)
    assert paths.runs == {"build": 0, "loop": 0}


@needs_native
def test_the_fc1_product_of_the_whole_build_is_checked_against_torchs(monkeypatch):
    """The first whole build of a gamma compares its fc1 product with torch's: equal, it is kept; one bit
    off (a corrupted call), a warning, the builder's calls for that gamma from then on, and their tree."""
    paths = Paths(monkeypatch)
    head = make_head(g=32, e=32, seed=4)
    builder = make_builder("dartree-pruned", backend="fast", budget=12, width=4, topk=6)
    short, deep = make_block(gamma=6, seed=4), make_block(gamma=8, seed=4)
    real = heads_module._native_gru()

    class Spy:
        def __getattr__(self, name):
            return getattr(real, name)

        def gru_build(self, *args):
            out = real.gru_build(*args)
            if args[1] == 8:
                args[31].view("int32")[0, 0] ^= 1
            return out

    with torch.inference_mode():
        builder.build(short, head)                                      # the step shapes checked
        monkeypatch.setattr(head._plan().native, "lib", Spy())
        builder.build(short, head)
        assert head._plan().native.verdicts[("fc1", 6)] is True and paths.runs["build"] == 1
        with pytest.warns(RuntimeWarning, match="compiled fc1 product differs from torch's for 8 depths"):
            got = builder.build(deep, head)
        assert head._plan().native.verdicts[("fc1", 8)] is False
        again = builder.build(deep, head)
        with native.disabled():
            want = builder.build(deep, head)
    assert paths.runs["build"] == 1 and _same_tree(got, want) and _same_tree(again, want)


@needs_native
@pytest.mark.parametrize("bad", ["head nan", "block nan", "few finite"])
def test_bad_values_in_the_compiled_build_are_the_builders_errors(bad, monkeypatch):
    """NaN corrected logits (the output rows poisoned after the shapes were checked), a NaN block logit and
    a depth with fewer than K finite logits: the whole build raises what the builder's calls raise."""
    paths = Paths(monkeypatch)
    head = make_head(g=32, e=32, seed=3)
    block = make_block(gamma=6, seed=3)
    builder = make_builder("dartree-pruned", backend="fast", budget=12, width=4, topk=6)
    with torch.inference_mode():
        builder.build(block, head)                                      # shapes checked
        if bad == "head nan":
            head._plan().rows_table.fill_(float("nan"))
        elif bad == "block nan":
            block.logits[0, 2, 5] = float("nan")
        else:
            block.logits[0, 3, 4:] = float("-inf")
        errors = []
        for allowed in (("build", "loop"), ()):
            with paths.only(*allowed), pytest.raises(ValueError) as caught:
                builder.build(block, head)
            errors.append(str(caught.value))
    assert errors[0] == errors[1] and paths.runs["build"] == 0 and paths.calls == 1
    assert {"head nan": "head.logits: must be finite", "block nan": "block.logits: must not hold NaN",
            "few finite": "row 0 depth 4 has 4 logits above -inf"}[bad] in errors[0]


@needs_native
def test_gru_expand_and_gru_build_refuse_bad_arguments():
    lib = heads_module._native_gru()
    with pytest.raises(TypeError, match="expected 31 arguments"):
        lib.gru_expand(1, 2)
    with pytest.raises(TypeError, match="expected 32 arguments"):
        lib.gru_build(1, 2)
    args = [None] * 31
    args[1], args[2], args[5], args[6], args[19], args[23] = 3, 4, -0.1, 2, -1, -1
    args[27], args[28], args[29], args[30] = 24, 16, 16, VOCAB                 # g = 24
    with pytest.raises(ValueError, match="multiples of 16"):
        lib.gru_expand(*args)
    args[27] = 32
    args[3] = torch.tensor([4, 20, 2], dtype=torch.int64).numpy()             # 20 > 4 x 4 children
    with pytest.raises(ValueError, match=r"widths\[d\] <= widths\[d - 1\] \* K"):
        lib.gru_expand(*args)
    args[5] = 0.5
    with pytest.raises(ValueError, match="beta must be <= 0"):
        lib.gru_expand(*args)
    b = [None] * 32
    b[1], b[2], b[3], b[4], b[6], b[8], b[14], b[18] = 3, VOCAB, 4, 0, HIDDEN, HIDDEN + 32, -1, -1
    b[20], b[21], b[22], b[23], b[25], b[26], b[27], b[28] = 32, 16, 16, VOCAB, -0.1, 2, 3, 0
    b[24] = torch.tensor([4, 4, 4], dtype=torch.int64).numpy()
    b[27] = 13                                                                  # more than the 12 nodes
    with pytest.raises(ValueError, match="n_out larger than the supertree"):
        lib.gru_build(*b)
    b[27], b[8] = 3, HIDDEN - 1                                                 # ld below the hidden size
    with pytest.raises(ValueError, match="hidden_size <= ld"):
        lib.gru_build(*b)


def _small_head(seed: int) -> GRUHead:
    """A GRU head over the first 150 of the blocks' 211 tokens."""
    gen = torch.Generator().manual_seed(seed)
    head = GRUHead(HIDDEN, 150, 32, 32, prefix_len=1, embedding=torch.randn(150, HIDDEN, generator=gen))
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.4)
    return head.eval()


@needs_native
def test_ids_outside_the_heads_vocabulary_meet_the_errors_of_the_calls_per_depth(monkeypatch):
    """A candidate the head cannot embed raises what the per-depth calls raise, by every path; where the
    bound stops before it, every path (a fresh head's first build included, which checks the step shapes)
    returns the per-depth calls' tree; a root the head cannot embed with a NaN block logit is the block's
    error, as the per-depth calls check the block first."""
    paths = Paths(monkeypatch)
    fine = make_block(gamma=6, seed=1)
    with torch.no_grad():
        fine.logits[..., 150:] = -50.0                                  # every candidate below 150
        fine.root[0] = 3
    late = fine.logits.clone()
    late[0, 1, 200] = 100.0                                             # depth 2's best candidate: 200
    late_block = DraftBlock(logits=late, root=fine.root, hidden=fine.hidden)
    head = _small_head(1)
    builder = make_builder("dartree-pruned", backend="fast", budget=12, width=4, topk=6)
    stopped = make_builder("dartree-pruned", backend="fast", budget=1, width=4, topk=6)
    with torch.inference_mode():
        builder.build(fine, head)                                       # the step shapes checked
        for allowed in (("build", "loop"), ("loop",), ()):
            with paths.only(*allowed), pytest.raises(ValueError, match=r"tokens: ids must be in \[0, 150\)"):
                builder.build(late_block, head)
        trees = []
        for allowed in (("build", "loop"), ("loop",), ()):
            with paths.only(*allowed):
                trees.append(stopped.build(late_block, _small_head(2)))
        assert all(_same_tree(t, trees[-1]) for t in trees) and int(trees[0].num_nodes[0]) == 2
        bad_root = late.clone()
        bad_root[0, 2, 7] = float("nan")
        block = DraftBlock(logits=bad_root, root=torch.tensor([180]), hidden=fine.hidden)
        for allowed in (("build", "loop"), ()):
            with paths.only(*allowed), pytest.raises(ValueError, match="block.logits: must not hold NaN"):
                builder.build(block, head)


@needs_native
def test_whole_builds_in_two_threads_give_the_trees_of_one(monkeypatch):
    """``gru_build`` releases the GIL: builds of one head in two threads at once give the trees the same
    builds give one after the other (every scratch buffer is the call's own).  On one torch (and MKL)
    thread in every thread: OpenMP's thread count is per thread, a new thread starts with all cores, and
    MKL's products on 2 threads differ in the last bits from those on 1 on this AVX2 CPU, as torch's own
    would (one worker thread alone gave other trees in a 2-core CI run); that is not the GIL's."""

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _builds_in_two_threads(monkeypatch)
    finally:
        torch.set_num_threads(before)


def _builds_in_two_threads(monkeypatch):
    import threading

    paths = Paths(monkeypatch)
    head = make_head(g=32, e=32, seed=6)
    builder = make_builder("dartree-pruned", backend="fast", budget=12, width=4, topk=6)
    blocks = [make_block(gamma=6, seed=s) for s in range(8)]
    with torch.inference_mode():
        builder.build(blocks[0], head)                                  # the step shapes checked
        want = [builder.build(b, head) for b in blocks]
    got: dict[int, list] = {0: [], 1: []}

    def work(i):
        torch.set_num_threads(1)                                        # this thread's OpenMP count
        with torch.inference_mode():
            for _ in range(20):
                got[i].append([builder.build(b, head) for b in blocks])

    threads = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(_same_tree(a, b) for run in got[0] + got[1] for a, b in zip(run, want, strict=True))
    assert paths.runs["build"] > 8                                      # the threads ran whole builds (a count
    # updated from two threads may lose an increment: not compared exactly)


@needs_native
def test_gru_init_takes_the_lanes_of_torchs_capability():
    """gru_init finds torch's kernels for the lanes of its CPU capability (16: AVX-512, 8: AVX2) and
    refuses other lane counts and arguments; a call for lanes this CPU lacks finds nothing."""
    import os

    lib = native.lib()
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    lanes = {"AVX512": 16, "AVX2": 8}[torch.backends.cpu.get_cpu_capability()]
    with pytest.raises(ValueError, match="lanes must be 16"):
        lib.gru_init(path, 4)
    with pytest.raises(TypeError, match="the library path"):
        lib.gru_init(path)
    assert lib.gru_init(path + ".missing", lanes) is False              # never loads a library itself
    assert lib.gru_init(path, 24 - lanes) is (lanes == 16)              # AVX2 lanes on an AVX-512 CPU: found
    assert lib.gru_init(path, lanes) is True                            # as _native_gru left it
