"""Sampled trees and the rejection verifier: structure, the draw's law, one-hot reductions, format, errors.

The distribution tests (exact enumeration, Monte Carlo, biased verifiers) are in
``test_rejection_distribution.py``; here: what every sampled tree must be (any builder's shape, tokens from
the proposal, siblings distinct, proposals stored per depth or per node along the sampled path), the law of
the draws without replacement, reductions whose outcome is certain (a one-hot target is the greedy walk; a
target equal to the proposal accepts the first child), the result's format, and errors by name.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch

from dartree import BUILDERS, make_builder
from dartree.block import DraftBlock
from dartree.builders import builder_spec
from dartree.scoring import candidates as top_candidates
from dartree.testing.heads import PathHashHead
from dartree.tree import PAD
from dartree.verify import SampledTree, Warp, rejection, sample_tree, verify_greedy, verify_rejection
from dartree.verify.rejection import draw_index, proposal_row
from dartree.verify.traversal import children_of
from tests.verify.helpers import make_tree, one_thread  # noqa: F401 (autouse fixture)

V, GAMMA = 37, 3


def block_of(b: int, seed: int, vocab: int = V, gamma: int = GAMMA) -> DraftBlock:
    g = torch.Generator().manual_seed(seed)
    return DraftBlock(logits=torch.randn(b, gamma, vocab, generator=g) * 2,
                      root=torch.randint(0, vocab, (b,), generator=g))


def built(name: str, block: DraftBlock):
    head = PathHashHead() if builder_spec(name).needs_head else None
    fields = {f.name for f in dataclasses.fields(builder_spec(name).config_cls)}
    config = {k: v for k, v in dict(budget=7, width=3, topk=8).items() if k in fields}
    return make_builder(name, "ref", **config).build(block, head), head


def check_sampled(sampled: SampledTree, template, block: DraftBlock) -> None:
    """Same shape as the template, root kept, tokens in the vocabulary, siblings distinct, proposals stored."""
    tree = sampled.tree
    tree.validate(gamma=block.gamma, vocab_size=block.logits.shape[-1])
    for name in ("parents", "depths", "num_nodes"):
        assert torch.equal(getattr(tree, name), getattr(template, name)), name
    assert torch.equal(tree.tokens[:, 0], template.tokens[:, 0])
    for r in range(tree.batch_size):
        has_kids = set(tree.parents[r, 1: int(tree.num_nodes[r])].tolist())
        for u in range(tree.max_nodes):
            assert (int(sampled.row_of[r, u]) != PAD) == (u in has_kids)
    made = sampled.host_lists()             # sample_tree's host lists, when kept, are the tree's own
    if made is not None:
        assert made.children == children_of(tree) and made.tokens == tree.tokens.tolist()
        assert made.row_of == sampled.row_of.tolist()
        assert made.stated == (None if sampled.stated is None else sampled.stated.tolist())
    assert dataclasses.replace(sampled, row_of=sampled.row_of.clone()).host_lists() is None
    assert dataclasses.replace(sampled, tree=dataclasses.replace(tree)).host_lists() is None


@pytest.mark.parametrize("name", BUILDERS)
def test_every_builders_shape_with_tokens_from_the_drafter(name):
    block = block_of(3, seed=1)
    template, _ = built(name, block)
    sampled = sample_tree(template, block, None, Warp(0.8), torch.Generator().manual_seed(0))
    check_sampled(sampled, template, block)
    deepest = int(template.depths.max())             # per depth with parents (0 .. deepest - 1), not per node
    assert sampled.support is None and sampled.probs.shape == (3, deepest, V)
    torch.testing.assert_close(sampled.probs, Warp(0.8).logits(block.logits[:, :deepest]).softmax(-1))
    for r in range(3):
        for u in range(template.max_nodes):
            if int(sampled.row_of[r, u]) != PAD:
                assert int(sampled.row_of[r, u]) == int(template.depths[r, u])


@pytest.mark.parametrize("name", [n for n in BUILDERS if builder_spec(n).needs_head])
def test_head_proposals_follow_the_sampled_path(name):
    """One head ``logits`` and one ``advance`` call per depth; each node's stored proposal is the head's warped
    distribution over its depth's candidates, given the node's own sampled path (recomputed node by node)."""
    block = block_of(3, seed=2)
    template, head = built(name, block)
    calls: list[tuple[str, int]] = []

    class Counting:
        def initial_state(self, block):
            return head.initial_state(block)

        def logits(self, block, depth, states, candidates):
            calls.append(("logits", depth))
            return head.logits(block, depth, states, candidates)

        def advance(self, block, depth, states, tokens):
            calls.append(("advance", depth))
            return head.advance(block, depth, states, tokens)

    warp, k = Warp(1.2, top_p=0.9), 12
    sampled = sample_tree(template, block, Counting(), warp, torch.Generator().manual_seed(1), topk=k)
    check_sampled(sampled, template, block)
    deepest = int(template.depths.max())
    # the deepest children have no children: no state is made for them
    assert calls == [(kind, d) for d in range(1, deepest + 1) for kind in ("logits", "advance")][:-1]
    cand = top_candidates(block, k, "candidates").tokens
    tree = sampled.tree
    for r in range(3):
        for u, path_nodes in enumerate(tree.node_paths(r)):            # root excluded from each path
            if int(sampled.row_of[r, u]) == PAD:
                continue
            one = DraftBlock(logits=block.logits[r: r + 1], root=block.root[r: r + 1])
            state = head.initial_state(one)[:, None]
            for d, node in enumerate(path_nodes, start=1):
                state = head.advance(one, d, state, tree.tokens[r: r + 1, node][:, None])
            d = len(path_nodes) + 1                                                # the children's depth
            want = warp.probs(head.logits(one, d, state, cand[r: r + 1, d - 1]))[0, 0]
            torch.testing.assert_close(sampled.probs[r, sampled.row_of[r, u]], want)
            assert torch.equal(sampled.support[r, sampled.row_of[r, u]], cand[r, d - 1])
            full = proposal_row(*sampled.host_proposals(), r, int(sampled.row_of[r, u]), V)
            kids = [i for i in range(int(tree.num_nodes[r])) if int(tree.parents[r, i]) == u]
            assert all(full[int(tree.tokens[r, i])] > 0 for i in kids)              # drawn from the proposal


class VocabHead(PathHashHead):
    """PathHashHead with the optional ``vocab_logits`` (its logits of every token), counting its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.vocab_calls = 0

    def vocab_logits(self, block, depth, states):
        self.vocab_calls += 1
        return self.logits(block, depth, states, torch.arange(block.logits.shape[-1]).expand(block.batch_size, -1))


