"""KV-cache compaction: after a commit the cache equals a fresh prefill of the committed tokens."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicCache, DynamicSlidingWindowLayer

from dartree.models.target import HFTarget
from dartree.verify import compact_tail, verify_greedy
from tests.verify.helpers import ARCHS, make_tree, one_thread, tiny_lm  # noqa: F401 (autouse fixture)

V = 128


def layer_kv(target: HFTarget, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys[:, :, :length], layer.values[:, :, :length]) for layer in target.cache.layers]


@pytest.mark.parametrize("kind", ["dynamic", "static"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", ARCHS)
def test_commit_equals_fresh_prefill(arch, attn, kind):
    model = tiny_lm(arch, attn, vocab=V)
    prompt = torch.tensor([[5, 17, 3, 99, 42]])
    # root -> 7 -> 8 -> 9 (a chain), root -> 11, 7 -> 12
    tree = make_tree([([42, 7, 11, 8, 12, 9], [-1, 0, 0, 1, 1, 3])])
    # force the walk root -> 7 -> 8 -> 9 with hand-made picks
    picks = torch.tensor([[7, 8, 0, 9, 0, 55]])
    res = verify_greedy(tree, torch.nn.functional.one_hot(picks, V).float())
    assert res.accepted[0, :4].tolist() == [0, 1, 3, 5]
    for count in (4, 2, 1):                                    # the whole path, a truncated one, root only
        target = HFTarget(model, cache=kind, max_cache_len=32 if kind == "static" else None)
        target.prefill(prompt[:, :-1])
        target.forward_tree(target.tree_inputs(tree))
        assert int(target.cache.get_seq_length()) == 4 + 6
        if count == 2:                                         # rollback, then redo the round
            target.rollback()
            assert int(target.cache.get_seq_length()) == 4 and target.length == 4
            target.forward_tree(target.tree_inputs(tree))
        target.commit(res.accepted, count)
        committed = torch.cat([prompt[:, :-1], tree.tokens[:, res.accepted[0, :count]]], dim=1)
        fresh = HFTarget(model)
        fresh.prefill(committed)
        assert target.length == committed.shape[1] == int(target.cache.get_seq_length())
        for (k, v), (fk, fv) in zip(layer_kv(target, target.length), layer_kv(fresh, target.length), strict=True):
            torch.testing.assert_close(k, fk, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(v, fv, atol=1e-5, rtol=1e-5)


def random_cache(b: int, length: int, layers: int = 2) -> DynamicCache:
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(b, 2, length, 4, generator=g), torch.randn(b, 2, length, 3, generator=g))
            for _ in range(layers)]
    return DynamicCache(data)


def kept(cache: DynamicCache, prefix: int, nodes: list[list[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's keys and values of the slots a commit keeps: the prefix, then ``prefix + nodes`` per row."""
    out = []
    for layer in cache.layers:
        rows = [list(range(prefix)) + [prefix + i for i in row] for row in nodes]
        out.append((torch.stack([layer.keys[r][:, slots] for r, slots in enumerate(rows)]),
                    torch.stack([layer.values[r][:, slots] for r, slots in enumerate(rows)])))
    return out


def test_compact_tail_batch_rows_keep_their_own_slots():
    cache = random_cache(2, 9)
    nodes = [[0, 1, 4], [0, 3, 2]]
    want = kept(cache, 3, nodes)
    compact_tail(cache, 3, torch.tensor(nodes))
    for layer, (k, v) in zip(cache.layers, want, strict=True):
        assert torch.equal(layer.keys, k) and torch.equal(layer.values, v)
    assert int(cache.get_seq_length()) == 6


def test_compact_bad_inputs_leave_cache_untouched():
    cache = random_cache(2, 5)
    before = [layer.keys.clone() for layer in cache.layers]
    with pytest.raises(ValueError, match="nodes"):
        compact_tail(cache, 1, torch.tensor([[0, 1]]))                  # batch 1 vs 2
    with pytest.raises(ValueError, match="nodes"):
        compact_tail(cache, 1, torch.tensor([[0, 1], [0, 1]], dtype=torch.int32))
    with pytest.raises(ValueError, match="prefix_len"):
        compact_tail(cache, -1, torch.tensor([[0, 1], [0, 1]]))
    assert all(torch.equal(layer.keys, k) for layer, k in zip(cache.layers, before, strict=True))
    with pytest.raises(ValueError, match="cache"):
        compact_tail("not a cache", 0, torch.tensor([[0]]))
    sliding = DynamicCache()
    sliding.layers = [DynamicSlidingWindowLayer(sliding_window=4)]
    with pytest.raises(ValueError, match="DynamicSlidingWindowLayer"):
        compact_tail(sliding, 0, torch.tensor([[0]]))


@pytest.mark.parametrize("nodes", [[0], [0, 1, 2], [0, 1, 3, 7], [0, 2, 5], [0, 4, 1]])
def test_compact_tail_keeps_the_slots_with_and_without_host_nodes(nodes):
    """compact_tail (device indices, or host indices that skip the nodes already in place) keeps exactly the
    prefix and the given tree slots, in order."""
    prefix = 5
    want = kept(random_cache(1, prefix + 9), prefix, [nodes])
    for host in (None, nodes):
        got = random_cache(1, prefix + 9)
        compact_tail(got, prefix, torch.tensor([nodes]), host)
        assert int(got.get_seq_length()) == prefix + len(nodes)
        for a, (k, v) in zip(got.layers, want, strict=True):
            assert torch.equal(a.keys, k) and torch.equal(a.values, v)
    with pytest.raises(ValueError, match="host_nodes"):
        compact_tail(random_cache(1, 9), 2, torch.tensor([nodes]), nodes + [8])


@pytest.mark.parametrize("nodes", [[0], [0, 1, 2], [0, 1, 3, 7], [0, 2, 5], [0, 4, 1], [0, 3, 3]])
def test_compaction_of_the_lean_buffers_keeps_the_slots(nodes):
    """The lean forward's KV buffers (prefix views with spare slots) keep exactly the prefix and the given tree
    slots after compact_tail, and the buffers' spare slots stay usable for the next append."""
    from dartree.models.lean import _append

    prefix = 5
    want = kept(random_cache(1, prefix + 9), prefix, [nodes])
    got = DynamicCache([(torch.empty(1, 2, 0, 4), torch.empty(1, 2, 0, 3)) for _ in range(2)])
    for i, layer in enumerate(random_cache(1, prefix + 9).layers):
        _append(got, i, layer.keys, layer.values)
    assert all("_dartree_kv" in layer.__dict__ for layer in got.layers)
    compact_tail(got, prefix, torch.tensor([nodes]), nodes)
    for a, (k, v) in zip(got.layers, want, strict=True):
        assert torch.equal(a.keys, k) and torch.equal(a.values, v)
    k, v = _append(got, 0, torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 3))
    assert k.shape[2] == prefix + len(nodes) + 1 and torch.equal(k[:, :, :-1], want[0][0])
