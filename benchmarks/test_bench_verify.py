"""Verification-side tree work, ref vs fast: tree attention mask + positions + links, and the greedy walk.

ref: an independent Python derivation from ``DraftTree.node_paths`` (mask rows = each node's path,
links and walk from per-node child lists); fast: ``dartree.fast.ops.tree_structure`` and
``dartree.fast.ops.greedy_walk`` (the host versions for these CPU tensors).  Trees: fast
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
    """Mask, positions, first child and next sibling of row 0, from the root-to-node paths."""
    paths = tree.node_paths(0)
    n = tree.max_nodes
    mask = torch.zeros(1, n, n, dtype=torch.bool)
    for i, path in enumerate(paths):
        mask[0, i, [0] + path] = True
    positions = torch.tensor([[PREFIX + len(p) for p in paths]])
    first, nxt = [-1] * n, [-1] * n
    last: dict[int, int] = {}
    for i, path in enumerate(paths[1:], start=1):
        parent = path[-2] if len(path) > 1 else 0
        if parent in last:
            nxt[last[parent]] = i
        else:
            first[parent] = i
        last[parent] = i
    return mask, positions, torch.tensor([first]), torch.tensor([nxt])


def fast_structure(tree: DraftTree):
    return ops.tree_structure(tree.parents, tree.num_nodes, PREFIX)


def ref_walk(tree: DraftTree, picks: torch.Tensor) -> list[int]:
    """Accepted node indices of row 0: from the root, the child whose token is the parent's pick."""
    children: dict[int, dict[int, int]] = {}
    tokens, parents, pick = tree.tokens[0].tolist(), tree.parents[0].tolist(), picks[0].tolist()
    for i in range(1, int(tree.num_nodes[0])):
        children.setdefault(parents[i], {})[tokens[i]] = i
    node, accepted = 0, [0]
    while pick[node] in children.get(node, {}):
        node = children[node][pick[node]]
        accepted.append(node)
    return accepted


def fast_walk(tree: DraftTree, picks: torch.Tensor):
    return ops.greedy_walk(tree.tokens, tree.parents, tree.num_nodes, picks)


@pytest.mark.parametrize("provider", ("ref", "fast"))
@pytest.mark.parametrize("budget", BUDGETS)
def test_tree_structure(benchmark, provider: str, budget: int) -> None:
    tree, _ = tree_and_picks(budget)
    benchmark.group = f"mask+positions+links B={budget}"
    out = run(benchmark, ref_structure if provider == "ref" else fast_structure, tree)
    other = fast_structure(tree) if provider == "ref" else ref_structure(tree)
    for a, b in zip(out, other, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("provider", ("ref", "fast"))
@pytest.mark.parametrize("budget", BUDGETS)
def test_greedy_walk(benchmark, provider: str, budget: int) -> None:
    tree, picks = tree_and_picks(budget)
    benchmark.group = f"greedy walk B={budget}"
    out = run(benchmark, ref_walk if provider == "ref" else fast_walk, tree, picks)
    fast = out if provider == "fast" else fast_walk(tree, picks)
    accepted = out if provider == "ref" else ref_walk(tree, picks)
    assert fast.accepted[0, : len(accepted)].tolist() == accepted and int(fast.accepted_length[0]) == len(accepted) - 1


@pytest.mark.parametrize("provider", ("transformers", "dartree"))
@pytest.mark.parametrize("rows", (1, 15))
def test_top_p_mask(benchmark, provider: str, rows: int) -> None:
    """The top-p mask of ``rows`` rows of zoo-sized logits (a target row in AR, a drafter block's depths):
    transformers' way (``torch.sort``) vs dartree's (numpy sorts the values of several rows on the CPU;
    one row is torch's sort; equal masks).  2026-12-04, one thread: 15 rows 3.7 ms vs 0.95 ms."""
    from dartree.verify.warp import _hf_top_p_drop, _top_p_drop
    scores = torch.randn(rows, VOCAB + 2, generator=torch.Generator().manual_seed(rows)) * 3
    benchmark.group = f"top-p 0.95 mask, {rows} x {VOCAB + 2}"
    out = run(benchmark, _hf_top_p_drop if provider == "transformers" else _top_p_drop, scores, 0.95)
    assert torch.equal(out, _hf_top_p_drop(scores, 0.95))
