"""dartree-pruned's exact bound (docs/builders.md, "Bound pruning"): the tree is identical node for node with
the bound on and off, on every fast path, and equal to the literal reference (Algorithm 1, which never prunes).

The parity tests of test_fast_parity.py already build the default config (bound on) against the reference;
here the draws aim at the cases the proof has to survive: ties with the budget-th node (score ties broken
by rank path), beta = 0 (children tie their parents), K = 1, W = 1, a budget larger than the supertree, and
batches (the expansion stops only when no row keeps a branch).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dartree import DraftBlock, make_builder
from dartree.fast import expansion
from dartree.testing import IdentityHead, PathHashHead
from tests.fast.test_fast_parity import assert_same_tree, run_on
from tests.strategies import random_logits

HEADS = {"identity": IdentityHead(), "path-hash": PathHashHead(), "path-hash-strong": PathHashHead(strength=3.0)}
KERNELS = ("host", "torch")


def build(block: DraftBlock, head, cfg: dict, bound: bool, kernels: str):
    with run_on(kernels):
        tree = make_builder("dartree-pruned", backend="fast", bound=bound, **cfg).build(block, head)
    return tree, expansion.last()


@st.composite
def cases(draw, max_gamma: int = 7):
    b = draw(st.integers(1, 3))
    gamma = draw(st.integers(1, max_gamma))
    vocab = draw(st.integers(2, 40))
    seed = draw(st.integers(0, 2**31 - 1))
    logits = random_logits(seed, (b, gamma, vocab), draw(st.booleans()))
    root = torch.randint(0, vocab, (b,), generator=torch.Generator().manual_seed(seed + 1))
    cfg = {"topk": draw(st.sampled_from([1, 2, 3, min(vocab, 8)])),
           "width": draw(st.sampled_from([1, 2, 3, 5, 12])),
           "budget": draw(st.sampled_from([1, 2, 3, 7, 16, 50, 400])),  # 400: beyond any supertree drawn here
           "beta": draw(st.sampled_from([0.0, -0.2, -1.0])),
           "normalize": draw(st.sampled_from(["vocab", "candidates"]))}
    cfg["topk"] = min(cfg["topk"], vocab)
    return DraftBlock(logits=logits, root=root), cfg, draw(st.sampled_from(sorted(HEADS)))


@pytest.mark.parametrize("kernels", KERNELS)
@settings(max_examples=60, deadline=None)
@given(case=cases())
@example(case=(DraftBlock(logits=torch.zeros(2, 5, 3), root=torch.tensor([0, 1])),  # every score ties
               {"topk": 3, "width": 4, "budget": 5, "beta": 0.0, "normalize": "candidates"}, "identity"))
def test_bound_on_equals_off_and_ref(kernels: str, case) -> None:
    block, cfg, head_name = case
    head = HEADS[head_name]
    ref = make_builder("dartree-pruned", backend="ref", **cfg).build(block, head)
    off, stats_off = build(block, head, cfg, False, kernels)
    on, stats_on = build(block, head, cfg, True, kernels)
    assert_same_tree(ref, off)
    assert_same_tree(ref, on)  # canonical form, then node order, scores (bits), ranks, parents, depths
    assert stats_off.depths == stats_off.full_depths and stats_off.branches == stats_off.full_branches
    assert stats_on.depths <= stats_on.full_depths and stats_on.branches <= stats_on.full_branches


def test_the_bound_saves_head_calls_where_the_tree_ends_early() -> None:
    """A peaked block: the best chain holds the budget after a few depths, every other branch falls behind.
    Both the compiled host loop and the tensor path stop early (fewer head calls)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 10, 50, generator=g)
    logits[..., 7] += 8.0  # token 7 dominates every depth
    block = DraftBlock(logits=logits, root=torch.tensor([3]))
    cfg = {"topk": 6, "width": 4, "budget": 6, "beta": -0.5, "normalize": "candidates"}
    ref = make_builder("dartree-pruned", backend="ref", **cfg).build(block, IdentityHead())
    for kernels in ("host", "torch"):
        on, stats = build(block, IdentityHead(), cfg, True, kernels)
        assert_same_tree(ref, on)
        assert stats.depths < stats.full_depths == 10, kernels


def test_the_bound_counts_beta_against_every_child() -> None:
    """A frontier node scoring above the budget-th node, by less than |beta|, has no child that can enter
    the tree: every child scores at most its score + beta.  Here both depth-1 nodes fill the budget of 2
    and the better one leads by less than |beta| = 0.5, so the expansion stops after depth 1; with
    beta = 0 it cannot."""
    logits = torch.zeros(1, 3, 2)
    logits[0, 0] = torch.tensor([0.52, 0.48]).log()
    block = DraftBlock(logits=logits, root=torch.tensor([0]))
    for beta, stops in ((-0.5, True), (0.0, False)):
        cfg = {"topk": 2, "width": 2, "budget": 2, "beta": beta, "normalize": "candidates"}
        ref = make_builder("dartree-pruned", backend="ref", **cfg).build(block, IdentityHead())
        for kernels in ("host", "torch"):
            on, stats = build(block, IdentityHead(), cfg, True, kernels)
            assert_same_tree(ref, on)
            assert (stats.depths == 1) == stops, (beta, kernels, stats.depths)


def test_a_tie_with_the_budget_th_node_is_broken_by_rank_path() -> None:
    """All candidates tie at every depth (beta = 0: children tie their parents too): the budget-th node is
    decided by rank path alone, and a frontier node with its score must be kept or dropped by path."""
    block = DraftBlock(logits=torch.zeros(3, 6, 4), root=torch.tensor([0, 1, 2]))
    for budget in (1, 2, 3, 4, 5, 9):
        cfg = {"topk": 4, "width": 3, "budget": budget, "beta": 0.0, "normalize": "candidates"}
        ref = make_builder("dartree-pruned", backend="ref", **cfg).build(block, IdentityHead())
        for kernels in KERNELS:
            assert_same_tree(ref, build(block, IdentityHead(), cfg, True, kernels)[0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_triton_interpreter_bound_on_equals_off(seed: int) -> None:
    """The Triton path (CUDA's; on the CPU under TRITON_INTERPRET=1, on a GPU with the block on it) with the
    bound's early stop."""
    g = torch.Generator().manual_seed(seed)
    logits = random_logits(seed, (2, 5, 30), seed == 1)
    logits[..., 3] += 4.0 * seed
    block = DraftBlock(logits=logits, root=torch.randint(0, 30, (2,), generator=g))
    cfg = {"topk": 4, "width": 3, "budget": 4, "beta": -0.2, "normalize": "candidates"}
    ref = make_builder("dartree-pruned", backend="ref", **cfg).build(block, PathHashHead())
    device = "cuda" if torch.cuda.is_available() else "cpu"     # real Triton kernels take device tensors
    on_device = DraftBlock(logits=logits.to(device), root=block.root.to(device))
    for bound in (False, True):
        assert_same_tree(ref, build(on_device, PathHashHead(), cfg, bound, "triton")[0].to("cpu"))
