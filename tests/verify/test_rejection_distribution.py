"""Sampled trees + recursive rejection sampling are lossless in distribution, shown three ways.

1. **Exact**: one round's output distribution, by enumerating every proposal draw (without replacement)
   and every acceptance outcome with :func:`accept_step` (the verifier's own step), extended by the
   target's exact AR continuation, equals the target's joint distribution (float64, 1e-12) on tiny
   vocabularies: chains and branching trees, proposals per depth (no head) and per path (a head), with
   and without target-side top-k / top-p.
2. **Seeded Monte Carlo** of the real code (:func:`sample_tree` + :func:`verify_rejection`) against the
   target's joint: a chi-square bound with fixed seeds (cannot flake).
3. **A deliberately biased verifier** (``min(1, p/q)`` on the deterministic top-m children, and a
   residual never updated: each sibling tested against p itself) fails both checks, so the checks can fail.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from dartree.block import DraftBlock
from dartree.tree import DraftTree
from dartree.verify.rejection import accept_step, sample_tree, verify_rejection
from dartree.verify.warp import Warp

V, GAMMA = 4, 2
RNG = np.random.default_rng(7)
# the target: next-token logits for every prefix of up to GAMMA + 1 tokens after the root (a fixed table)
TARGET = {path: RNG.normal(0, 1.5, V) for n in range(GAMMA + 2) for path in itertools.product(range(V), repeat=n)}
# proposals: per depth (no head) and per path (a head)
DEPTH_Q = RNG.normal(0, 1.5, (GAMMA, V))
PATH_Q = {path: RNG.normal(0, 1.5, V) for n in range(GAMMA) for path in itertools.product(range(V), repeat=n)}

# tree shapes by parent list (node 0 the root; children in node order are the sibling order)
SHAPES = {
    "chain": [-1, 0, 1],
    "fan": [-1, 0, 0, 0],
    "tree": [-1, 0, 0, 1, 1, 2],
}
WARPS = {"T1": Warp(1.0), "T0.7-topk2": Warp(0.7, top_k=2), "topp0.8": Warp(1.0, top_p=0.8)}


def probs(logits: np.ndarray, warp: Warp) -> np.ndarray:
    """The warped distribution in float64 (as the verifier computes it)."""
    return warp.logits(torch.tensor(logits)).double().softmax(-1).numpy()


def kids_of(parents: list[int]) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {i: [] for i in range(len(parents))}
    for i, p in enumerate(parents[1:], start=1):
        kids[p].append(i)
    return kids


def proposal(path: tuple[int, ...], head: bool, warp: Warp) -> np.ndarray:
    return probs(PATH_Q[path] if head else DEPTH_Q[len(path)], warp)


def wor_sequences(q: np.ndarray, m: int):
    """Every sequence of m draws without replacement from q, with its probability."""
    for seq in itertools.permutations([v for v in range(V) if q[v] > 0], m):
        pr, left = 1.0, q.copy()
        for x in seq:
            pr *= left[x] / left.sum()
            left[x] = 0.0
        yield seq, pr


def round_distribution(parents, head: bool, warp: Warp, step=accept_step, deterministic: bool = False):
    """Exact distribution of one round's committed tokens (a dict: tuple -> probability)."""
    kids = kids_of(parents)

    def node(u: int, path: tuple[int, ...]) -> dict:
        p = probs(TARGET[path], warp)
        if not kids[u]:
            return {(v,): p[v] for v in range(V) if p[v] > 0}
        q = proposal(path, head, warp)
        m = min(len(kids[u]), int((q > 0).sum()))
        out: dict = {}
        if deterministic:                       # the biased variant: the top-m of q, not a draw
            draws = [(tuple(int(v) for v in np.argsort(-q, kind="stable")[:m]), 1.0)]
        else:
            draws = wor_sequences(q, m)
        for seq, pr in draws:
            def stage(i: int, r: np.ndarray, s: np.ndarray, seq: tuple[int, ...] = seq) -> dict:
                if i == len(seq):
                    return {(v,): r[v] for v in range(V) if r[v] > 0}
                a, r2, s2 = step(r, s, seq[i])
                res: dict = {}
                if a > 0:
                    for tail, t in node(kids[u][i], path + (seq[i],)).items():
                        res[(seq[i],) + tail] = res.get((seq[i],) + tail, 0.0) + a * t
                if a < 1:
                    for tail, t in stage(i + 1, r2, s2).items():
                        res[tail] = res.get(tail, 0.0) + (1 - a) * t
                return res

            for tail, t in stage(0, p, q).items():
                out[tail] = out.get(tail, 0.0) + pr * t
        return out

    return node(0, ())


def extended(dist: dict, warp: Warp, length: int = GAMMA + 1) -> np.ndarray:
    """The joint over ``length`` tokens when each output is continued by the target's exact sampling."""
    joint = np.zeros((V,) * length)
    stack = list(dist.items())
    while stack:
        seq, pr = stack.pop()
        if len(seq) == length:
            joint[seq] += pr
            continue
        p = probs(TARGET[seq], warp)
        stack.extend((seq + (v,), pr * p[v]) for v in range(V) if p[v] > 0)
    return joint


def target_joint(warp: Warp, length: int = GAMMA + 1) -> np.ndarray:
    return extended({(): 1.0}, warp, length)


