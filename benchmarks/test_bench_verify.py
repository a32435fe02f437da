"""Verification-side tree work, ref vs fast: tree attention mask + positions + links, and the greedy walk.

ref: ``DraftTree.ancestor_mask`` / ``positions`` / ``links`` and ``dartree.verify.accept_picks``;
fast: ``dartree.fast.ops.tree_structure`` and ``dartree.fast.ops.greedy_walk``.  Trees: fast
``dartree-pruned`` (W=12) at each budget; the target's picks follow the tree's first child 90% of the
time, so walks go deep.
"""

from __future__ import annotations

import functools

import pytest
import torch

from benchmarks.common import BUDGETS, TOPK, draft_block, gru_head, run
from dartree import DraftTree, make_builder
from dartree.fast import ops
from dartree.verify.accept import accept_picks

VOCAB = 4096
PREFIX = 100


@functools.cache
def tree_and_picks(budget: int) -> tuple[DraftTree, torch.Tensor]:
    block = draft_block(VOCAB)
    tree = make_builder("dartree-pruned", backend="fast", budget=budget, width=12, topk=TOPK).build(
        block, gru_head(VOCAB))
    g = torch.Generator().manual_seed(budget)
    first, _ = tree.links()
    follow = (first >= 0) & (torch.rand(tree.tokens.shape, generator=g) < 0.9)
    picks = torch.randint(0, VOCAB, tree.tokens.shape, generator=g)
    return tree, torch.where(follow, torch.gather(tree.tokens, 1, first.clamp(min=0)), picks)


def ref_structure(tree: DraftTree):
    return tree.ancestor_mask(), tree.positions(PREFIX), tree.links()


def fast_structure(tree: DraftTree):
    return ops.tree_structure(tree.parents, tree.num_nodes, PREFIX)


def ref_walk(tree: DraftTree, picks: torch.Tensor):
    return accept_picks(tree, picks)


def fast_walk(tree: DraftTree, picks: torch.Tensor):
    return ops.greedy_walk(tree.tokens, tree.parents, tree.num_nodes, picks)


@pytest.mark.parametrize("provider", ("ref", "fast"))
@pytest.mark.parametrize("budget", BUDGETS)
def test_tree_structure(benchmark, provider: str, budget: int) -> None:
    tree, _ = tree_and_picks(budget)
    benchmark.group = f"mask+positions+links B={budget}"
    out = run(benchmark, ref_structure if provider == "ref" else fast_structure, tree)
    mask = out[0] if provider == "ref" else out.mask
    assert torch.equal(mask, tree.ancestor_mask())


@pytest.mark.parametrize("provider", ("ref", "fast"))
@pytest.mark.parametrize("budget", BUDGETS)
def test_greedy_walk(benchmark, provider: str, budget: int) -> None:
    tree, picks = tree_and_picks(budget)
    benchmark.group = f"greedy walk B={budget}"
    out = run(benchmark, ref_walk if provider == "ref" else fast_walk, tree, picks)
    assert torch.equal(out.accepted, accept_picks(tree, picks).accepted)
