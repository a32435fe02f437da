"""Batched decoding (generate_batch, generate_ar_batch) with ragged acceptance: every row equals its
single-request run (T=0 and T=1 with a keyed sampler), for ragged prompts, rows stopping at different rounds,
every builder on both backends; the batched cache equals a fresh prefill of each row after every commit."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

import dartree
from dartree.batch import generate_ar_batch
from dartree.batch_drafters import DFlashRows, RowsOfDrafters, batch_drafter
from dartree.decode import SpeculativeDecoder, generate_ar
from dartree.models.target import HFTarget
from dartree.serve import serve
from dartree.testing import OracleDrafter
from dartree.verify import KeyedSampler
from tests.models.conftest import make_drafter, make_target
from tests.test_decode import GAMMA, builder_and_head, model_for
from tests.verify.helpers import ARCHS, one_thread, random_tree  # noqa: F401 (autouse fixture)

PROMPTS = [torch.tensor([7]), torch.tensor([3, 14, 15, 92, 65, 35]), torch.arange(40, 52), torch.tensor([5, 9])]


def stop_after(model, prompt, step: int, max_new: int) -> int:
    """A token that greedy AR on ``prompt`` emits first at ``step`` (so that row stops there), else -1."""
    out = generate_ar(model, prompt, max_new).tokens[0].tolist()
    return out[step] if out[step] not in out[:step] else -1


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", ARCHS)
def test_ar_batch_rows_equal_single_ar(arch, attn, cache):
    model = model_for(arch, attn)
    target = HFTarget(model, cache=cache, max_cache_len=64 if cache == "static" else None)
    stop = [t for t in (stop_after(model, PROMPTS[1], 3, 12),) if t >= 0]
    for temperature, sampler in ((0.0, None), (1.0, KeyedSampler(5))):
        rows = generate_ar_batch(target, PROMPTS, 12, temperature=temperature, sampler=sampler, stop_token_ids=stop)
        for prompt, row in zip(PROMPTS, rows, strict=True):
            one = generate_ar(model, prompt, 12, temperature=temperature, sampler=sampler, stop_token_ids=stop)
            assert row.tokens.tolist() == one.tokens.tolist()
            assert row.stop_reason == one.stop_reason and row.num_rounds == one.num_rounds
    if stop:        # greedy: row 1 really stopped early, the others did not
        rows = generate_ar_batch(target, PROMPTS, 12, stop_token_ids=stop)
        assert rows[1].tokens.shape[1] == 4 and rows[1].stop_reason == "stop_token"


@settings(max_examples=10)
@given(rows=st.integers(1, 4), lengths=st.lists(st.integers(1, 9), min_size=4, max_size=4),
       name=st.sampled_from(dartree.BUILDERS), backend=st.sampled_from(["ref", "fast"]),
       sampled=st.booleans(), max_new=st.integers(1, 12), stop_step=st.integers(0, 11), seed=st.integers(0, 99),
       attn=st.sampled_from(["eager", "sdpa"]))
def test_generate_batch_rows_equal_generate(rows, lengths, name, backend, sampled, max_new, stop_step, seed, attn):
    check_rows_equal_generate(rows, lengths, name, backend, sampled, max_new, stop_step, seed, attn)


@pytest.mark.parametrize("backend", ["ref", "fast"])
@pytest.mark.parametrize("name", dartree.BUILDERS)
def test_generate_batch_every_builder(name, backend):
    """Every builder on both backends, three ragged rows, one stopping early; T=0 (ref, sdpa) and T=1 with a
    keyed sampler (fast, eager); the hypothesis test above mixes the rest."""
    if backend == "ref":
        check_rows_equal_generate(3, [4, 1, 7, 1], name, backend, False, 7, 2, 1, "sdpa")
    else:
        check_rows_equal_generate(3, [2, 6, 1, 1], name, backend, True, 7, 3, 2, "eager")


def check_rows_equal_generate(rows, lengths, name, backend, sampled, max_new, stop_step, seed, attn):
    model = model_for("qwen3", attn)
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 128, (lengths[r],), generator=g) for r in range(rows)]
    temperature, sampler = (1.0, KeyedSampler(seed)) if sampled else (0.0, None)
    ar = [generate_ar(model, p, max_new, temperature=temperature, sampler=sampler) for p in prompts]
    # a stop token that ends row 0 at stop_step (when it appears there first): rows stop at different rounds
    out0 = ar[0].tokens[0].tolist()
    stop = [out0[stop_step]] if stop_step < max_new and out0[stop_step] not in out0[:stop_step] else None
    builder, head = builder_and_head(name, backend)

    def decoder():
        drafter = OracleDrafter(model, GAMMA, demote=0.3, drop=0.2, seed=seed, temperature=temperature,
                                sampler=sampler)
        return SpeculativeDecoder(model, drafter, builder, head)

    batch = decoder().generate_batch(prompts, max_new, temperature=temperature, sampler=sampler,
                                     stop_token_ids=stop)
    assert len(batch) == rows
    for prompt, row in zip(prompts, batch, strict=True):
        one = decoder().generate(prompt, max_new, temperature=temperature, sampler=sampler, stop_token_ids=stop)
        alone = generate_ar(model, prompt, max_new, temperature=temperature, sampler=sampler, stop_token_ids=stop)
        assert row.tokens.tolist() == one.tokens.tolist() == alone.tokens.tolist()
        assert row.stop_reason == one.stop_reason
        # the same rounds as alone: per-row drafter state, tree and acceptance are isolated
        assert [r.committed for r in row.rounds] == [r.committed for r in one.rounds]
        assert [r.tree_size for r in row.rounds] == [r.tree_size for r in one.rounds]
        assert 1 + sum(r.committed for r in row.rounds) == row.tokens.shape[1]


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_batch_dflash_rows_equal_generate(cache):
    model = make_target()
    drafter = make_drafter(model)
    target = HFTarget(model, layer_ids=drafter.target_layer_ids, cache=cache,
                      max_cache_len=96 if cache == "static" else None)
    for name, temperature, sampler in (("ddtree", 0.0, None), ("chain", 1.0, KeyedSampler(11))):
        builder, head = builder_and_head(name)
        dec = SpeculativeDecoder(target, drafter, builder, head)
        batch = dec.generate_batch(PROMPTS, 8, temperature=temperature, sampler=sampler)
        for prompt, row in zip(PROMPTS, batch, strict=True):
            one = dec.generate(prompt, 8, temperature=temperature, sampler=sampler)
            assert row.tokens.tolist() == one.tokens.tolist()
            assert row.tokens.tolist() == generate_ar(model, prompt, 8, temperature=temperature,
                                                      sampler=sampler).tokens.tolist()


def test_generate_batch_greedy_scores_only_the_walked_nodes(monkeypatch):
    """T=0 on the CPU: a batched round that scores the roots only runs the LM head on the nodes the greedy
    walk visits (as generate does); the first round scores every node (WalkRows); either way the tokens
    are those of the full-logits rounds."""
    from dartree.rounds import WalkRows

    model = make_target()
    drafter = make_drafter(model)
    target = HFTarget(model, layer_ids=drafter.target_layer_ids)
    assert target.scores_rows_apart
    builder, head = builder_and_head("ddtree")
    ways = []
    forward = HFTarget.forward_tree
    monkeypatch.setattr(HFTarget, "forward_tree", lambda self, inputs, logits="all": ways.append(
        logits) or forward(self, inputs, logits=logits))
    adaptive = SpeculativeDecoder(target, drafter, builder, head).generate_batch(PROMPTS, 10)
    assert ways[0] == "all"
    scored = []
    real = HFTarget.head_logits
    monkeypatch.setattr(HFTarget, "head_logits", lambda self, final: scored.append(final.shape[0]) or real(self, final))
    monkeypatch.setattr(WalkRows, "logits", lambda self, nodes: "root")
    lazy = SpeculativeDecoder(target, drafter, builder, head).generate_batch(PROMPTS, 10)
    walked = sum(r.accepted_length for row in lazy for r in row.rounds)
    assert walked > 0 and sum(scored) == walked       # one LM-head row per accepted node, none elsewhere
    monkeypatch.setattr(HFTarget, "scores_rows_apart", property(lambda self: False))
    full = SpeculativeDecoder(target, drafter, builder, head).generate_batch(PROMPTS, 10)
    for got in (lazy, adaptive):
        assert [r.tokens.tolist() for r in got] == [r.tokens.tolist() for r in full]
        assert [[x.tree_size for x in r.rounds] for r in got] == [[x.tree_size for x in r.rounds] for r in full]


@pytest.mark.parametrize("shift_label", [False, True])
def test_dflash_rows_draft_equals_single_draft(shift_label):
    model = make_target()
    drafter = make_drafter(model)
    drafter.config.shift_label = shift_label          # the depth-1 slot is the root's (True) or the next one
    target = HFTarget(model, layer_ids=drafter.target_layer_ids)
    rows = batch_drafter(drafter)
    assert isinstance(rows, DFlashRows)
    contexts = [p[:-1] for p in PROMPTS]
    out = target.prefill(contexts)
    rows.start(len(contexts))
    m = out.hidden.shape[1]
    tokens = torch.stack([torch.cat([c, c.new_zeros(m - len(c))]) for c in contexts])
    rows.append_rows(out.hidden, tokens, [len(c) for c in contexts])
    # a second, ragged append (0 to 3 new entries per row)
    extra = torch.randint(0, 100, (len(contexts), 3))
    hidden = torch.randn(len(contexts), 3, out.hidden.shape[-1])
    counts = [3, 0, 1, 2]
    rows.append_rows(hidden, extra, counts)
    roots = torch.stack([p[-1] for p in PROMPTS])
    block = rows.draft_rows(roots)
    for r, (c, p) in enumerate(zip(contexts, PROMPTS, strict=True)):
        single = target.prefill(c[None])
        drafter.reset()
        drafter.append_context(single.hidden, c[None])
        drafter.append_context(hidden[r: r + 1, : counts[r]], extra[r: r + 1, : counts[r]])
        assert_close(block.logits[r], drafter.draft(p[-1:]).logits[0], rtol=1e-4, atol=1e-4)
    rows.keep_rows([2, 0])
    kept = rows.draft_rows(roots[[2, 0]])
    assert_close(kept.logits, block.logits[[2, 0]])


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", ARCHS)
def test_ragged_cache_equals_fresh_prefill_after_each_commit(arch, attn, cache):
    model = model_for(arch, attn)
    target = HFTarget(model, cache=cache, max_cache_len=80 if cache == "static" else None)
    fresh = HFTarget(model)
    ragged = target                        # rows of different lengths in one cache
    seqs = [p[:-1].tolist() for p in PROMPTS]
    ragged.prefill([p[:-1] for p in PROMPTS])
    g = torch.Generator().manual_seed(3)

    def check():
        for r, seq in enumerate(seqs):
            assert ragged.lengths[r] == len(seq)
            if not seq:
                continue
            fresh.prefill(torch.tensor([seq]))
            mine = ragged.row_cache(r)
            for (k, v), layer in zip(mine, fresh.cache.layers, strict=True):
                assert_close(k, layer.keys[:, :, : len(seq)], rtol=1e-5, atol=1e-5)
                assert_close(v, layer.values[:, :, : len(seq)], rtol=1e-5, atol=1e-5)

    check()
    for step in range(4):
        b = len(seqs)
        sizes = [int(torch.randint(1, 7, (1,), generator=g)) for _ in range(b)]
        tree = random_tree(sizes, seed=step, vocab=128)
        ragged.forward_tree(ragged.tree_inputs(tree))
        # accept a random root-to-node path in each row
        accepted, counts = torch.full((b, tree.max_nodes), -1), []
        for r in range(b):
            node = int(torch.randint(0, sizes[r], (1,), generator=g))
            path = [node]
            while path[-1] != 0:
                path.append(int(tree.parents[r, path[-1]]))
            path.reverse()
            accepted[r, : len(path)] = torch.tensor(path)
            counts.append(len(path))
            seqs[r] += [int(tree.tokens[r, i]) for i in path]
        ragged.commit(accepted, counts)
        check()
        if step == 1:                      # a row leaves the batch, a new one joins
            ragged.keep_rows([0, 2, 3])
            ragged.add_rows([torch.arange(60, 80)])
            seqs = [seqs[0], seqs[2], seqs[3], list(range(60, 80))]
            check()
    ragged.forward_next(torch.tensor([1, 2, 3, 4]))
    ragged.commit(torch.zeros(4, 1, dtype=torch.int64), [1, 1, 1, 1])
    for seq, t in zip(seqs, (1, 2, 3, 4), strict=True):
        seq.append(t)
    check()
    ragged.keep_rows([])                   # every row finished; new requests start a fresh batch
    ragged.add_rows([torch.tensor([5, 6]), torch.tensor([], dtype=torch.int64)])
    seqs = [[5, 6], []]
    check()


def test_rows_of_drafters_keep_their_own_state():
    model = model_for("qwen3", "sdpa")
    rows = batch_drafter(OracleDrafter(model, GAMMA, seed=4))
    assert isinstance(rows, RowsOfDrafters)
    rows.start(2)
    rows.append_rows(None, torch.tensor([[1, 2, 3], [4, 0, 0]]), [3, 1])
    assert [r.context.tolist() for r in rows.rows] == [[[1, 2, 3]], [[4]]]
    rows.keep_rows([1])
    assert len(rows.rows) == 1 and rows.rows[0].context.tolist() == [[4]]


def test_batch_errors_name_the_argument():
    model = model_for("qwen3", "sdpa")
    builder, _ = builder_and_head("chain")
    dec = SpeculativeDecoder(model, OracleDrafter(model, GAMMA), builder)
    with pytest.raises(ValueError, match="prompts"):
        dec.generate_batch([], 4)
    with pytest.raises(ValueError, match="prompts"):
        dec.generate_batch(torch.tensor([[1, 2]]), 4)
    with pytest.raises(ValueError, match=r"prompts\[1\]: input_ids"):
        dec.generate_batch([torch.tensor([1]), torch.tensor([], dtype=torch.int64)], 4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_ar_batch(model, [torch.tensor([1])], 0)
    ragged = HFTarget(model)
    ragged.prefill([torch.tensor([1, 2]), torch.tensor([3])])
    with pytest.raises(ValueError, match="rows"):
        ragged.keep_rows([0, 0])
    with pytest.raises(ValueError, match="accepted: no forward is pending"):
        ragged.commit(torch.zeros(2, 1, dtype=torch.int64), [1, 1])
    ragged.forward_next(torch.tensor([4, 5]))
    with pytest.raises(ValueError, match="count"):
        ragged.commit(torch.zeros(2, 1, dtype=torch.int64), [1, 2])
    with pytest.raises(ValueError, match="input_ids: extend"):
        ragged.rollback() or ragged.extend(torch.tensor([[1], [2]]))


def test_batched_rows_at_t1_take_the_keyed_walk_as_generate_does(monkeypatch):
    """generate_batch and serve run the one round: on the CPU with a keyed sampler the acceptance walk draws
    only at the nodes it visits (walk_sampled), never verify_sampled's draw at every node; rows still equal
    generate alone."""
    import dartree.verifiers as engine_module

    model = model_for("llama", "sdpa")
    sampler = KeyedSampler(5)
    drafter = OracleDrafter(model, GAMMA, demote=0.3, seed=2, temperature=1.0, sampler=sampler)
    builder, head = builder_and_head("ddtree")
    dec = SpeculativeDecoder(model, drafter, builder, head)
    alone = [dec.generate(p, 9, temperature=1.0, sampler=sampler).tokens.tolist() for p in PROMPTS]
    walked = []
    monkeypatch.setattr(engine_module, "verify_sampled", lambda *a, **k: pytest.fail("verify_sampled ran"))
    real = engine_module.walk_sampled
    monkeypatch.setattr(engine_module, "walk_sampled", lambda *a, **k: walked.append(1) or real(*a, **k))
    rows = dec.generate_batch(PROMPTS, 9, temperature=1.0, sampler=sampler)
    assert walked and [r.tokens.tolist() for r in rows] == alone
    served = serve(dec, PROMPTS, 2, 9, temperature=1.0, sampler=sampler)
    assert [r.tokens.tolist() for r in served.results] == alone


def test_rows_of_a_wrapper_drafter_get_their_own_inner_drafter():
    """A drafter wrapping a stateful drafter: each row gets its own copy all the way down (the model is shared),
    so batched rows equal their runs alone (a shallow copy shared the inner drafter and mixed the rows)."""

    class Wrapper:
        def __init__(self, inner):
            self.inner = inner
            self.target_layer_ids = inner.target_layer_ids

        def reset(self):
            self.inner.reset()

        def append_context(self, hidden, tokens):
            self.inner.append_context(hidden, tokens)

        def draft(self, root):
            return self.inner.draft(root)

    model = model_for("llama", "sdpa")
    builder, head = builder_and_head("ddtree")
    dec = SpeculativeDecoder(model, Wrapper(OracleDrafter(model, GAMMA, demote=0.3, seed=2)), builder, head)
    rows = dec.generate_batch(PROMPTS, 9)
    for prompt, row in zip(PROMPTS, rows, strict=True):
        alone = SpeculativeDecoder(model, Wrapper(OracleDrafter(model, GAMMA, demote=0.3, seed=2)), builder,
                                   head).generate(prompt, 9)
        assert row.tokens.tolist() == alone.tokens.tolist()
        assert [r.accepted_length for r in row.rounds] == [r.accepted_length for r in alone.rounds]
    copies = batch_drafter(Wrapper(OracleDrafter(model, GAMMA)))
    copies.start(2)
    assert copies.rows[0].inner is not copies.rows[1].inner
    assert copies.rows[0].inner.model is copies.rows[1].inner.model is model
