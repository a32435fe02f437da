"""Traversal Verification (dartree.verify.traversal) is lossless in distribution, shown three ways.

1. **Exact**: one round's output distribution, by enumerating every draw of the tree (without replacement,
   sample_tree's cut included) and every decision of the verifier's own walk (:func:`traverse`, replayed
   with each prefix of coin outcomes), extended by the target's exact AR continuation, equals the target's
   joint (1e-12) on tiny vocabularies: chains, a root with several children, depth 2-3, proposals per depth
   and per path, warps (top-k, top-p, min-p), a proposal with zero mass on tokens, a one-hot target.
2. **Seeded Monte Carlo** of the real code (sample_tree + verify_traversal): one round against the target's
   joint, chi-square bounds with fixed seeds (rounds in a row: tests/test_sampling_decode.py, a real model).
3. **Biased variants** (every acceptance x1.05; the parent's weight never updated) fail the exact check and
   the Monte Carlo one.

And the expected acceptance length, exact, is at least recursive rejection's on the same trees.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
import torch

from dartree.verify import traversal
from dartree.verify.rejection import SampledTree
from dartree.verify.traversal import traverse, verify_traversal
from dartree.verify.warp import Warp
from tests.verify import test_rejection_distribution as rd
from tests.verify.helpers import one_thread  # noqa: F401 (autouse fixture)
from tests.verify.test_rejection_distribution import (
    SHAPES,
    WARPS,
    WORLDS,
    World,
    chi_square,
    extended,
    kids_of,
    probs,
    round_distribution,
    target_joint,
    within,
    wor_sequences,
)


def variant(world: World, kind: str) -> World:
    """``world`` with proposals of zero mass on tokens 0 and 1 (``"zero-q"``), or a one-hot target at the root
    and at every path ending in token 1 (``"one-hot"``)."""
    out = replace(world)
    if kind == "zero-q":
        depth_q, path_q = world.depth_q.copy(), {k: v.copy() for k, v in world.path_q.items()}
        depth_q[:, :2] = -np.inf
        for v in path_q.values():
            v[:2] = -np.inf
        object.__setattr__(out, "depth_q", depth_q)
        object.__setattr__(out, "path_q", path_q)
    elif kind == "one-hot":
        target = dict(world.target)
        for key in target:
            if key == () or key[-1] == 1:
                hot = np.full(world.vocab, -np.inf)
                hot[len(key) % world.vocab] = 0.0
                target[key] = hot
        object.__setattr__(out, "target", target)
    else:
        raise ValueError(kind)
    return out


class _Branch(Exception):
    def __init__(self, a: float) -> None:
        self.a = a


def decisions(run):
    """Every outcome of ``run(coin)`` with its probability: ``run`` is replayed with each prefix of coin
    outcomes, and a coin past the prefix branches into True (probability ``a``) and False (``1 - a``)."""
    stack = [((), 1.0)]
    while stack:
        prefix, pr = stack.pop()
        used = 0

        def coin(a: float, prefix=prefix) -> bool:
            nonlocal used
            if used < len(prefix):
                used += 1
                return prefix[used - 1]
            raise _Branch(a)

        try:
            out = run(coin)
        except _Branch as branch:
            a = min(1.0, branch.a)
            if a > 0:
                stack.append((prefix + (True,), pr * a))
            if a < 1:
                stack.append((prefix + (False,), pr * (1 - a)))
            continue
        yield out, pr


def tree_draws(world: World, parents: list[int], head: bool, warp: Warp):
    """Every draw of the tree's tokens (sample_tree's law: children without replacement from the proposal at
    their parent, cut to its tokens of positive mass) with its probability: (children, tokens, paths, pr)."""
    kids, n = kids_of(parents), len(parents)

    def proposal(path):
        return probs(world.path_q[path], warp) if head else probs(world.depth_q[len(path)], warp)

    def rec(u: int, tokens: dict, paths: dict, pr: float):
        if u == n:
            children = [[c for c in kids[v] if c in tokens] for v in range(n)]
            yield children, [tokens.get(v, -1) for v in range(n)], paths, pr
            return
        if u not in paths or not kids[u]:
            yield from rec(u + 1, tokens, paths, pr)
            return
        q = proposal(paths[u])
        m = min(len(kids[u]), int((q > 0).sum()))
        for seq, p in wor_sequences(q, m):
            t, ps = dict(tokens), dict(paths)
            for c, x in zip(kids[u], seq, strict=False):     # children past m are cut
                t[c], ps[c] = x, paths[u] + (x,)
            yield from rec(u + 1, t, ps, pr * p)

    yield from rec(0, {0: -1}, {0: ()}, 1.0)


def traversal_distribution(world: World, parents: list[int], head: bool, warp: Warp, bias=None) -> dict:
    """Exact distribution of one round's committed tokens under Traversal Verification (the verifier's own
    :func:`traverse`); ``bias``: a function of the acceptance probability (a deliberately wrong verifier)."""
    out: dict = {}
    for children, tokens, paths, pr in tree_draws(world, parents, head, warp):
        def target(u, paths=paths):
            return probs(world.target[paths[u]], warp)

        def proposal(u, paths=paths):
            return probs(world.path_q[paths[u]], warp) if head else probs(world.depth_q[len(paths[u])], warp)

        def run(coin, children=children, tokens=tokens, target=target, proposal=proposal):
            return traverse(children, tokens, target, proposal, coin if bias is None else lambda a: coin(bias(a)))

        for (path, bonus), p in decisions(run):
            seq = tuple(tokens[u] for u in path[1:])
            for v in np.flatnonzero(bonus > 0):
                out[seq + (int(v),)] = out.get(seq + (int(v),), 0.0) + pr * p * bonus[v]
    return out


#: (world, shape, warp, proposals per path): "small" is a root with two children, the first with one of its own
CASES = [("V4g2", "chain", "T1", False), ("V4g2", "fan", "T1", True), ("V4g2", "small", "T0.7-topk2", True),
         ("V4g2", "tree", "T1", False), ("V3g3", "chain3", "topp0.8", True), ("V3g3", "deep", "T1", True),
         ("V5g2", "fan", "T1.3-minp0.3", False), ("V4g2-zero-q", "tree", "T1", True),
         ("V4g2-zero-q", "fan", "T1", False), ("V3g3-one-hot", "deep", "T1", False),
         ("V4g2-one-hot", "small", "T0.7-topk2", True)]
SHAPES = {**SHAPES, "small": [-1, 0, 0, 1]}


def world_of(name: str) -> World:
    base, _, kind = name.partition("-")
    return variant(WORLDS[base], kind) if kind else WORLDS[base]


@pytest.mark.parametrize("world,shape,warp,head", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_one_round_is_exactly_the_target(world, shape, warp, head):
    w, world = WARPS[warp], world_of(world)
    dist = traversal_distribution(world, SHAPES[shape], head, w)
    assert abs(sum(dist.values()) - 1) < 1e-12
    np.testing.assert_allclose(extended(world, dist, w), target_joint(world, w), atol=1e-12, rtol=0)


_after_deletion = traversal.after_deletion


def _stale_weight(w, r, s, x):
    """The parent's target and proposal updated, its weight not (a wrong Block Verification residual)."""
    return (w, *_after_deletion(w, r, s, x)[1:])


