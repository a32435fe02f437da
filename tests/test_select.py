"""Lemma 1: on prefix trees with non-increasing scores, best-first == global top-B, prefix-closed."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from dartree import DraftTree, best_first_select, make_builder, top_b_select
from dartree.testing import PathHashHead
from dartree.tree import PAD
from tests.strategies import blocks


def tree_from_rows(rows: list[list[tuple[int, int, int, float]]]) -> DraftTree:
    """rows of (parent, rank, token, score) per draft node; node 0 (root, token 0) is implicit."""
    n = 1 + max(len(r) for r in rows)
    b = len(rows)
    tokens = torch.full((b, n), PAD)
    parents = torch.full((b, n), PAD)
    depths = torch.full((b, n), PAD)
    ranks = torch.full((b, n), PAD)
    scores = torch.full((b, n), float("-inf"))
    for r, row in enumerate(rows):
        tokens[r, 0], depths[r, 0], scores[r, 0] = 0, 0, 0.0
        for i, (p, k, t, s) in enumerate(row, start=1):
            parents[r, i], ranks[r, i], tokens[r, i], scores[r, i] = p, k, t, s
            depths[r, i] = depths[r, p] + 1
    return DraftTree(tokens, parents, depths, scores, ranks, torch.tensor([1 + len(r) for r in rows]))


@st.composite
def monotone_trees(draw) -> DraftTree:
    """Random prefix trees whose scores never increase along a path (ties are common)."""
    rows = []
    for _ in range(draw(st.integers(1, 3))):
        row: list[tuple[int, int, int, float]] = []
        scores = [0.0]
        child_count = [0]
        for i in range(1, draw(st.integers(1, 40)) + 1):
            p = draw(st.integers(0, i - 1))
            drop = draw(st.sampled_from([0.0, 0.5, 1.0, 0.25]))
            k = child_count[p]
            child_count[p] += 1
            row.append((p, k, k, scores[p] - drop))
            scores.append(scores[p] - drop)
            child_count.append(0)
        rows.append(row)
    return tree_from_rows(rows)


def prefix_closed(tree: DraftTree, keep: torch.Tensor) -> bool:
    parent_kept = torch.gather(keep, 1, tree.parents.clamp(min=0))
    return bool((~keep[:, 1:] | parent_kept[:, 1:]).all())


@given(tree=monotone_trees(), budget=st.integers(0, 45))
def test_best_first_equals_top_b_on_random_monotone_trees(tree: DraftTree, budget: int) -> None:
    heap, top = best_first_select(tree, budget), top_b_select(tree, budget)
    assert torch.equal(heap, top)
    assert prefix_closed(tree, top)
    assert top.sum(1).tolist() == [min(budget, int(n) - 1) + 1 for n in tree.num_nodes]


@given(block=blocks(max_vocab=40, max_gamma=6), width=st.integers(1, 8), budget=st.integers(1, 60),
       beta=st.sampled_from([0.0, -0.3, -2.0]))
def test_lemma_on_real_supertrees(block, width: int, budget: int, beta: float) -> None:
    # A budget covering every node returns the whole DARTree supertree.
    full = make_builder("dartree-pruned", budget=width * block.gamma, width=width, topk=min(8, block.vocab_size),
                        beta=beta)
    supertree = full.build(block, PathHashHead())
    heap, top = best_first_select(supertree, budget), top_b_select(supertree, budget)
    assert torch.equal(heap, top)
    assert prefix_closed(supertree, top)
    # And the builder's own pruning is exactly that selection.
    pruned = make_builder("dartree-pruned", budget=budget, width=width, topk=min(8, block.vocab_size), beta=beta)
    assert pruned.build(block, PathHashHead()).canonical() == supertree.select(top).canonical()


def test_positive_beta_breaks_prefix_closure() -> None:
    """The guard beta <= 0 exists for a reason: with beta = +0.5 a child can outscore its parent.

    root -> a (log q = -0.1) -> c (log q = -0.05), and root -> b (log q = -0.3); s = s(parent) + log q + beta.
    """
    beta = 0.5
    s_a = -0.1 + beta
    s_b = -0.3 + beta
    s_c = s_a - 0.05 + beta
    tree = tree_from_rows([[(0, 0, 5, s_a), (0, 1, 6, s_b), (1, 0, 7, s_c)]])
    top = top_b_select(tree, 1)
    assert top[0].tolist() == [True, False, False, True]  # the deepest node alone: not prefix-closed
    assert not prefix_closed(tree, top)
    assert best_first_select(tree, 1)[0].tolist() == [True, True, False, False]