@pytest.mark.parametrize("warp", list(WARPS), ids=str)
@pytest.mark.parametrize("head", [False, True], ids=["drafter-q", "head-q"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_one_round_is_exactly_the_target(shape, head, warp):
    w = WARPS[warp]
    dist = round_distribution(SHAPES[shape], head, w)
    assert abs(sum(dist.values()) - 1) < 1e-12
    np.testing.assert_allclose(extended(dist, w), target_joint(w), atol=1e-12, rtol=0)


def biased_step(r, s, x):
    """Rejection without the residual: a rejected sibling's successor is tested against p itself."""
    accept, _, s_next = accept_step(r, s, x)
    return accept, r, s_next


@pytest.mark.parametrize("shape", ["fan", "tree"])
def test_the_exact_check_catches_biased_verifiers(shape):
    w = WARPS["T1"]
    truth = target_joint(w)
    for dist in (round_distribution(SHAPES[shape], False, w, deterministic=True),      # min(1, p/q) on top-m
                 round_distribution(SHAPES[shape], False, w, step=biased_step)):        # no residual update
        assert np.abs(extended(dist, w) - truth).max() > 1e-3


# ----------------------------------------------------------------------------------------------- Monte Carlo
class TableHead:
    """A correction head whose proposal at a node is PATH_Q of the node's path (state: the path so far)."""

    def initial_state(self, block):
        return torch.full((block.batch_size, GAMMA), -1.0)

    def logits(self, block, depth, states, candidates):
        rows = [[PATH_Q[tuple(int(t) for t in s[: depth - 1])] for s in row] for row in states.tolist()]
        table = torch.tensor(np.array(rows), dtype=torch.float32)                         # [b, m, V]
        return torch.gather(table, 2, candidates[:, None, :].expand(-1, table.shape[1], -1))

    def advance(self, block, depth, states, tokens):
        out = states.clone()
        out[..., depth - 1] = tokens.float()
        return out


def template(parents: list[int]) -> DraftTree:
    n = len(parents)
    depths = [0] * n
    for i in range(1, n):
        depths[i] = depths[parents[i]] + 1
    t = lambda xs: torch.tensor([xs], dtype=torch.int64)  # noqa: E731
    return DraftTree(tokens=t([0] + [1] * (n - 1)), parents=t(parents), depths=t(depths),
                     scores=torch.zeros(1, n), ranks=t([-1] + [0] * (n - 1)), num_nodes=t([n])[0])


def sample_rounds(parents, head: bool, warp: Warp, draws: int, seed: int, verifier=verify_rejection):
    """``draws`` rounds of the real code, each continued by the target's sampling to GAMMA + 1 tokens."""
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    block = DraftBlock(logits=torch.tensor(DEPTH_Q, dtype=torch.float32)[None], root=torch.tensor([0]))
    shape = template(parents)
    counts = np.zeros((V,) * (GAMMA + 1))
    for _ in range(draws):
        sampled = sample_tree(shape, block, TableHead() if head else None, warp, g, topk=V)
        tree = sampled.tree
        paths = []
        for i in range(int(tree.num_nodes[0])):
            path, j = [], i
            while j > 0:
                path.append(int(tree.tokens[0, j]))
                j = int(tree.parents[0, j])
            paths.append(tuple(reversed(path)))
        logits = torch.tensor(np.array([TARGET[p] for p in paths]), dtype=torch.float32)[None]
        out = verifier(sampled, logits, warp, g)
        seq = tuple(int(t) for t in out.tokens[0] if t >= 0)
        while len(seq) < GAMMA + 1:
            p = probs(TARGET[seq], warp)
            seq += (int(rng.choice(V, p=p / p.sum())),)
        counts[seq[: GAMMA + 1]] += 1
    return counts


def chi_square(counts: np.ndarray, joint: np.ndarray) -> tuple[float, int]:
    n = counts.sum()
    keep = joint > 0
    assert counts[~keep].sum() == 0, "a sequence of probability 0 was produced"
    expected = n * joint[keep]
    return float(((counts[keep] - expected) ** 2 / expected).sum()), int(keep.sum()) - 1


#: chi-square bound for the fixed seeds: df <= 63; 3x the df is far past the 1e-9 quantile (about 140)
def within(stat: float, df: int) -> bool:
    return stat < max(3 * df, 30)


@pytest.mark.parametrize("shape,head,warp", [("tree", False, "T1"), ("fan", True, "T1"),
                                             ("tree", True, "T0.7-topk2"), ("chain", False, "topp0.8")])
def test_monte_carlo_of_the_real_code_matches_the_target(shape, head, warp):
    w = WARPS[warp]
    stat, df = chi_square(sample_rounds(SHAPES[shape], head, w, 2000, seed=11), target_joint(w))
    assert within(stat, df), (stat, df)


def test_monte_carlo_catches_a_biased_verifier():
    """The same check on a verifier that tests every sibling against p itself (no residual) fails."""
    from dartree.verify import rejection

    def biased(sampled, logits, warp, g):
        real = rejection.accept_step
        rejection.accept_step = biased_step
        try:
            return verify_rejection(sampled, logits, warp, g)
        finally:
            rejection.accept_step = real

    w = WARPS["T1"]
    stat, df = chi_square(sample_rounds(SHAPES["tree"], False, w, 2000, seed=11, verifier=biased), target_joint(w))
    assert not within(stat, df), (stat, df)
