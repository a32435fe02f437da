"""Every reference builder returns a valid tree on random blocks (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dartree import BUILDERS, make_builder
from dartree.fast.widths import pruned_widths
from dartree.sequoia import rank_shape
from dartree.testing import PathHashHead
from tests.strategies import blocks, config_for

HEAD = PathHashHead()


def trie_size(topk: int, gamma: int) -> int:
    return sum(topk**d for d in range(1, gamma + 1))


@pytest.mark.parametrize("name", BUILDERS)
@given(data=st.data())
def test_valid_tree(name: str, data) -> None:
    block = data.draw(blocks())
    cfg = config_for(data.draw, name, block.vocab_size)
    builder = make_builder(name, backend="ref", **cfg)
    tree = builder.build(block, HEAD if builder.needs_head else None)
    budget = cfg.get("budget", block.gamma)
    tree.validate(gamma=block.gamma, budget=budget)
    assert tree.batch_size == block.batch_size
    assert tree.tokens[:, 0].tolist() == block.root.tolist()
    counts = tree.num_nodes.tolist()
    if name in ("chain", "corrected-chain"):
        assert counts == [1 + block.gamma] * block.batch_size
    elif name in ("ddtree", "corrected-chain-ddtree", "sequential-heap", "dartree-fixed"):
        # These spend the whole budget unless the candidate trie is smaller.
        full = 1 + min(budget, trie_size(cfg["topk"], block.gamma))
        assert counts == [full] * block.batch_size
    elif name in ("sequoia", "corrected-sequoia"):   # the static shape, capped by gamma and min(K, len(P))
        shape = rank_shape(budget, block.gamma, builder.config.acceptance[: cfg["topk"]])
        assert counts == [shape.num_nodes] * block.batch_size
        assert shape.num_nodes == 1 + min(budget, trie_size(min(cfg["topk"], len(builder.config.acceptance)),
                                                            block.gamma))
    else:  # dartree-pruned: the best B nodes of a supertree of min(W, K^d) nodes per depth
        supertree = sum(pruned_widths(cfg["width"], cfg["topk"], block.gamma))
        assert counts == [1 + min(budget, supertree)] * block.batch_size
    # Nodes are emitted in the total order: scores never increase along the node index.
    valid = tree.valid()
    for r in range(tree.batch_size):
        s = tree.scores[r][valid[r]].tolist()
        assert all(a >= b for a, b in zip(s[1:], s[2:], strict=False))
    # Every node's token is the candidate of its rank at its depth.
    for r in range(tree.batch_size):
        sorted_tokens = block.logits[r].float().sort(dim=-1, descending=True, stable=True).indices
        for i in range(1, counts[r]):
            d, k = int(tree.depths[r, i]), int(tree.ranks[r, i])
            assert int(tree.tokens[r, i]) == int(sorted_tokens[d - 1, k])
