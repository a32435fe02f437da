"""fast == ref: every registry entry builds the identical tree (same tensors, same float32 scores)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dartree import BUILDERS, DraftBlock, DraftTree, make_builder, native
from dartree.fast import ops
from dartree.testing import IdentityHead, PathHashHead
from tests.strategies import blocks, config_for, random_logits

FIELDS = ("tokens", "parents", "depths", "scores", "ranks", "num_nodes")
HEADS = {"identity": IdentityHead(), "path-hash": PathHashHead()}


def assert_same_tree(ref: DraftTree, fast: DraftTree) -> None:
    assert fast.canonical() == ref.canonical()
    for name in FIELDS:
        a, b = getattr(ref, name), getattr(fast, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
        if a.dtype == torch.float32:  # the same bits: torch.equal takes -0.0 for +0.0
            assert torch.equal(a.view(torch.int32), b.view(torch.int32)), name


def test_a_zero_log_q_at_depth_one_scores_plus_zero() -> None:
    """The best-first heaps score the first node as root + log q, as the reference does: a log q of
    -0.0 (a candidate with all the mass) gives +0.0, not -0.0."""
    block = DraftBlock(logits=torch.tensor([[[-0.0, -1.0, -2.0], [0.5, 0.0, -1.0]]]), root=torch.tensor([0]))
    for name in ("ddtree", "corrected-chain-ddtree"):
        for kernels in ("host", "no-native", "torch"):
            cfg = {"topk": 1, "budget": 2, "normalize": "candidates"}
            assert_same_tree(*build_both(name, block, cfg, "identity", kernels))


@contextlib.contextmanager
def run_on(kernels: str):
    """"host": the CPU builders (compiled loops); "no-native": a CPU without ``dartree._native`` (the
    tensorized builders, by dispatch); "torch" / "triton": the tensorized builders, forced."""
    if kernels == "no-native":
        with native.disabled():
            assert ops.builders(torch.zeros(1)).__name__ == "dartree.fast.tensor_builders"
            yield
    else:
        with ops.force_backend(kernels):
            yield


def build_both(name: str, block: DraftBlock, cfg: dict, head_name: str,
               kernels: str = "host") -> tuple[DraftTree, DraftTree]:
    ref = make_builder(name, backend="ref", **cfg)
    fast = make_builder(name, backend="fast", **cfg)
    head = HEADS[head_name] if ref.needs_head else None
    with run_on(kernels):
        return ref.build(block, head), fast.build(block, head)


def awkward_block(b: int, gamma: int, vocab: int, seed: int, ties: bool) -> DraftBlock:
    root = torch.randint(0, vocab, (b,), generator=torch.Generator().manual_seed(seed))
    return DraftBlock(logits=random_logits(seed, (b, gamma, vocab), ties), root=root)


# Uncorrected builders take no head: one head variant is enough for them.
NAME_HEADS = [(name, h) for name in BUILDERS for h in (HEADS if make_builder(name).needs_head else ["path-hash"])]


@pytest.mark.parametrize(("name", "head_name"), NAME_HEADS)
@given(data=st.data())
def test_fast_equals_ref(name: str, head_name: str, data) -> None:
    block = data.draw(blocks(max_vocab=120, max_gamma=8))
    cfg = config_for(data.draw, name, block.vocab_size, max_budget=70, max_width=12, max_topk=12)
    ref, fast = build_both(name, block, cfg, head_name)
    fast.validate(gamma=block.gamma, budget=cfg.get("budget"))
    assert_same_tree(ref, fast)


CASES = [  # (b, gamma, V, topk, budget, width): the awkward shapes of the design's testing matrix
    (1, 1, 111, 1, 1, 1),
    (3, 1, 111, 7, 5, 3),
    (3, 5, 111, 1, 3, 1),
    (1, 6, 111, 5, 37, 7),
    (3, 4, 111, 111, 19, 13),
    (3, 9, 111, 3, 100, 5),
    (1, 3, 2, 2, 14, 20),  # budget larger than the whole trie
]


@pytest.mark.parametrize("kernels", ["host", "torch"])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", BUILDERS)
def test_fast_equals_ref_awkward_shapes(name: str, case: tuple[int, ...], ties: bool, kernels: str) -> None:
    b, gamma, vocab, topk, budget, width = case
    block = awkward_block(b, gamma, vocab, seed=sum(case), ties=ties)
    for normalize in ("vocab", "candidates"):
        cfg: dict = {"topk": topk, "normalize": normalize}
        if name not in ("chain", "corrected-chain"):
            cfg["budget"] = budget
        if name == "dartree-pruned":
            cfg.update(width=width, beta=-0.2 if ties else 0.0)
        for head_name in HEADS:
            assert_same_tree(*build_both(name, block, cfg, head_name, kernels))


@pytest.mark.parametrize("kernels", ["host", "torch"])
@settings(max_examples=min(10, settings().max_examples))
@given(seed=st.integers(0, 2**16), width=st.integers(1, 40), budget=st.integers(1, 90))
@example(seed=0, width=32, budget=64)
def test_pruned_parity_at_wide_gamma(kernels: str, seed: int, width: int, budget: int) -> None:
    """Long blocks (gamma=16) with several rank-path words, ties everywhere (4-valued logits)."""
    block = awkward_block(2, 16, 40, seed, ties=True)
    cfg = {"budget": budget, "width": width, "topk": 40, "beta": -0.5}
    assert_same_tree(*build_both("dartree-pruned", block, cfg, "path-hash", kernels))


class CountingHead:
    """PathHashHead without the fused method, counting its calls per (method, depth) and rows."""

    def __init__(self) -> None:
        self.inner = PathHashHead()
        self.calls: list[tuple[str, int, int, int]] = []

    def initial_state(self, block: DraftBlock) -> torch.Tensor:
        return self.inner.initial_state(block)

    def logits(self, block: DraftBlock, depth: int, states: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        self.calls.append(("logits", depth, states.shape[0], states.shape[1]))
        return self.inner.logits(block, depth, states, candidates)

    def advance(self, block: DraftBlock, depth: int, states: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        self.calls.append(("advance", depth, states.shape[0], states.shape[1]))
        return self.inner.advance(block, depth, states, tokens)


class CountingFusedHead(CountingHead):
    def advance_logits(self, block, depth, states, tokens, candidates):
        self.calls.append(("advance_logits", depth, states.shape[0], states.shape[1]))
        return self.inner.advance_logits(block, depth, states, tokens, candidates)


@pytest.mark.parametrize("kernels", ["host", "torch"])
@pytest.mark.parametrize("name", ["dartree-fixed", "dartree-pruned", "corrected-chain"])
def test_head_calls_per_depth_for_all_rows(name: str, kernels: str) -> None:
    """Two calls per depth (one fused), all rows at once, and no advance after the last depth."""
    block = awkward_block(3, 6, 50, seed=5, ties=False)
    cfg = {"topk": 8} | ({"budget": 40} if name != "corrected-chain" else {})
    cfg |= {"width": 5} if name == "dartree-pruned" else {}
    gamma = block.gamma
    two_calls = [("logits", 1)] + [c for d in range(1, gamma) for c in (("advance", d), ("logits", d + 1))]
    fused = [("logits", 1)] + [("advance_logits", d) for d in range(1, gamma)]  # never at the last depth
    trees = []
    for head, expected in ((CountingHead(), two_calls), (CountingFusedHead(), fused)):
        with ops.force_backend(kernels):
            trees.append(make_builder(name, backend="fast", **cfg).build(block, head))
        assert all(c[2] == block.batch_size for c in head.calls)  # all rows in one call
        assert [c[:2] for c in head.calls] == expected
    assert_same_tree(*trees)  # the fused call builds the same tree as the two-call form


def test_sequential_heap_batches_rows_at_the_same_depth() -> None:
    """Rows whose popped nodes share a depth share one head call (identical logits: same depths)."""
    block = DraftBlock(logits=random_logits(1, (1, 5, 30), False).expand(3, -1, -1).contiguous(),
                       root=torch.tensor([4, 4, 4]))
    head = CountingHead()
    make_builder("sequential-heap", backend="fast", budget=20, topk=6).build(block, head)
    assert all(c[2] == 3 for c in head.calls)
    assert sum(c[0] == "logits" for c in head.calls) == 20  # root + 19 popped nodes (not the last)


def test_sequential_heap_splits_rows_popping_at_different_depths() -> None:
    """Rows whose popped nodes sit at different depths are scored in separate head calls (sub-blocks)."""
    block = awkward_block(3, 5, 40, seed=11, ties=False)
    head = CountingHead()
    fast = make_builder("sequential-heap", backend="fast", budget=20, topk=5).build(block, head)
    assert any(c[2] < 3 for c in head.calls)  # some pop had rows at different depths
    ref = make_builder("sequential-heap", backend="ref", budget=20, topk=5).build(block, PathHashHead())
    assert_same_tree(ref, fast)


class GradHead(PathHashHead):
    """PathHashHead whose outputs require grad, as a user's head run with autograd on gives them."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.ones((), requires_grad=True)

    def initial_state(self, block):
        return super().initial_state(block) * self.w

    def logits(self, block, depth, states, candidates):
        return super().logits(block, depth, states, candidates) * self.w

    def advance(self, block, depth, states, tokens):
        return super().advance(block, depth, states, tokens) * self.w