@pytest.mark.parametrize("head_depths", [None, 1, 2])
@pytest.mark.parametrize("vocab", [False, True], ids=["logits", "vocab_logits"])
def test_head_proposals_over_the_vocabulary(vocab, head_depths):
    """``topk=None``: a node's proposal is the head's warped distribution over every token given the node's
    sampled path (through ``vocab_logits`` when the head has it), at depths ``<= head_depths``; deeper, the
    drafter's at the children's depth; stored per node, no support."""
    block = block_of(3, seed=5)
    template = make_builder("dartree-pruned", "ref", budget=9, width=3, topk=8).build(block, PathHashHead())
    head = VocabHead() if vocab else PathHashHead()
    warp = Warp(0.9, top_k=20)
    sampled = sample_tree(template, block, head, warp, torch.Generator().manual_seed(4), head_depths=head_depths)
    check_sampled(sampled, template, block)
    # one proposal row a parent node (a depth's parents padded to the batch's most), looked up through row_of
    assert sampled.support is None and sampled.probs.shape[0::2] == (3, V)
    assert sampled.probs.shape[1] <= template.max_nodes
    assert not vocab or head.vocab_calls == min(int(template.depths.max()), head_depths or GAMMA)
    every = torch.arange(V)[None]
    tree, checked = sampled.tree, 0
    for r in range(3):
        for u, path_nodes in enumerate(tree.node_paths(r)):
            if int(sampled.row_of[r, u]) == PAD:
                continue
            one = DraftBlock(logits=block.logits[r: r + 1], root=block.root[r: r + 1])
            d = len(path_nodes) + 1                                                # the children's depth
            if head_depths is None or d <= head_depths:
                state = head.initial_state(one)[:, None]
                for depth, node in enumerate(path_nodes, start=1):
                    state = head.advance(one, depth, state, tree.tokens[r: r + 1, node][:, None])
                want = warp.probs(head.logits(one, d, state, every))[0, 0]
            else:
                want = warp.probs(block.logits[r, d - 1])
            torch.testing.assert_close(sampled.probs[r, sampled.row_of[r, u]], want)
            q = proposal_row(*sampled.host_proposals(), r, int(sampled.row_of[r, u]), V)
            kids = [i for i in range(int(tree.num_nodes[r])) if int(tree.parents[r, i]) == u]
            assert all(q[int(tree.tokens[r, i])] > 0 for i in kids)
            checked += d > (head_depths or GAMMA)
    assert head_depths is None or head_depths >= GAMMA or checked > 0         # the drafter's rows were checked


