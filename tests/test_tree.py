"""DraftTree: validation, derived structure (masks, positions, links, paths), selection."""

from __future__ import annotations

import pytest
import torch

from dartree import DraftBlock, DraftTree, make_builder
from dartree.tree import PAD


def two_rows() -> DraftTree:
    """Row 0: root(7) -> a(1) -> c(3); root -> b(2).  Row 1: root(8) -> a(5).  Padded to n=4."""
    return DraftTree(
        tokens=torch.tensor([[7, 1, 2, 3], [8, 5, PAD, PAD]]),
        parents=torch.tensor([[PAD, 0, 0, 1], [PAD, 0, PAD, PAD]]),
        depths=torch.tensor([[0, 1, 1, 2], [0, 1, PAD, PAD]]),
        scores=torch.tensor([[0.0, -0.1, -0.5, -0.7], [0.0, -0.2, float("-inf"), float("-inf")]]),
        ranks=torch.tensor([[PAD, 0, 1, 0], [PAD, 0, PAD, PAD]]),
        num_nodes=torch.tensor([4, 2]),
    )


def test_derived_structure() -> None:
    tree = two_rows().validate(gamma=2, budget=3)
    mask = tree.ancestor_mask()
    assert mask[0].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    assert mask[1].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert tree.positions(torch.tensor([10, 3])).tolist() == [[10, 11, 11, 12], [3, 4, 3, 3]]
    first, nxt = tree.links()
    assert first.tolist() == [[1, 3, -1, -1], [1, -1, -1, -1]]
    assert nxt.tolist() == [[-1, 2, -1, -1], [-1, -1, -1, -1]]
    assert tree.paths(0) == [(), (1,), (2,), (1, 3)]
    assert tree.rank_paths(0) == [(), (0,), (1,), (0, 0)]
    assert tree.canonical()[1] == {(): 0.0, (5,): pytest.approx(-0.2)}


def test_select_keeps_order_and_remaps_parents() -> None:
    tree = two_rows()
    sub = tree.select(torch.tensor([[True, True, False, True], [True, False, False, False]]))
    sub.validate()
    assert sub.tokens.tolist() == [[7, 1, 3], [8, PAD, PAD]]
    assert sub.parents.tolist() == [[PAD, 0, 1], [PAD, PAD, PAD]]
    with pytest.raises(ValueError, match="^keep: must be prefix-closed"):
        tree.select(torch.tensor([[True, False, True, True], [True, True, False, False]]))


@pytest.mark.parametrize("field,value,message", [
    ("parents", [[PAD, 0, 0, 3], [PAD, 0, PAD, PAD]], "^parents: row 0 node 3"),
    ("depths", [[0, 1, 1, 1], [0, 1, PAD, PAD]], "^depths: row 0 node 3"),
    ("tokens", [[7, 1, 1, 3], [8, 5, PAD, PAD]], "^siblings: row 0 has two children of node 0 with the same token 1"),
    ("scores", [[0.0, -0.1, -0.5, 0.5], [0.0, -0.2, 0.0, 0.0]], "^scores: row 0 node 3 outscores"),
    ("tokens", [[7, 1, 2, 3], [8, 5, 4, PAD]], "^row 1: padding slot 2"),
])
def test_validate_reports_the_broken_invariant(field: str, value: list, message: str) -> None:
    tree = two_rows()
    dtype = torch.float32 if field == "scores" else torch.int64
    fields = {f: getattr(tree, f) for f in ("tokens", "parents", "depths", "scores", "ranks", "num_nodes")}
    fields[field] = torch.tensor(value, dtype=dtype)
    with pytest.raises(ValueError, match=message):
        DraftTree(**fields).validate()
    with pytest.raises(ValueError, match="^num_nodes:"):
        tree.validate(budget=2)


@pytest.mark.parametrize("parents", [[PAD, 3, 1, 2], [PAD, 0, 3, 2], [PAD, 0, 1, 4]])
def test_validate_reports_a_cycle_or_an_outside_parent_as_a_value_error(parents: list) -> None:
    """A 3-cycle, a 2-cycle or a parent past the row is a broken ``parents`` (never an IndexError)."""
    tree = DraftTree(tokens=torch.tensor([[7, 1, 2, 3]]), parents=torch.tensor([parents]),
                     depths=torch.tensor([[0, 1, 2, 3]]), scores=torch.tensor([[0.0, -1.0, -2.0, -3.0]]),
                     ranks=torch.tensor([[PAD, 0, 0, 0]]), num_nodes=torch.tensor([4]))
    with pytest.raises(ValueError, match="^parents: row 0 node [1-3] has parent [2-4], need 0 <= parent < [1-3]"):
        tree.validate()


def test_validate_reads_no_padding_parent_as_an_index() -> None:
    """A padding slot's parent out of range is reported as padding (it is never used as an index)."""
    tree = two_rows()
    parents = tree.parents.clone()
    parents[1, 3] = 99
    with pytest.raises(ValueError, match="^row 1: padding slot 3 must hold -1"):
        DraftTree(tree.tokens, parents, tree.depths, tree.scores, tree.ranks, tree.num_nodes).validate()


def test_builder_tree_mask_matches_paths() -> None:
    """The ancestor mask of a built tree agrees with its root-to-node paths, node by node."""
    block = DraftBlock(logits=torch.randn(3, 5, 40, generator=torch.Generator().manual_seed(0)),
                       root=torch.tensor([1, 2, 3]))
    tree = make_builder("ddtree", budget=23, topk=5).build(block)
    mask = tree.ancestor_mask()
    for r in range(3):
        for i, path in enumerate(tree.node_paths(r)):
            assert mask[r, i].nonzero().flatten().tolist() == sorted([0] + path)


def test_tree_and_structure_sit_below_the_fast_dispatch() -> None:
    """No import circle: the tree and its structure import nothing from dartree.fast (not even lazily)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "dartree"
    for name in ("tree.py", "structure.py"):
        tree = ast.parse((root / name).read_text())
        imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in imported if m.startswith("dartree.fast")], name


def test_validate_rejects_nan_scores_and_a_negative_root() -> None:
    block = DraftBlock(logits=torch.randn(1, 3, 10), root=torch.tensor([2]))
    tree = make_builder("ddtree", budget=4, topk=3).build(block)
    bad = torch.where(torch.arange(tree.max_nodes) == 2, torch.tensor(float("nan")), tree.scores)
    with pytest.raises(ValueError, match="^scores: row 0 node 2 has a NaN score"):
        DraftTree(tree.tokens, tree.parents, tree.depths, bad, tree.ranks, tree.num_nodes).validate()
    tokens = tree.tokens.clone()
    tokens[0, 0] = -1
    with pytest.raises(ValueError, match="^tokens: row 0 node 0 has token -1, need 0 <= token"):
        DraftTree(tokens, tree.parents, tree.depths, tree.scores, tree.ranks, tree.num_nodes).validate()
