"""Sequoia's rank-optimal shape (dartree.sequoia) and the two builders on it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dartree import DraftBlock, make_builder
from dartree.eval.acceptance import measure_acceptance
from dartree.eval.methods import parse_method
from dartree.sequoia import (
    DEFAULT_ACCEPTANCE,
    RankShape,
    acceptance_from_walks,
    check_acceptance,
    rank_shape,
)
from dartree.testing import PathHashHead

VECTORS = [(0.5, 0.2, 0.1), (0.3, 0.3, 0.3), (0.9, 0.05), (0.48, 0.09, 0.055), (0.2,)]


def closed_trees(budget: int, gamma: int, kids: int) -> set[frozenset]:
    """Every tree of ``budget`` draft nodes as a set of sibling-rank paths: each node's parent and earlier
    siblings are in it (children are drawn, and tested, in rank order), depth <= gamma, rank < kids."""
    trees = {frozenset([()])}
    for _ in range(budget):
        grown = set()
        for tree in trees:
            for path in tree:
                for rank in range(kids):
                    child = path + (rank,)
                    if len(child) <= gamma and child not in tree and (rank == 0 or path + (rank - 1,) in tree):
                        grown.add(tree | {child})
        trees = grown or trees
    return trees


def value(tree: frozenset, acceptance: tuple[float, ...]) -> float:
    return math.fsum(math.prod(acceptance[r] for r in path) for path in tree if path)


def paths_of(shape: RankShape) -> frozenset:
    paths = [()]
    for parent, rank in zip(shape.parents[1:], shape.ranks[1:], strict=True):
        paths.append(paths[parent] + (rank,))
    return frozenset(paths)


@pytest.mark.parametrize("acceptance", VECTORS)
@pytest.mark.parametrize("budget", [1, 2, 4, 6])
def test_the_shape_is_the_best_tree_of_its_size(acceptance, budget):
    """Against every tree of the budget (exhaustive): no tree is worth more than the best-first shape."""
    gamma = 3
    shape = rank_shape(budget, gamma, acceptance)
    trees = closed_trees(budget, gamma, len(acceptance))
    assert paths_of(shape) in trees                                  # a valid tree of that size
    best = max(value(t, acceptance) for t in trees)
    assert value(paths_of(shape), acceptance) == pytest.approx(best, rel=1e-12)


def test_a_bushy_tree_is_worth_less():
    """The comparison can fail: the root with every child (the T=0 builders' shape at T=1) loses to the shape."""
    acceptance = DEFAULT_ACCEPTANCE
    bushy = frozenset([()] + [(r,) for r in range(6)])
    assert value(bushy, acceptance) < value(paths_of(rank_shape(6, 15, acceptance)), acceptance) - 0.1


def test_nodes_come_in_the_total_order_with_float32_path_scores():
    shape = rank_shape(40, 6, DEFAULT_ACCEPTANCE)
    logs = np.log(np.asarray(DEFAULT_ACCEPTANCE)).astype(np.float32)
    paths = [()]
    for i in range(1, shape.num_nodes):
        u = shape.parents[i]
        assert 0 <= u < i and shape.depths[i] == shape.depths[u] + 1 <= 6
        paths.append(paths[u] + (shape.ranks[i],))
        assert shape.scores[i] == float(np.float32(shape.scores[u]) + logs[shape.ranks[i]])
    keys = [(-s, p) for s, p in zip(shape.scores[1:], paths[1:], strict=True)]
    assert keys == sorted(keys)
    for u in range(shape.num_nodes):                         # a node's children: ranks 0, 1, ... in node order
        kids = [shape.ranks[i] for i in range(1, shape.num_nodes) if shape.parents[i] == u]
        assert kids == list(range(len(kids)))
    chain = [i for i, p in enumerate(paths) if all(r == 0 for r in p)]
    assert len(chain) == 7                                  # the first-child chain reaches gamma


def test_gamma_and_the_vector_cap_the_shape():
    assert rank_shape(100, 2, (0.5, 0.2)).num_nodes == 1 + 2 + 4
    assert rank_shape(100, 1, (0.5, 0.2, 0.1)).num_nodes == 1 + 3


@pytest.mark.parametrize("bad", [(0.2, 0.5), (0.6, 0.5), (0.0, 0.0), (1.0,), (), "0.5/x", (True,), 0.5, (-0.1,)])
def test_bad_acceptance_is_named(bad):
    with pytest.raises(ValueError, match=r"^acceptance: expected P_r .*non-increasing.*got"):
        make_builder("sequoia", acceptance=bad)


def test_acceptance_as_a_method_setting():
    method = parse_method("corrected-sequoia:budget=8,acceptance=0.5/0.2/0.1,head_depths=3")
    builder = make_builder(method.builder, **method.config)
    assert builder.config.acceptance == (0.5, 0.2, 0.1) and builder.config.head_depths == 3
    assert check_acceptance([0.5, 0.25]) == (0.5, 0.25)
    with pytest.raises(ValueError, match=r"^acceptance: "):
        parse_method("sequoia:acceptance=0.1/0.5")


@pytest.mark.parametrize("name", ["sequoia", "corrected-sequoia"])
def test_children_are_the_best_candidates_in_rank_order(name):
    """A node's r-th child is its r-th best candidate: the drafter's at the depth, or the head's after the
    node's own path (recomputed here node by node with the head)."""
    g = torch.Generator().manual_seed(3)
    block = DraftBlock(logits=torch.randn(2, 4, 30, generator=g), root=torch.tensor([1, 2]))
    head = PathHashHead() if name == "corrected-sequoia" else None
    tree = make_builder(name, budget=12, topk=5).build(block, head)
    shape = rank_shape(12, 4, DEFAULT_ACCEPTANCE[:5])
    order = block.logits.sort(dim=-1, descending=True, stable=True).indices[..., :5]      # [b, gamma, K]
    for r in range(2):
        for i in range(1, shape.num_nodes):
            u, d = shape.parents[i], shape.depths[i]
            if head is None:
                want = int(order[r, d - 1, shape.ranks[i]])
            else:
                one = DraftBlock(logits=block.logits[r: r + 1], root=block.root[r: r + 1])
                state = head.initial_state(one)[:, None]
                path = [j for j in _ancestors(shape, u)]
                for depth, j in enumerate(path, start=1):
                    state = head.advance(one, depth, state, tree.tokens[r: r + 1, j][:, None])
                scores = head.logits(one, d, state, order[r: r + 1, d - 1])[0, 0]
                ranked = sorted(range(5), key=lambda k: (-float(scores[k]), k))
                want = int(order[r, d - 1, ranked[shape.ranks[i]]])
            assert int(tree.tokens[r, i]) == want


def _ancestors(shape: RankShape, u: int) -> list[int]:
    out = []
    while u > 0:
        out.append(u)
        u = shape.parents[u]
    return out[::-1]


def test_under_rejection_only_the_shape_is_built():
    """The decoder does not rank a corrected-sequoia tree's tokens by the head when the rejection verifier
    redraws them: the head is asked only for proposals, at depths <= head_depths (one call per round here)."""
    from dartree.decode import SpeculativeDecoder
    from dartree.testing import OracleDrafter
    from dartree.verify import GeneratorSampler
    from tests.test_decode import GAMMA, model_for

    calls: list[int] = []

    class Counting(PathHashHead):
        def logits(self, block, depth, states, candidates):
            calls.append(depth)
            return super().logits(block, depth, states, candidates)

    model = model_for("llama", "sdpa")
    prompt = torch.tensor([3, 14, 15, 92])
    builder = make_builder("corrected-sequoia", budget=8, topk=4, head_depths=1, reuse_depths=0)
    dec = SpeculativeDecoder(model, OracleDrafter(model, GAMMA, demote=0.3, seed=1), builder, Counting())
    sampler = GeneratorSampler(torch.Generator().manual_seed(0))
    out = dec.generate(prompt, 10, temperature=1.0, sampler=sampler, verifier="rejection")
    assert calls == [1] * out.num_rounds
    calls.clear()
    out = dec.generate(prompt, 10, temperature=1.0, sampler=sampler, verifier="match")
    assert len(calls) > out.num_rounds and max(calls) > 1           # matching keeps the head's tokens


def test_acceptance_from_walks_counts_the_ranks_each_node_tested():
    # rank 0: tested by all 4 nodes, accepted by 2; rank 1: tested by the 2 others, accepted once; rank 2: tested
    # once (the node that rejected all 3), never accepted -> the vector stops before it
    walks = [(3, 0), (3, 1), (3, None), (2, 0)]
    assert acceptance_from_walks(walks, min_tests=1) == (0.5, 0.25)
    assert acceptance_from_walks(walks, min_tests=3) == (0.5,)                   # rank 1 has only 2 tests
    # made non-increasing: a_1 = 1 would give P_1 = 0.5 * 1 > P_0 = 0.4... capped at P_0
    assert acceptance_from_walks([(2, 0)] * 2 + [(2, 1)] * 3, min_tests=1) == (0.4, 0.4)
    with pytest.raises(ValueError, match=r"^walks: rank 0 was tested 2 times and accepted 0 times"):
        acceptance_from_walks([(2, None), (1, None)], min_tests=1)


def test_measure_acceptance_on_rejection_decodes():
    """The real rounds of a probe decoder: a valid acceptance vector (usable as a Sequoia config), rank 0 the
    most likely; a decoder whose nodes have one child measures one rank."""
    from dartree.decode import SpeculativeDecoder
    from dartree.testing import OracleDrafter
    from dartree.verify import GeneratorSampler
    from tests.test_decode import GAMMA, model_for

    model = model_for("llama", "sdpa")
    prompts = [torch.tensor([3, 14, 15, 92]), torch.tensor([5, 8, 13])]
    drafter = OracleDrafter(model, GAMMA, demote=0.0, seed=4)     # q peaks on the target's greedy token
    probe = SpeculativeDecoder(model, drafter, make_builder("sequoia", budget=12, topk=4, acceptance=(0.2,) * 4))
    sampler = GeneratorSampler(torch.Generator().manual_seed(0))
    got = measure_acceptance(probe, prompts, 24, 1.0, sampler, min_tests=5)
    assert check_acceptance(got) == got and 1 <= len(got) <= 4
    chain = SpeculativeDecoder(model, drafter, make_builder("chain"))
    # the target's p of the drafter's peak is ~0.02 here: 64 tokens a prompt, so that rank 0 is accepted at all
    assert len(measure_acceptance(chain, prompts, 64, 1.0, sampler, min_tests=5)) == 1


def test_the_carried_head_state_is_the_state_after_the_committed_tokens():
    """Between reused rounds the engine carries the head's state after the kept block's root and the tokens
    committed since (taken from the sampled tree's states where it has them, advanced for the rest): equal to
    reading those tokens from the root, round after round."""
    from dartree.decode import SpeculativeDecoder
    from dartree.rounds import check_request
    from dartree.testing import OracleDrafter
    from dartree.verify import GeneratorSampler
    from tests.test_decode import model_for

    model = model_for("llama", "sdpa")
    head = PathHashHead()
    builder = make_builder("corrected-sequoia", budget=6, topk=3, acceptance=(0.5, 0.2), reuse_depths=1)
    dec = SpeculativeDecoder(model, OracleDrafter(model, 8, demote=0.0, seed=4), builder, head)
    req = check_request(dec.target, torch.tensor([3, 14, 15, 92]), 24, 1.0,
                        GeneratorSampler(torch.Generator().manual_seed(1)), verifier="rejection")
    engine = dec.engine(req, single=True)
    engine.admit([req])
    checked = 0
    while engine.live:
        engine.step()
        reuse = engine.drafting.reuse
        block, since = reuse.block, list(reuse.since)
        if engine.live and reuse.reusable(len(engine.live)) is not None and since:
            want = head.initial_state(block)
            for j, token in enumerate(since):
                want = head.advance(block, j + 1, want[:, None], torch.tensor([[token]]))[:, 0]
            assert torch.equal(reuse.carried(block, len(since)), want)
            checked += 1
    assert checked >= 3


def test_a_one_row_shape_is_the_row_of_a_batch():
    """``shape_tree`` of one row (its tensors made once per shape) equals that row of a two-row call."""
    from dartree.builders import SequoiaConfig
    from dartree.fast.sequoia import shape_tree

    config = SequoiaConfig(budget=6)
    for gamma in (1, 3, 8):
        one = DraftBlock(logits=torch.zeros(1, 8, 11), root=torch.tensor([4]))
        two = DraftBlock(logits=torch.zeros(2, 8, 11), root=torch.tensor([4, 9]))
        for roots in (None, torch.tensor([7])):
            got = shape_tree(one, config, gamma, roots)
            want = shape_tree(two, config, gamma, None if roots is None else torch.tensor([7, 2]))
            for name in ("tokens", "parents", "depths", "scores", "ranks", "num_nodes"):
                assert torch.equal(getattr(got, name), getattr(want, name)[:1]), (gamma, name)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "1.2", None])