@pytest.mark.parametrize("head", [False, True], ids=["drafter-q", "head-q"])
def test_a_node_keeps_no_more_children_than_its_proposal_has_tokens(head):
    """top-k 2 on the proposal: every node keeps at most 2 children (the cut is prefix-closed), and the kept
    nodes' proposals are still theirs (rows remapped)."""
    block = block_of(2, seed=3)
    template, h = built("dartree-fixed" if head else "ddtree", block)
    h = h if head else None
    assert max(sum(1 for p in template.parents[r].tolist() if p == u) for r in range(2) for u in range(3)) > 2
    warp = Warp(1.0, top_k=2)
    sampled = sample_tree(template, block, h, warp, torch.Generator().manual_seed(2), topk=V)
    tree = sampled.tree
    tree.validate(gamma=GAMMA, vocab_size=V)
    assert (tree.num_nodes < template.num_nodes).any()
    for r in range(2):
        count = int(tree.num_nodes[r])
        for u in range(count):
            kids = [i for i in range(count) if int(tree.parents[r, i]) == u]
            assert len(kids) <= 2
            if kids:
                q = proposal_row(*sampled.host_proposals(), r, int(sampled.row_of[r, u]), V)
                assert (q > 0).sum() == 2 and all(q[int(tree.tokens[r, i])] > 0 for i in kids)
                if not head:
                    np.testing.assert_allclose(q, warp.probs(block.logits[r, int(tree.depths[r, u])]).double().numpy(),
                                               atol=1e-7)


@pytest.mark.parametrize("shape", [(1, 1, 111), (1, 111), (111,), (1, 1, 4098)])
@pytest.mark.parametrize("m", [1, 2, 3])
def test_one_row_draws_on_the_host_are_the_tensor_draws(shape, m):
    """``_draws`` of one CPU row (the point and the search, or the masses, read on the host) gives the tokens,
    counts and generator state of ``_draw_without_replacement`` plus the gather of the masses, bit for bit."""
    torch.manual_seed(0)
    for trial in range(300):
        q = (torch.randn(shape) * 6).softmax(-1)
        if trial % 3 == 0:
            q[..., : shape[-1] // 2] = 0                  # tokens of mass 0, first in the cumulative sums
        if trial % 5 == 0:
            q.zero_()
            q[..., -1] = 1.0                              # all the mass on the last token: u * total may round up
        seeds = [torch.Generator().manual_seed(trial) for _ in range(2)]
        drawn = rejection._draw_without_replacement(q, m, seeds[0])
        want = drawn.tolist(), (q.gather(-1, drawn) > 0).sum(-1).tolist()
        assert rejection._draws(q, m, seeds[1]) == want
        assert torch.equal(seeds[0].get_state(), seeds[1].get_state())


@pytest.mark.parametrize("m", [1, 2, 3])
def test_draws_without_replacement_have_the_sequential_law(m):
    """The first m draws (one: inverse CDF; more: Gumbel-top-m) against the exact sequential law; a token of
    mass 0 never comes before the positive ones."""
    q = torch.tensor([0.4, 0.0, 0.25, 0.2, 0.1, 0.05])
    n = 40_000
    drawn = rejection._draw_without_replacement(q.expand(n, -1), m, torch.Generator().manual_seed(m))
    assert drawn.shape == (n, m)
    counts: dict[tuple[int, ...], int] = {}
    for row in drawn.tolist():
        counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    exact = {}
    for seq in itertools.permutations([0, 2, 3, 4, 5], m):
        pr, left = 1.0, q.double().numpy().copy()
        for x in seq:
            pr *= left[x] / left.sum()
            left[x] = 0.0
        exact[seq] = pr
    assert set(counts) <= set(exact)                                     # distinct, never token 1
    stat = sum((counts.get(s, 0) - n * p) ** 2 / (n * p) for s, p in exact.items())
    assert stat < 2 * (len(exact) - 1) + 30, stat


def test_draw_index_never_picks_a_token_of_mass_0():
    p = np.array([0.0, 0.3, 0.0, 0.7, 0.0, 0.0])
    assert draw_index(p, 0.0) == 1 and draw_index(p, 0.29) == 1 and draw_index(p, 0.31) == 3
    assert draw_index(p, float(np.nextafter(1.0, 0.0))) == 3
    assert draw_index(np.array([0.0, 1e-300, 0.0]), 0.999) == 1


def test_draw_index_sums_as_numpy_does():
    """draw_index takes torch's cumulative sum for numpy's (perf): the same float64 sums, so the same token."""
    rng = np.random.default_rng(3)
    for trial in range(200):
        p = rng.random(int(rng.integers(1, 5000))) ** rng.uniform(1, 30)
        if trial % 2:
            p[rng.random(p.shape[0]) < 0.6] = 0.0
        assert np.array_equal(torch.from_numpy(p).cumsum(0).numpy(), np.cumsum(p))
        for u in rng.random(5):
            cdf = np.cumsum(p)
            want = min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), int(np.flatnonzero(p > 0)[-1])) \
                if p.any() else None
            if want is not None:
                assert draw_index(p, float(u)) == want


