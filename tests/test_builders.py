"""The builders' contract (dartree.builders.checked_tree, dartree.tree.check_decodable): what the decoder checks
on every tree a builder hands it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dartree import BUILDERS, DraftBlock, DraftTree, make_builder
from dartree.testing import PathHashHead
from dartree.tree import PAD, check_decodable


def block(b: int = 2, gamma: int = 3, vocab: int = 10, seed: int = 0) -> DraftBlock:
    g = torch.Generator().manual_seed(seed)
    return DraftBlock(logits=torch.randn(b, gamma, vocab, generator=g), root=torch.tensor([4, 7][:b]),
                      hidden=torch.randn(b, gamma, 8, generator=g))


def tree_of(blk: DraftBlock, budget: int = 6) -> DraftTree:
    return make_builder("ddtree", budget=budget, topk=3).build(blk)


def edited(tree: DraftTree, **fields: torch.Tensor) -> DraftTree:
    return dataclasses.replace(tree, **fields)


def with_value(t: torch.Tensor, row: int, node: int, value: int) -> torch.Tensor:
    t = t.clone()
    t[row, node] = value
    return t


@pytest.mark.parametrize("backend", ["ref", "fast"])
@pytest.mark.parametrize("name", BUILDERS)
def test_every_builder_tree_is_decodable(name: str, backend: str) -> None:
    """What makes the built-in strategies trusted (BuilderSpec.trusted: the decoder skips the check)."""
    blk = block(b=2, gamma=4, vocab=11)
    config = {"topk": 3} if name in ("chain", "corrected-chain") else {"topk": 3, "budget": 7}
    builder = make_builder(name, backend=backend, **config)
    assert builder.trusted
    tree = builder.build(blk, PathHashHead() if builder.needs_head else None)
    assert check_decodable(tree, blk, budget=config.get("budget")) is tree


def test_wrong_root_is_refused() -> None:
    blk = block()
    tree = tree_of(blk)
    with pytest.raises(ValueError, match=r"^builder: .*root: row 1 has root token 3.*need block.root=7"):
        check_decodable(edited(tree, tokens=with_value(tree.tokens, 1, 0, 3)), blk)


@pytest.mark.parametrize("token", [10, 10**6, -1])
def test_token_outside_the_vocabulary_is_refused(token: int) -> None:
    blk = block()
    tree = tree_of(blk)
    with pytest.raises(ValueError, match=rf"tokens: row 0 node 2 has token {token}, need 0 <= token < V=10"):
        check_decodable(edited(tree, tokens=with_value(tree.tokens, 0, 2, token)), blk)


@pytest.mark.parametrize("parent", [2, 5, -1])
def test_bad_parent_is_refused(parent: int) -> None:
    blk = block()
    tree = tree_of(blk)
    with pytest.raises(ValueError, match=rf"parents: row 0 node 2 has parent {parent}, need 0 <= parent < 2"):
        check_decodable(edited(tree, parents=with_value(tree.parents, 0, 2, parent)), blk)


def test_too_deep_or_inconsistent_depth_is_refused() -> None:
    blk = block(gamma=3)
    chain = DraftTree(tokens=torch.tensor([[4, 1, 2, 3, 5]]), parents=torch.tensor([[PAD, 0, 1, 2, 3]]),
                      depths=torch.tensor([[0, 1, 2, 3, 4]]), scores=torch.zeros(1, 5),
                      ranks=torch.zeros(1, 5, dtype=torch.int64), num_nodes=torch.tensor([5]))
    one = block(b=1, gamma=3)
    with pytest.raises(ValueError, match=r"depths: row 0 node 4 has depth 4.*<= gamma=3"):
        check_decodable(chain, one)
    check_decodable(edited(chain, num_nodes=torch.tensor([4])), one)      # the 4th node is padding now
    tree = tree_of(blk)
    with pytest.raises(ValueError, match=r"depths: row 0 node 1 has depth 2, need depth\[parent 0\] \+ 1 = 1"):
        check_decodable(edited(tree, depths=with_value(tree.depths, 0, 1, 2)), blk)


def test_duplicate_siblings_are_refused() -> None:
    blk = block()
    tree = tree_of(blk)
    par = tree.parents[0].tolist()
    i, j = next((i, j) for i in range(1, 7) for j in range(i + 1, 7) if par[i] == par[j])
    tokens = with_value(tree.tokens, 0, j, int(tree.tokens[0, i]))
    with pytest.raises(ValueError, match=rf"siblings: row 0 has two children of node {par[i]} with the same token"):
        check_decodable(edited(tree, tokens=tokens), blk)
    # the same token under different parents is fine (a real tree often has it)
    chain = DraftTree(tokens=torch.tensor([[4, 1, 1]]), parents=torch.tensor([[PAD, 0, 1]]),
                      depths=torch.tensor([[0, 1, 2]]), scores=torch.zeros(1, 3),
                      ranks=torch.zeros(1, 3, dtype=torch.int64), num_nodes=torch.tensor([3]))
    check_decodable(chain, block(b=1))


def test_num_nodes_and_budget() -> None:
    blk = block()
    tree = tree_of(blk, budget=6)
    with pytest.raises(ValueError, match=r"num_nodes: row 0 has 7, need 1 <= num_nodes <= 5"):
        check_decodable(tree, blk, budget=4)
    with pytest.raises(ValueError, match=r"num_nodes: row 1 has 0"):
        check_decodable(edited(tree, num_nodes=torch.tensor([7, 0])), blk)
    with pytest.raises(ValueError, match=r"num_nodes: row 0 has 9"):
        check_decodable(edited(tree, num_nodes=torch.tensor([9, 7])), blk)
    with pytest.raises(ValueError, match=r"^budget:"):
        check_decodable(tree, blk, budget=0)


def test_padding_is_not_read() -> None:
    """Only valid slots are part of the contract (validity is arange(n) < num_nodes)."""
    blk = block()
    tree = tree_of(blk)
    short = edited(tree, num_nodes=torch.tensor([3, 7]), tokens=with_value(tree.tokens, 0, 5, 10**9))
    check_decodable(short, blk)


def test_wrong_type_shape_dtype_device() -> None:
    blk = block()
    tree = tree_of(blk)
    with pytest.raises(ValueError, match=r"^builder: build\(\) must return a DraftTree, got tuple"):
        check_decodable((tree.tokens, tree.parents), blk)
    with pytest.raises(ValueError, match=r"^builder: tree.tokens must have shape \[2, n\]"):
        check_decodable(edited(tree, tokens=tree.tokens[:1]), blk)
    with pytest.raises(ValueError, match=r"^builder: tree.parents must be an int64 tensor"):
        check_decodable(edited(tree, parents=tree.parents.int()), blk)
    with pytest.raises(ValueError, match=r"^builder: tree.num_nodes must be an int64 tensor of shape \[2\]"):
        check_decodable(edited(tree, num_nodes=tree.num_nodes[:1]), blk)
    with pytest.raises(ValueError, match=r"^builder: tree.depths is on meta"):
        check_decodable(edited(tree, depths=tree.depths.to("meta")), blk)


def test_validate_refuses_bad_arguments_and_fields() -> None:
    blk = block()
    tree = tree_of(blk)
    for gamma in (2.5, "3", True, 0):
        with pytest.raises(ValueError, match=r"^gamma: expected an int >= 1 or None"):
            tree.validate(gamma=gamma)
    with pytest.raises(ValueError, match=r"^scores: expected a float32 tensor \[b, n\], got NoneType"):
        edited(tree, scores=None).validate()
    with pytest.raises(ValueError, match=r"^tokens: row \d node \d+ has token \d+, need 0 <= token < V=5"):
        tree.validate(vocab_size=5)
    tree.validate(gamma=3, budget=6, vocab_size=10)