@pytest.mark.parametrize("world,shape", [("V4g2", "chain"), ("V4g2", "small"), ("V3g3", "chain3"),
                                         ("V4g2-zero-q", "fan")])
def test_the_exact_check_catches_biased_variants(world, shape, monkeypatch):
    w, world = WARPS["T1"], world_of(world)
    truth = target_joint(world, w)
    biased = traversal_distribution(world, SHAPES[shape], True, w, bias=lambda a: min(1.0, 1.05 * a))
    assert np.abs(extended(world, biased, w) - truth).max() > 1e-4
    if shape == "fan":            # the root's weight is 1 and stays 1 (recursive rejection): nothing to miss
        return
    monkeypatch.setattr(traversal, "after_deletion", _stale_weight)
    stale = traversal_distribution(world, SHAPES[shape], True, w)
    assert np.abs(extended(world, stale, w) - truth).max() > 1e-4


def mean_accepted(dist: dict) -> float:
    return sum(p * (len(seq) - 1) for seq, p in dist.items())


#: exact expected accepted lengths, Traversal Verification against recursive rejection, proposals per path, T=1.
#: On 210 random instances (seeds 40-59, a script, 2026-12-05) traversal was never below; accepted drafts +3.4% on
#: "tree", +7.1% "deep", +12.5% "chain3", +6.2% "chain" (means; tau +1.7 / 4.3 / 5.9 / 2.3%), and equal on "fan" (depth
#: one: every weight is the root's, 1, and the walk is recursive rejection)
GAIN_CASES = [(World(4, 2, 21), "chain"), (World(4, 2, 22), "small"), (World(3, 3, 23), "chain3"),
              (World(4, 2, 25), "fan"), (World(3, 3, 27), "deep"), (World(5, 2, 28), "small")]


