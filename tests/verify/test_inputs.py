"""Tree inputs: ancestor mask, position ids and the tree attention mask (bool and additive)."""

from __future__ import annotations

import pytest
import torch

from dartree.verify import TreeInputs, tree_inputs
from tests.verify.helpers import GOLDEN, random_tree


@pytest.mark.parametrize("sizes", [[1], [2], [5, 1], [17, 9, 3], [33]])
@pytest.mark.parametrize("seed", [0, 1])
def test_ancestor_mask_matches_paths(sizes, seed):
    tree = random_tree(sizes, seed).validate()
    mask = tree.ancestor_mask()
    for r in range(tree.batch_size):
        paths = tree.node_paths(r)
        for i in range(tree.max_nodes):
            want = sorted([0] + paths[i]) if i < len(paths) else []
            assert mask[r, i].nonzero().flatten().tolist() == want


def test_golden_inputs():
    inp = tree_inputs(GOLDEN, 3)
    assert inp.input_ids.tolist() == [[10, 11, 12, 13], [20, 21, 0, 0]]
    assert inp.position_ids.tolist() == [[3, 4, 4, 5], [3, 4, 3, 3]]
    assert inp.mask.shape == (2, 1, 4, 7)
    m = inp.mask[:, 0].int().tolist()
    # columns: 3 prefix slots, then the 4 node slots
    assert m[0] == [[1, 1, 1, 1, 0, 0, 0],
                    [1, 1, 1, 1, 1, 0, 0],
                    [1, 1, 1, 1, 0, 1, 0],
                    [1, 1, 1, 1, 1, 0, 1]]
    # padding slots: invisible to real nodes, and see only themselves (finite softmax rows)
    assert m[1] == [[1, 1, 1, 1, 0, 0, 0],
                    [1, 1, 1, 1, 1, 0, 0],
                    [0, 0, 0, 0, 0, 1, 0],
                    [0, 0, 0, 0, 0, 0, 1]]


def test_additive_and_dispatch():
    inp = tree_inputs(GOLDEN, 2)
    add = inp.additive_mask(torch.float32)
    assert add.dtype == torch.float32
    assert torch.equal(add == 0, inp.mask)
    assert bool((add[~inp.mask] == torch.finfo(torch.float32).min).all())
    assert inp.mask_for("sdpa", torch.bfloat16) is inp.mask
    assert inp.mask_for("eager", torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="attn_implementation"):
        inp.mask_for("flash_attention_2", torch.float16)
    with pytest.raises(ValueError, match="dtype"):
        inp.additive_mask(torch.int64)


def test_per_row_prefix_and_static_layout():
    prefix = torch.tensor([2, 4])
    inp = tree_inputs(GOLDEN, prefix, cache_len=5, kv_len=12)
    assert isinstance(inp, TreeInputs) and inp.kv_len == 12
    assert inp.position_ids[:, 0].tolist() == [2, 4]
    m = inp.mask[:, 0]
    assert m[0, 0, :5].tolist() == [True, True, False, False, False]
    assert m[1, 0, :5].tolist() == [True, True, True, True, False]
    assert m[0, 3, 5:9].tolist() == [True, True, False, True]
    assert not bool(m[:, :, 9:].any())           # slots past the tree (stale static cache) are masked


def test_bad_arguments():
    with pytest.raises(ValueError, match="prefix_len"):
        tree_inputs(GOLDEN, -1)
    with pytest.raises(ValueError, match="cache_len"):
        tree_inputs(GOLDEN, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="prefix_len"):
        tree_inputs(GOLDEN, torch.tensor([1, 2, 3]), cache_len=3)
    with pytest.raises(ValueError, match="kv_len"):
        tree_inputs(GOLDEN, 3, kv_len=5)
    with pytest.raises(ValueError, match="prefix_len"):
        tree_inputs(GOLDEN, 4, cache_len=3)


def test_buffer_refill_equals_fresh_inputs_over_many_rounds():
    """TreeInputBuffer (the decoding loop's refilled mask) equals tree_inputs round after round:
    growing prefixes, trees that shrink and grow, a new (shorter) sequence, a static kv_len."""
    from dartree.verify import TreeInputBuffer

    buf = TreeInputBuffer("cpu")
    g = torch.Generator().manual_seed(3)
    prefix = 0
    for step in range(40):
        if step == 25:
            prefix = 2                                   # a new prompt: the prefix shrinks
        size = int(torch.randint(1, 20, (1,), generator=g))
        tree = random_tree([size], seed=step)
        kv_len = None if step % 3 else prefix + size + int(torch.randint(0, 30, (1,), generator=g))
        got = buf.fill(tree, prefix, kv_len=kv_len)
        want = tree_inputs(tree, prefix, kv_len=kv_len)
        assert torch.equal(got.mask, want.mask), step
        assert torch.equal(got.input_ids, want.input_ids) and torch.equal(got.position_ids, want.position_ids)
        prefix += int(torch.randint(1, size + 1, (1,), generator=g))      # commit 1..size slots
    with pytest.raises(ValueError, match="one-row"):
        buf.fill(random_tree([3, 4], seed=0), 5)
    with pytest.raises(ValueError, match="kv_len"):
        buf.fill(random_tree([4], seed=0), 5, kv_len=6)