def batch_tree_and_logits(seed: int):
    """Three rows of different sizes (a ddtree, padding) and random target logits for their nodes."""
    block = block_of(3, seed=seed)
    template = make_builder("ddtree", "ref", budget=6, topk=8).build(block, None)
    keep = torch.arange(template.max_nodes)[None, :] < torch.tensor([[7], [4], [1]])
    template = template.select(keep)
    g = torch.Generator().manual_seed(seed + 100)
    return block, template, torch.randn(3, template.max_nodes, V, generator=g) * 2


@pytest.mark.parametrize("seed", range(6))
def test_a_one_hot_target_is_the_greedy_walk(seed):
    """Target top-k 1 (p one-hot): a child is accepted iff it is the target's argmax, and the bonus is the
    argmax: exactly the greedy verifier's result, whatever was drawn."""
    block, template, logits = batch_tree_and_logits(seed)
    # the drafter proposes the target's argmax often enough for some rounds to accept
    block = DraftBlock(logits=block.logits.clone(), root=block.root)
    sampled = sample_tree(template, block, None, Warp(1.0), torch.Generator().manual_seed(seed))
    got = verify_rejection(sampled, logits, Warp(1.0, top_k=1), torch.Generator().manual_seed(seed))
    want = verify_greedy(sampled.tree, logits)
    for name in ("accepted", "accepted_length", "bonus", "tokens"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert (got.picks == PAD).all()


def test_greedy_reduction_accepts_when_the_draft_is_the_argmax():
    """The one-hot check above is not vacuous: with a target whose argmax is the drafter's sure token, the
    walk accepts the whole first path."""
    block, template, _ = batch_tree_and_logits(0)
    peaked = torch.full_like(block.logits, -30.0)
    peaked[..., 5] = 30.0                                   # q = one-hot token 5 at every depth
    block = DraftBlock(logits=peaked, root=block.root)
    sampled = sample_tree(template, block, None, Warp(1.0), torch.Generator().manual_seed(0))
    logits = torch.zeros(3, template.max_nodes, V)
    logits[..., 5] = 10.0
    out = verify_rejection(sampled, logits, Warp(1.0, top_k=1), torch.Generator().manual_seed(0))
    assert out.accepted_length.tolist() == [int(template.depths[r].max()) for r in range(3)]
    assert all(t == 5 for row in out.tokens.tolist() for t in row if t >= 0)


def test_a_target_equal_to_the_proposal_accepts_the_first_child():
    """p == q at every node: the first child is accepted with probability 1, down to a leaf."""
    block, template, _ = batch_tree_and_logits(1)
    warp = Warp(0.9, top_k=20)
    sampled = sample_tree(template, block, None, warp, torch.Generator().manual_seed(3))
    tree = sampled.tree
    depth = tree.depths.clamp(0, GAMMA - 1)
    logits = torch.gather(block.logits, 1, depth[:, :, None].expand(-1, -1, V))      # node u: q at its children
    out = verify_rejection(sampled, logits, warp, torch.Generator().manual_seed(4))
    for r in range(3):
        u, path = 0, [0]
        while True:
            kids = [i for i in range(int(tree.num_nodes[r])) if int(tree.parents[r, i]) == u]
            if not kids:
                break
            u = kids[0]
            path.append(u)
        assert out.accepted[r].tolist() == path + [PAD] * (tree.max_nodes - len(path))


def test_the_result_format_and_reproducibility():
    block, template, logits = batch_tree_and_logits(2)
    warp = Warp(1.0)
    runs = []
    for _ in range(2):
        g = torch.Generator().manual_seed(9)
        sampled = sample_tree(template, block, None, warp, g)
        runs.append((sampled, verify_rejection(sampled, logits, warp, g)))
    (sampled, out), (_, again) = runs
    for name in ("accepted", "accepted_length", "bonus", "tokens", "picks"):
        assert torch.equal(getattr(out, name), getattr(again, name)), name
    tree, n = sampled.tree, sampled.tree.max_nodes
    assert out.accepted.shape == out.tokens.shape == (3, n) and out.bonus.shape == (3,)
    for r in range(3):
        k = int(out.accepted_length[r])
        path = out.accepted[r].tolist()
        assert path[0] == 0 and all(x == PAD for x in path[k + 1:])
        assert all(int(tree.parents[r, path[i + 1]]) == path[i] for i in range(k))
        assert out.tokens[r].tolist() == [int(tree.tokens[r, i]) for i in path[1: k + 1]] + [int(out.bonus[r])] \
            + [PAD] * (n - k - 1)
    assert int(out.accepted_length[2]) == 0                                  # a root without children
    # many seeds: the rows do accept drafts, and not always the same ones
    lengths = set()
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        lengths.add(tuple(verify_rejection(sample_tree(template, block, None, warp, g), logits, warp, g)
                          .accepted_length.tolist()))
    assert len(lengths) > 1


def test_errors_name_the_argument():
    block, template, logits = batch_tree_and_logits(3)
    sampled = sample_tree(template, block, None, Warp(1.0), None)
    cases = [
        (lambda: sample_tree("tree", block), "template"),
        (lambda: sample_tree(template, block, None, 1.0), "warp"),
        (lambda: sample_tree(template, block, PathHashHead(), Warp(1.0), None, topk=0), "topk"),
        (lambda: sample_tree(template, block_of(2, seed=0)), "template: 3 rows"),
        (lambda: sample_tree(template, block_of(3, seed=0, gamma=1)), "gamma"),
        (lambda: verify_rejection(template, logits, Warp(1.0)), "sampled"),
        (lambda: verify_rejection(sampled, logits, 1.0), "warp"),
        (lambda: verify_rejection(sampled, logits[:, :-1], Warp(1.0)), "target_logits"),
        (lambda: verify_rejection(sampled, logits.long(), Warp(1.0)), "target_logits"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()


def test_proposal_top_p_is_the_nucleus_of_the_most_likely_tokens():
    """``proposal_probs``: the warp's distribution where the nucleus fits in ``NUCLEUS_CANDIDATES`` tokens (the
    descending rule keeps the tokens transformers' ascending one keeps), else the nucleus cut to that many;
    without top-p, ``warp.probs`` itself."""
    from dartree.verify.rejection import NUCLEUS_CANDIDATES, proposal_probs
    g = torch.Generator().manual_seed(9)
    peaked = torch.randn(4, 1000, generator=g) * 4                  # a nucleus of a few dozen tokens
    for warp in (Warp(0.8, top_p=0.9), Warp(1.0, top_k=50, top_p=0.7, min_p=0.01)):
        want = warp.probs(peaked)
        assert ((want > 0).sum(-1) < NUCLEUS_CANDIDATES).all()
        got = proposal_probs(warp, peaked)
        assert torch.equal(got > 0, want > 0)
        torch.testing.assert_close(got, want)
    flat = torch.zeros(2, 1000)                                    # uniform: the nucleus is 950 tokens
    got = proposal_probs(Warp(1.0, top_p=0.95), flat)
    assert ((got > 0).sum(-1) == NUCLEUS_CANDIDATES).all()
    torch.testing.assert_close(got.sum(-1), torch.ones(2))
    torch.testing.assert_close(proposal_probs(Warp(0.7), peaked), Warp(0.7).probs(peaked), rtol=0, atol=0)


@pytest.mark.parametrize("head_depths", [None, 1])
def test_a_reused_block_proposes_below_its_committed_tokens(head_depths):
    """``offset``/``root_state``: a template rooted ``offset`` committed tokens below the block's root takes the
    head's proposals at block depth ``offset + d`` from ``root_state`` along its sampled path, and the drafter's
    marginals at block depth ``offset + d`` below ``head_depths``."""
    gamma, offset = 4, 2
    block = block_of(2, seed=8, gamma=gamma)
    head = VocabHead()
    committed = torch.tensor([[5, 9], [11, 2]])                     # the tokens after each row's block root
    carry = head.initial_state(block)
    for j in range(offset):
        carry = head.advance(block, j + 1, carry[:, None], committed[:, j: j + 1])[:, 0]
    template = make_builder("sequoia", "ref", budget=5, topk=3, acceptance=(0.5, 0.2, 0.1)).build(
        DraftBlock(logits=block.logits[:, : gamma - offset], root=committed[:, -1]))
    warp = Warp(1.0)
    sampled = sample_tree(template, block, head, warp, torch.Generator().manual_seed(2), head_depths=head_depths,
                          offset=offset, root_state=carry)
    tree, every = sampled.tree, torch.arange(V)[None]
    assert torch.equal(tree.tokens[:, 0], committed[:, -1])
    for r in range(2):
        one = DraftBlock(logits=block.logits[r: r + 1], root=block.root[r: r + 1])
        for u, path_nodes in enumerate(tree.node_paths(r)):
            if int(sampled.row_of[r, u]) == PAD:
                continue
            d = len(path_nodes) + 1
            if head_depths is None or d <= head_depths:
                state = carry[r: r + 1, None]
                for depth, node in enumerate(path_nodes, start=1):
                    state = head.advance(one, offset + depth, state, tree.tokens[r: r + 1, node][:, None])
                want = warp.probs(head.logits(one, offset + d, state, every))[0, 0]
            else:
                want = warp.probs(block.logits[r, offset + d - 1])
            torch.testing.assert_close(sampled.probs[r, sampled.row_of[r, u]], want)
    with pytest.raises(ValueError, match=r"^root_state: "):
        sample_tree(template, block, head, warp, offset=offset)
    with pytest.raises(ValueError, match=r"^template: a node deeper than the block's gamma=4 \(offset 3\)"):
        sample_tree(template, block, head, warp, offset=3, root_state=carry)


@pytest.mark.parametrize("deep_row", [0, 1, 2])
def test_drafter_proposals_below_head_depths_when_some_rows_have_none(deep_row):
    """Past ``head_depths`` the drafter proposes; a batch where only one row has a node that deep (the others'
    trees stop above it) draws and stores that row's proposals, and every other row is left alone (this
    indexed past the pairs: ``generate_batch`` at T=1 with ``dartree-pruned`` and a head raised IndexError)."""
    block = block_of(3, seed=11)
    deep = ([block.root[deep_row].item(), 1, 2, 3], [-1, 0, 1, 2])                # a chain to depth 3
    shallow = [([int(block.root[r]), 4, 5], [-1, 0, 0]) for r in range(3)]      # two children of the root
    rows = [deep if r == deep_row else shallow[r] for r in range(3)]
    template = make_tree(rows)
    sampled = sample_tree(template, block, PathHashHead(), Warp(1.0), torch.Generator().manual_seed(0),
                          head_depths=1)
    check_sampled(sampled, template, block)
    r, u = deep_row, 2                                       # the chain's depth-2 node proposes its child
    torch.testing.assert_close(sampled.probs[r, sampled.row_of[r, u]], Warp(1.0).probs(block.logits[r, 2]))