def test_expected_acceptance_is_at_least_recursive_rejections():
    w = WARPS["T1"]
    gains = []
    for world, shape in GAIN_CASES:
        tv = mean_accepted(traversal_distribution(world, SHAPES[shape], True, w))
        rrs = mean_accepted(round_distribution(world, SHAPES[shape], True, w))
        assert tv >= rrs - 1e-12, (world, shape, tv, rrs)
        gains.append(tv / rrs - 1)
    assert max(gains) > 0.01 and min(gains) >= 0, gains


# ----------------------------------------------------------------------------------------------- Monte Carlo
MC_CASES = [("V4g2", "tree", False, "T1", 3000), ("V3g3", "deep", 1, "T0.7-topk2", 1500)]


@pytest.mark.parametrize("world,shape,head,warp,draws", MC_CASES, ids=["-".join(map(str, c)) for c in MC_CASES])
def test_monte_carlo_of_one_round_matches_the_target(world, shape, head, warp, draws, monkeypatch):
    monkeypatch.setattr(rd, "verify_rejection", verify_traversal)
    w, world = WARPS[warp], WORLDS[world]
    stat, df = chi_square(rd.sample_rounds(world, SHAPES[shape], head, w, draws, seed=11), target_joint(world, w))
    assert within(stat, df), (stat, df)


def test_monte_carlo_catches_a_stale_weight(monkeypatch):
    monkeypatch.setattr(rd, "verify_rejection", verify_traversal)
    monkeypatch.setattr(traversal, "after_deletion", _stale_weight)
    world, w = WORLDS["V4g2"], WARPS["T1"]
    stat, df = chi_square(rd.sample_rounds(world, SHAPES["tree"], True, w, 1500, seed=11), target_joint(world, w))
    assert not within(stat, df), (stat, df)


# ------------------------------------------------------------------------------------------ contract, errors
def test_a_chain_accepted_whole_and_the_root_alone():
    """Hand-checked: target == proposal accepts every draft; a target with no mass on the drafts accepts none
    and draws the bonus from the target itself."""
    p = np.array([0.5, 0.3, 0.2])
    children, tokens = [[1], [2], []], [-1, 0, 1]
    path, bonus = traverse(children, tokens, lambda u: p, lambda u: p, lambda a: a >= 1)
    assert path == [0, 1, 2] and np.array_equal(bonus, p)
    hot = np.array([0.0, 0.0, 1.0])
    path, bonus = traverse(children, tokens, lambda u: hot, lambda u: p, lambda a: bool(a > 0))
    assert path == [0] and np.allclose(bonus, hot)


def test_errors_name_the_argument():
    block = rd.DraftBlock(logits=torch.zeros(1, 2, 4), root=torch.zeros(1, dtype=torch.int64))
    sampled = rd.sample_tree(rd.template([[-1, 0, 1]]), block, None, Warp(1.0), torch.Generator().manual_seed(0))
    assert isinstance(sampled, SampledTree)
    with pytest.raises(ValueError, match="sampled"):
        verify_traversal(sampled.tree, torch.zeros(1, 3, 4), Warp(1.0))
    with pytest.raises(ValueError, match="warp"):
        verify_traversal(sampled, torch.zeros(1, 3, 4), 1.0)
    with pytest.raises(ValueError, match="target_logits"):
        verify_traversal(sampled, torch.zeros(1, 2, 4), Warp(1.0))
    with pytest.raises(ValueError, match="target_logits"):
        verify_traversal(sampled, torch.zeros(1, 3, 4, dtype=torch.int64), Warp(1.0))


