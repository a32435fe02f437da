"""Exactness: reference builders against brute force and against independent implementations."""

from __future__ import annotations

import heapq
import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dartree import DraftBlock, make_builder
from dartree.scoring import candidates, child_scores, log_normalize
from dartree.testing import IdentityHead, PathHashHead
from dartree.tree import rank_path_key
from tests.strategies import blocks

NORMALIZE = st.sampled_from(["vocab", "candidates"])


def brute_force(block: DraftBlock, topk: int, normalize: str, budget: int, head=None) -> list[dict]:
    """Enumerate every prefix over the candidate lists, score it, keep the top-B in the total order.

    With a head, each prefix is scored by running the head along that prefix alone (one branch).
    """
    cands = candidates(block, topk, normalize)
    out = []
    for r in range(block.batch_size):
        one = block.rows(r)
        scored: dict[tuple[int, ...], tuple[float, tuple[int, ...]]] = {(): (0.0, ())}
        states = {(): head.initial_state(one)[0] if head else None}
        for depth in range(1, block.gamma + 1):
            tokens = cands.tokens[r, depth - 1].tolist()
            for ranks in itertools.product(range(topk), repeat=depth):
                parent = ranks[:-1]
                if head is None:
                    log_q = log_normalize(cands.logits[r, depth - 1], cands.rest_lse[r, depth - 1])
                else:
                    z = head.logits(one, depth, states[parent][None, None], cands.tokens[r, depth - 1][None])[0, 0]
                    log_q = log_normalize(z, cands.rest_lse[r, depth - 1])
                    tok = torch.tensor([[tokens[ranks[-1]]]])
                    states[ranks] = head.advance(one, depth, states[parent][None, None], tok)[0, 0]
                parent_score = torch.tensor([scored[parent][0]], dtype=torch.float32)
                score = child_scores(parent_score, log_q[None], 0.0)[0, ranks[-1]].item()
                scored[ranks] = (score, ranks)
        best = sorted((k for k in scored if k), key=lambda k: rank_path_key(scored[k][0], k))[:budget]
        tok = cands.tokens[r].tolist()
        canon = {(): 0.0}
        for k in best:
            canon[tuple(tok[d][k[d]] for d in range(len(k)))] = scored[k][0]
        out.append(canon)
    return out


small_blocks = blocks(max_vocab=5, max_gamma=3)


@given(block=small_blocks, data=st.data())
def test_ddtree_equals_brute_force(block: DraftBlock, data) -> None:
    topk = data.draw(st.integers(1, min(3, block.vocab_size)))
    normalize, budget = data.draw(NORMALIZE), data.draw(st.integers(1, 40))
    tree = make_builder("ddtree", topk=topk, normalize=normalize, budget=budget).build(block)
    assert tree.canonical() == brute_force(block, topk, normalize, budget)


@given(block=small_blocks, data=st.data())
def test_sequential_heap_equals_brute_force(block: DraftBlock, data) -> None:
    topk = data.draw(st.integers(1, min(3, block.vocab_size)))
    normalize, budget = data.draw(NORMALIZE), data.draw(st.integers(1, 40))
    head = PathHashHead()
    tree = make_builder("sequential-heap", topk=topk, normalize=normalize, budget=budget).build(block, head)
    assert tree.canonical() == brute_force(block, topk, normalize, budget, head)


