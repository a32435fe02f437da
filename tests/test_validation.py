"""Bad input: every documented error is raised with a message naming the argument."""

from __future__ import annotations

import pytest
import torch

from dartree import BUILDERS, DraftBlock, make_builder
from dartree.testing import PathHashHead


def block(b: int = 2, gamma: int = 3, vocab: int = 10) -> DraftBlock:
    return DraftBlock(logits=torch.randn(b, gamma, vocab), root=torch.zeros(b, dtype=torch.int64))


@pytest.mark.parametrize("name,config,field", [
    ("ddtree", {"budget": 0}, "budget"),
    ("ddtree", {"budget": 2.5}, "budget"),
    ("ddtree", {"topk": 0}, "topk"),
    ("chain", {"topk": -1}, "topk"),
    ("dartree-pruned", {"width": 0}, "width"),
    ("dartree-pruned", {"beta": 0.1}, "beta"),
    ("dartree-pruned", {"beta": float("nan")}, "beta"),
    ("dartree-pruned", {"beta": float("-inf")}, "beta"),
    ("sequential-heap", {"normalize": "softmax"}, "normalize"),
    ("chain", {"budget": 4}, "budget"),          # chains take no budget
    ("ddtree", {"width": 4}, "width"),           # only dartree-pruned has a width
    ("dartree-fixed", {"beta": -0.1}, "beta"),   # only dartree-pruned has a depth bonus
])
def test_bad_config_names_the_field(name: str, config: dict, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}:"):
        make_builder(name, **config)


def test_bad_name_and_backend() -> None:
    with pytest.raises(ValueError, match=r"^name: unknown builder 'dartree'.*registered"):
        make_builder("dartree")
    with pytest.raises(ValueError, match=r"^backend: must be one of \('ref', 'fast'\)"):
        make_builder("chain", backend="cuda")


@pytest.mark.parametrize("name", BUILDERS)
def test_topk_larger_than_vocab(name: str) -> None:
    builder = make_builder(name, topk=11)
    with pytest.raises(ValueError, match=r"^topk: 11 is outside the allowed range 1\.\.V=10"):
        builder.build(block(), PathHashHead() if builder.needs_head else None)


@pytest.mark.parametrize("name", BUILDERS)
def test_head_presence(name: str) -> None:
    builder = make_builder(name, topk=2)
    with pytest.raises(ValueError, match=r"^head:"):
        builder.build(block(), None if builder.needs_head else PathHashHead())


@pytest.mark.parametrize("name", BUILDERS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_logits(name: str, bad: float) -> None:
    blk = block()
    blk.logits[1, 2, 3] = bad
    builder = make_builder(name, topk=2)
    with pytest.raises(ValueError, match=r"^block\.logits: must be finite"):
        builder.build(blk, PathHashHead() if builder.needs_head else None)


def test_block_shape_and_dtype_errors() -> None:
    with pytest.raises(ValueError, match=r"^logits:"):
        DraftBlock(logits=torch.randn(3, 10), root=torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"^logits: expected a floating dtype"):
        DraftBlock(logits=torch.zeros(1, 2, 3, dtype=torch.int64), root=torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"^root: expected int64 tensor of shape \[2\]"):
        DraftBlock(logits=torch.randn(2, 3, 10), root=torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"^root: expected int64"):
        DraftBlock(logits=torch.randn(2, 3, 10), root=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^hidden: expected shape \[2, 3, H\]"):
        DraftBlock(logits=torch.randn(2, 3, 10), root=torch.zeros(2, dtype=torch.int64), hidden=torch.randn(2, 4, 8))
    with pytest.raises(ValueError, match=r"^block: expected a DraftBlock"):
        make_builder("chain").build(torch.randn(2, 3, 10))


class WrongBatchHead(PathHashHead):
    """A head that ignores the block's batch size (e.g. one built for another batch)."""

    def initial_state(self, block):
        return torch.zeros(block.batch_size + 1, 2)


class WrongWidthHead(PathHashHead):
    def logits(self, block, depth, states, candidates):
        return super().logits(block, depth, states, candidates)[..., :-1]


@pytest.mark.parametrize("name", ["corrected-chain", "sequential-heap", "dartree-fixed", "dartree-pruned"])
@pytest.mark.parametrize("head,method", [(WrongBatchHead(), "initial_state"), (WrongWidthHead(), "logits")])
def test_head_output_mismatch(name: str, head, method: str) -> None:
    builder = make_builder(name, topk=3)
    with pytest.raises(ValueError, match=rf"^head\.{method}: returned shape"):
        builder.build(block(), head)


class NaNHead(PathHashHead):
    def logits(self, block, depth, states, candidates):
        return super().logits(block, depth, states, candidates) * float("nan")


@pytest.mark.parametrize("name", ["corrected-chain", "sequential-heap", "dartree-pruned"])
def test_head_non_finite_logits(name: str) -> None:
    with pytest.raises(ValueError, match=r"^head\.logits: must be finite"):
        make_builder(name, topk=3, backend="ref").build(block(), NaNHead())