def test_result_contract_matches_rejection():
    """Accepted nodes form a root path, tokens are the path's then the bonus, picks are PAD."""
    world, w = WORLDS["V4g2"], WARPS["T1"]
    g = torch.Generator().manual_seed(3)
    rows = 64
    block = rd.DraftBlock(logits=torch.tensor(world.depth_q, dtype=torch.float32)[None].expand(rows, -1, -1),
                          root=torch.zeros(rows, dtype=torch.int64))
    sampled = rd.sample_tree(rd.template([SHAPES["wide"]] * rows), block, None, w, g)
    tree = sampled.tree
    logits = torch.stack([torch.stack([torch.tensor(world.target[p], dtype=torch.float32)
                                       for p in itertools.chain(rd.node_paths(tree, r),
                                                                [()] * (tree.max_nodes - int(tree.num_nodes[r])))])
                          for r in range(rows)])
    out = verify_traversal(sampled, logits, w, g)
    parents = tree.parents.tolist()
    for r in range(rows):
        k = int(out.accepted_length[r])
        path = out.accepted[r, : k + 1].tolist()
        assert path[0] == 0 and all(parents[r][path[i + 1]] == path[i] for i in range(k))
        assert out.tokens[r, :k].tolist() == [int(tree.tokens[r, u]) for u in path[1:]]
        assert int(out.tokens[r, k]) == int(out.bonus[r])
        assert (out.tokens[r, k + 1:] == -1).all() and (out.accepted[r, k + 1:] == -1).all()
    assert (out.picks == -1).all()
    assert int(out.accepted_length.max()) >= 2


def test_a_tree_of_the_root_alone_commits_the_bonus():
    """A row cut to its root (no inner node: nothing read in the batched softmax) beside one with a child."""
    block = rd.DraftBlock(logits=torch.zeros(2, 2, 4), root=torch.zeros(2, dtype=torch.int64))
    sampled = rd.sample_tree(rd.template([[-1], [-1, 0]]), block, None, Warp(1.0), torch.Generator().manual_seed(0))
    logits = torch.full((2, 2, 4), -30.0)
    logits[0, 0, 2] = 0.0                                          # the root's target: token 2
    out = verify_traversal(sampled, logits, Warp(1.0), torch.Generator().manual_seed(0))
    assert out.accepted[0].tolist() == [0, -1] and out.tokens[0].tolist() == [2, -1]
    assert int(out.accepted_length[0]) == 0 and int(out.bonus[0]) == 2


@pytest.mark.parametrize("vocab", [5, 111])
def test_one_row_read_at_once_is_the_row_in_a_batch(vocab, monkeypatch):
    """A one-row Sequoia-shaped tree (its inner nodes first: targets and proposals widened at once) gives the bits
    of the same row verified in a batch of two (read node by node): the distributions the walk reads and its
    outcome, for many draws and targets."""
    seen: list[list[np.ndarray]] = []
    walk = traversal.traverse

    def recording(children, tokens, target, proposal, coin):
        read = seen[-1]
        return walk(children, tokens, lambda u: read.append(target(u)) or read[-1],
                    lambda u: read.append(proposal(u)) or read[-1], coin)

    monkeypatch.setattr(traversal, "traverse", recording)
    torch.manual_seed(0)
    for seed in range(60):
        block = rd.DraftBlock(logits=torch.randn(1, 3, vocab) * 3, root=torch.zeros(1, dtype=torch.int64))
        one = rd.sample_tree(rd.template([[-1, 0, 1, 2, 0]]), block, None, Warp(1.0),
                             torch.Generator().manual_seed(seed))
        tree = one.tree
        two = SampledTree(replace(tree, **{f: torch.cat([getattr(tree, f)] * 2) for f in
                                            ("tokens", "parents", "depths", "scores", "ranks", "num_nodes")}),
                          torch.cat([one.probs] * 2), torch.cat([one.row_of] * 2))
        logits = torch.randn(1, 5, vocab) * (1 + seed % 4)
        seen.append([])
        got = verify_traversal(one, logits, Warp(1.0), torch.Generator().manual_seed(seed))
        seen.append([])
        want = verify_traversal(two, torch.cat([logits] * 2), Warp(1.0), torch.Generator().manual_seed(seed))
        mine, batch = seen[-2], seen[-1][: len(seen[-2])]                  # the batch's row 0 is walked first
        assert len(mine) >= 2 and all(np.array_equal(a, b) for a, b in zip(mine, batch, strict=True)), seed
        for field in ("accepted", "tokens", "accepted_length", "bonus"):
            assert torch.equal(getattr(got, field)[0], getattr(want, field)[0]), (seed, field)