def lazy_ddtree(block: DraftBlock, topk: int, normalize: str, budget: int) -> list[dict]:
    """An independent DDTree in its original form: per-depth children sorted by log-probability, and
    a heap that on each pop pushes only the node's best child and its next sibling."""
    cands = candidates(block, topk, normalize)
    out = []
    for r in range(block.batch_size):
        log_q = [log_normalize(cands.logits[r, d], cands.rest_lse[r, d]).tolist() for d in range(block.gamma)]
        tokens = cands.tokens[r].tolist()
        # Within a depth, candidates are already sorted by base logit, hence by log q (ties by rank).
        canon = {(): 0.0}

        def score_of(parent_score: float, depth: int, k: int, log_q=log_q) -> float:
            s = child_scores(torch.tensor([parent_score]), torch.tensor([[log_q[depth - 1][k]]]), 0.0)
            return s.item()

        heap = [(rank_path_key(score_of(0.0, 1, 0), (0,)), 0.0, (0,))]
        while heap and len(canon) <= budget:
            (neg, ranks), parent_score, _ = heapq.heappop(heap)
            score = -neg
            canon[tuple(tokens[d][k] for d, k in enumerate(ranks))] = score
            depth = len(ranks)
            if ranks[-1] + 1 < topk:  # next sibling
                sib = ranks[:-1] + (ranks[-1] + 1,)
                heapq.heappush(heap, (rank_path_key(score_of(parent_score, depth, sib[-1]), sib), parent_score, sib))
            if depth < block.gamma:  # best child
                child = ranks + (0,)
                heapq.heappush(heap, (rank_path_key(score_of(score, depth + 1, 0), child), score, child))
        out.append(canon)
    return out


@given(block=blocks(max_vocab=120, max_gamma=10), data=st.data())
def test_ddtree_equals_independent_lazy_heap(block: DraftBlock, data) -> None:
    topk = data.draw(st.integers(1, min(20, block.vocab_size)))
    normalize, budget = data.draw(NORMALIZE), data.draw(st.integers(1, 150))
    tree = make_builder("ddtree", topk=topk, normalize=normalize, budget=budget).build(block)
    assert tree.canonical() == lazy_ddtree(block, topk, normalize, budget)


@given(block=blocks(max_vocab=60, max_gamma=6), data=st.data())
def test_dartree_pruned_is_exact_when_wide_enough(block: DraftBlock, data) -> None:
    topk = data.draw(st.integers(1, min(8, block.vocab_size)))
    normalize, budget = data.draw(NORMALIZE), data.draw(st.integers(1, 40))
    width = data.draw(st.integers(budget, budget + 5))
    head = PathHashHead()
    pruned = make_builder("dartree-pruned", topk=topk, normalize=normalize, budget=budget, width=width, beta=0.0)
    exact = make_builder("sequential-heap", topk=topk, normalize=normalize, budget=budget)
    assert pruned.build(block, head).canonical() == exact.build(block, head).canonical()


@given(block=blocks(max_vocab=80, max_gamma=8), data=st.data())
def test_identity_head_recovers_uncorrected_builders(block: DraftBlock, data) -> None:
    topk = data.draw(st.integers(1, min(10, block.vocab_size)))
    normalize, budget = data.draw(NORMALIZE), data.draw(st.integers(1, 60))
    identity = IdentityHead()
    chain = make_builder("chain", topk=topk, normalize=normalize).build(block)
    corrected = make_builder("corrected-chain", topk=topk, normalize=normalize).build(block, identity)
    assert corrected.canonical() == chain.canonical()
    ddtree = make_builder("ddtree", topk=topk, normalize=normalize, budget=budget).build(block).canonical()
    for name in ("sequential-heap", "corrected-chain-ddtree"):
        tree = make_builder(name, topk=topk, normalize=normalize, budget=budget).build(block, identity)
        assert tree.canonical() == ddtree, name


@pytest.mark.parametrize("normalize", ["vocab", "candidates"])
def test_correction_changes_the_tree(normalize: str) -> None:
    """The path hash head really re-scores: corrected builders differ from uncorrected ones."""
    block = DraftBlock(logits=torch.randn(2, 6, 50, generator=torch.Generator().manual_seed(3)),
                       root=torch.tensor([1, 2]))
    chain = make_builder("chain", topk=8, normalize=normalize).build(block)
    corrected = make_builder("corrected-chain", topk=8, normalize=normalize).build(block, PathHashHead())
    assert chain.canonical() != corrected.canonical()