def test_a_bad_proposal_temperature_is_named(bad):
    with pytest.raises(ValueError, match=r"^proposal_temperature: must be a finite number > 0 .*got"):
        make_builder("corrected-sequoia", proposal_temperature=bad)


def test_proposal_temperature_as_a_method_setting():
    method = parse_method("corrected-sequoia:budget=3,proposal_temperature=1.3")
    assert make_builder(method.builder, **method.config).config.proposal_temperature == 1.3
    assert make_builder("sequoia").config.proposal_temperature == 1.0
    with pytest.raises(ValueError, match=r"^proposal_temperature: must be a finite number > 0"):
        parse_method("corrected-sequoia:proposal_temperature=0")
    with pytest.raises(ValueError, match=r"^proposal_temperature: expected float, got 'warm'"):
        parse_method("corrected-sequoia:proposal_temperature=warm")


@pytest.mark.parametrize("ratio", [1.0, 1.5])
@pytest.mark.parametrize("verifier", ["rejection", "traversal"])
def test_the_trees_tokens_are_drawn_at_the_configured_proposal_temperature(verifier, ratio, monkeypatch):
    """The builder's ``proposal_temperature`` reaches every draw: each round's tree is drawn from the run's warp
    with its temperature times the ratio (filters kept), and the stored proposal is that draw's ``q``: the
    head's logits at the root warped so."""
    from dartree import verifiers
    from dartree.decode import SpeculativeDecoder
    from dartree.testing import OracleDrafter
    from dartree.verify import GeneratorSampler
    from dartree.verify.rejection import proposal_probs
    from dartree.verify.warp import Warp
    from tests.test_decode import GAMMA, model_for

    drawn = []
    real = verifiers.sample_tree

    def spy(template, block, head, warp, *args, **kwargs):
        sampled = real(template, block, head, warp, *args, **kwargs)
        state = head.initial_state(block) if kwargs["root_state"] is None else kwargs["root_state"]
        every = torch.arange(block.vocab_size).expand(1, -1)
        logits = head.logits(block, kwargs["offset"] + 1, state[:, None], every)[:, 0]
        drawn.append((warp, sampled.probs[0, int(sampled.row_of[0, 0])], proposal_probs(warp, logits)[0]))
        return sampled

    monkeypatch.setattr(verifiers, "sample_tree", spy)
    model = model_for("llama", "sdpa")
    builder = make_builder("corrected-sequoia", budget=6, topk=3, proposal_temperature=ratio)
    dec = SpeculativeDecoder(model, OracleDrafter(model, GAMMA, demote=0.3, seed=1), builder, PathHashHead())
    sampler = GeneratorSampler(torch.Generator().manual_seed(0))
    out = dec.generate(torch.tensor([3, 14, 15, 92]), 12, temperature=0.7, sampler=sampler, top_k=5,
                       verifier=verifier)
    assert len(drawn) == out.num_rounds > 1
    for warp, stored, want in drawn:
        assert warp == Warp(0.7 * ratio, top_k=5)
        torch.testing.assert_close(stored, want, rtol=0, atol=0)


def test_a_proposal_temperature_past_the_temperature_range_is_named_at_decode():
    from dartree.decode import SpeculativeDecoder
    from dartree.testing import OracleDrafter
    from dartree.verify import GeneratorSampler
    from tests.test_decode import GAMMA, model_for

    model = model_for("llama", "sdpa")
    builder = make_builder("corrected-sequoia", budget=4, topk=3, proposal_temperature=1e9)
    dec = SpeculativeDecoder(model, OracleDrafter(model, GAMMA, seed=1), builder, PathHashHead())
    with pytest.raises(ValueError, match=r"^proposal_temperature: 1000000000.0 times the run's temperature 1.0 is "):
        dec.generate(torch.tensor([3, 14, 15]), 4, temperature=1.0,
                     sampler=GeneratorSampler(torch.Generator().manual_seed(0)), verifier="traversal")