@pytest.mark.parametrize("kernels", ["host", "no-native", "torch"])
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_a_block_that_requires_grad_gives_the_trees_of_a_plain_one(name: str, kernels: str) -> None:
    """Outside inference mode, a drafter (or head) with autograd on hands the builders tensors that
    require grad: every backend builds the tree of the same values without grad (the fast builders
    read them on the host), nothing of it requires grad, and the caller's block is left as it was."""
    plain = awkward_block(2, 5, 40, seed=11, ties=True)
    logits = plain.logits.clone().requires_grad_()
    hidden = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(2)).requires_grad_()
    graded = DraftBlock(logits=logits * 1.0, root=plain.root, hidden=hidden * 1.0)
    plain = DraftBlock(logits=plain.logits, root=plain.root, hidden=hidden.detach())
    fields = make_builder(name).config.__dataclass_fields__
    cfg = {k: v for k, v in {"topk": 6, "budget": 9, "width": 4}.items() if k in fields}
    for backend in ("ref", "fast"):
        builder = make_builder(name, backend=backend, **cfg)
        head = (GradHead() if backend == "fast" else PathHashHead()) if builder.needs_head else None
        with run_on(kernels):
            want = builder.build(plain, None if head is None else PathHashHead())
            got = builder.build(graded, head)
        assert got.canonical() == want.canonical()
        assert not any(getattr(got, f).requires_grad for f in FIELDS if f != "scores") or backend == "ref"
        assert graded.logits.requires_grad and graded.hidden.requires_grad
