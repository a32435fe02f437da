"""Sampled trees + recursive rejection sampling are lossless in distribution, shown three ways.

1. **Exact**: one round's output distribution, by enumerating every proposal draw (without replacement)
   and every acceptance outcome with :func:`accept_step` (the verifier's own step: the verifier accepts a
   sibling iff its coin is below that step's probability, and draws the bonus from that step's residual),
   extended by the target's exact AR continuation, equals the target's joint distribution (float64, 1e-12)
   on tiny vocabularies (V = 3, 4, 5; gamma 2 and 3): chains and branching trees (2-3 children per node),
   proposals per depth (no head) and per path (a head), with and without target-side top-k / top-p / min-p.
2. **Seeded Monte Carlo** of the real code (:func:`sample_tree` + :func:`verify_rejection`): one round
   against the target's joint, and many rounds in a row (a batch of rows, each decoding a toy model whose
   target and drafter are functions of the whole prefix) against AR's exact joint over 4 tokens; chi-square
   bounds with fixed seeds (cannot flake).
3. **Deliberately biased verifiers** (``min(1, p/q)`` on the deterministic top-m children, and a residual
   never updated: each sibling tested against p itself) fail every check, so the checks can fail.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from dartree.block import DraftBlock
from dartree.verify import rejection
from dartree.verify.rejection import accept_step, sample_tree, verify_rejection
from dartree.verify.warp import Warp
from tests.verify.helpers import make_tree, one_thread  # noqa: F401 (autouse fixture)


@dataclass(frozen=True)
class World:
    """A tiny target (next-token logits of every prefix after the root) and proposals: per depth (a
    drafter, no head) and per path (a head)."""

    vocab: int
    gamma: int
    seed: int
    target: dict = field(init=False, compare=False, repr=False)
    depth_q: np.ndarray = field(init=False, compare=False, repr=False)
    path_q: dict = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        paths = lambda top: (p for n in range(top) for p in itertools.product(range(self.vocab), repeat=n))  # noqa: E731
        object.__setattr__(self, "target", {p: rng.normal(0, 1.5, self.vocab) for p in paths(self.gamma + 2)})
        object.__setattr__(self, "depth_q", rng.normal(0, 1.5, (self.gamma, self.vocab)))
        object.__setattr__(self, "path_q", {p: rng.normal(0, 1.5, self.vocab) for p in paths(self.gamma)})


WORLDS = {"V4g2": World(4, 2, 7), "V3g3": World(3, 3, 8), "V5g2": World(5, 2, 9)}
# tree shapes by parent list (node 0 the root; children in node order are the sibling order)
SHAPES = {
    "chain": [-1, 0, 1],
    "fan": [-1, 0, 0, 0],
    "tree": [-1, 0, 0, 1, 1, 2],
    "wide": [-1, 0, 0, 0, 1, 1, 1, 2],
    "chain3": [-1, 0, 1, 2],
    "deep": [-1, 0, 0, 1, 1, 3, 3, 2],
}
WARPS = {"T1": Warp(1.0), "T0.7-topk2": Warp(0.7, top_k=2), "topp0.8": Warp(1.0, top_p=0.8),
         "T1.3-minp0.3": Warp(1.3, min_p=0.3)}
CASES = ([("V4g2", s) for s in ("chain", "fan", "tree", "wide")] + [("V3g3", s) for s in ("chain3", "tree", "deep")]
         + [("V5g2", s) for s in ("fan", "wide")])


def probs(logits: np.ndarray, warp: Warp) -> np.ndarray:
    """The warped distribution in float64 (as the verifier computes it)."""
    return warp.logits(torch.tensor(logits)).double().softmax(-1).numpy()


def kids_of(parents: list[int]) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {i: [] for i in range(len(parents))}
    for i, p in enumerate(parents[1:], start=1):
        kids[p].append(i)
    return kids


def wor_sequences(q: np.ndarray, m: int):
    """Every sequence of m draws without replacement from q, with its probability."""
    for seq in itertools.permutations([v for v in range(len(q)) if q[v] > 0], m):
        pr, left = 1.0, q.copy()
        for x in seq:
            pr *= left[x] / left.sum()
            left[x] = 0.0
        yield seq, pr


def round_distribution(world: World, parents, head: bool | int, warp: Warp, step=accept_step,
                       deterministic: bool = False) -> dict:
    """Exact distribution of one round's committed tokens (a dict: tuple -> probability).  ``head``: the
    drafter proposes (False), the head (True), or the head at depths ``<= head`` and the drafter below (an int)."""
    kids, vocab, cache = kids_of(parents), world.vocab, {}

    def p_at(logits_key, table) -> np.ndarray:
        if logits_key not in cache:
            cache[logits_key] = probs(table[logits_key[1]], warp)
        return cache[logits_key]

    def node(u: int, path: tuple[int, ...]) -> dict:
        p = p_at(("target", path), world.target)
        if not kids[u]:
            return {(v,): p[v] for v in range(vocab) if p[v] > 0}
        by_head = head is True or head is not False and len(path) < head
        q = p_at(("path", path), world.path_q) if by_head else p_at(("depth", len(path)), world.depth_q)
        m = min(len(kids[u]), int((q > 0).sum()))      # sample_tree's cut: a function of q only
        out: dict = {}
        if deterministic:                              # the biased variant: the top-m of q, not a draw
            draws = [(tuple(int(v) for v in np.argsort(-q, kind="stable")[:m]), 1.0)]
        else:
            draws = wor_sequences(q, m)
        for seq, pr in draws:
            def stage(i: int, r: np.ndarray, s: np.ndarray, seq: tuple[int, ...] = seq) -> dict:
                if i == len(seq):                      # every child rejected: the bonus ~ the residual
                    return {(v,): r[v] for v in range(vocab) if r[v] > 0}
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


def extended(world: World, dist: dict, warp: Warp, length: int | None = None) -> np.ndarray:
    """The joint over ``length`` tokens when each output is continued by the target's exact sampling."""
    length = world.gamma + 1 if length is None else length
    joint = np.zeros((world.vocab,) * length)
    stack = list(dist.items())
    while stack:
        seq, pr = stack.pop()
        if len(seq) == length:
            joint[seq] += pr
            continue
        p = probs(world.target[seq], warp)
        stack.extend((seq + (v,), pr * p[v]) for v in range(world.vocab) if p[v] > 0)
    return joint


def target_joint(world: World, warp: Warp) -> np.ndarray:
    return extended(world, {(): 1.0}, warp)


@pytest.mark.parametrize("warp", list(WARPS))
@pytest.mark.parametrize("head", [False, True, 1], ids=["drafter-q", "head-q", "head-q-depth-1"])
@pytest.mark.parametrize("world,shape", CASES, ids=[f"{w}-{s}" for w, s in CASES])
def test_one_round_is_exactly_the_target(world, shape, head, warp):
    w, world = WARPS[warp], WORLDS[world]
    dist = round_distribution(world, SHAPES[shape], head, w)
    assert abs(sum(dist.values()) - 1) < 1e-12
    np.testing.assert_allclose(extended(world, dist, w), target_joint(world, w), atol=1e-12, rtol=0)


def biased_step(r, s, x):
    """Rejection without the residual: a rejected sibling's successor is tested against p itself."""
    accept, _, s_next = accept_step(r, s, x)
    return accept, r, s_next


@pytest.mark.parametrize("world,shape", [("V4g2", "fan"), ("V4g2", "tree"), ("V3g3", "deep"), ("V5g2", "wide")])
@pytest.mark.parametrize("head", [False, True], ids=["drafter-q", "head-q"])
def test_the_exact_check_catches_biased_verifiers(world, shape, head):
    w, world = WARPS["T1"], WORLDS[world]
    truth = target_joint(world, w)
    for dist in (round_distribution(world, SHAPES[shape], head, w, deterministic=True),    # min(1, p/q), top-m
                 round_distribution(world, SHAPES[shape], head, w, step=biased_step)):      # no residual update
        assert np.abs(extended(world, dist, w) - truth).max() > 1e-3


# ----------------------------------------------------------------------------------------------- Monte Carlo
class TableHead:
    """A correction head whose proposal at a node is ``world.path_q`` of the node's path (state: the path)."""

    def __init__(self, world: World) -> None:
        self.world = world

    def initial_state(self, block):
        return torch.full((block.batch_size, self.world.gamma), -1.0)

    def logits(self, block, depth, states, candidates):
        rows = [[self.world.path_q[tuple(int(t) for t in s[: depth - 1])] for s in row] for row in states.tolist()]
        table = torch.tensor(np.array(rows), dtype=torch.float32)                         # [b, m, V]
        return torch.gather(table, 2, candidates[:, None, :].expand(-1, table.shape[1], -1))

    def advance(self, block, depth, states, tokens):
        out = states.clone()
        out[..., depth - 1] = tokens.float()
        return out


class VocabTableHead(TableHead):
    """TableHead with the optional ``vocab_logits`` (what the bundled heads propose through)."""

    def vocab_logits(self, block, depth, states):
        rows = [[self.world.path_q[tuple(int(t) for t in s[: depth - 1])] for s in row] for row in states.tolist()]
        return torch.tensor(np.array(rows), dtype=torch.float32)


def template(shapes: list[list[int]]):
    """A padded batch of tree shapes (tokens are placeholders: sample_tree draws them)."""
    return make_tree([([0] * len(p), p) for p in shapes])


def node_paths(tree, row: int) -> list[tuple[int, ...]]:
    """Each node's tokens below the root, root to node."""
    tokens, parents = tree.tokens[row].tolist(), tree.parents[row].tolist()
    out: list[tuple[int, ...]] = []
    for i in range(int(tree.num_nodes[row])):
        out.append(() if i == 0 else out[parents[i]] + (tokens[i],))
    return out


def chi_square(counts: np.ndarray, joint: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom; cells expected fewer than 5 times are pooled into one (the
    chi-square law is a poor fit for them)."""
    n = counts.sum()
    possible = joint > 0
    assert counts[~possible].sum() == 0, "a sequence of probability 0 was produced"
    expected, observed = n * joint[possible], counts[possible]
    small = expected < 5
    if small.any():
        expected = np.append(expected[~small], expected[small].sum())
        observed = np.append(observed[~small], observed[small].sum())
    return float(((observed - expected) ** 2 / expected).sum()), len(expected) - 1


def within(stat: float, df: int) -> bool:
    """The chi-square bound for the fixed seeds: 2 df + 30, where a correct sampler exceeds it with probability
    below 3e-7 for every df used here (7 to 39); the seeds are fixed, so the outcome does not change."""
    return stat < 2 * df + 30


def sample_rounds(world: World, parents, head: bool | int | str, warp: Warp, draws: int, seed: int):
    """``draws`` rounds of the real code, as one batch of ``draws`` rows, each continued by the target's
    sampling to gamma + 1 tokens.  ``head``: as :func:`round_distribution`'s, or ``"vocab"`` (the head
    through ``vocab_logits``)."""
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    block = DraftBlock(logits=torch.tensor(world.depth_q, dtype=torch.float32)[None].expand(draws, -1, -1),
                       root=torch.zeros(draws, dtype=torch.int64))
    proposer = VocabTableHead(world) if head == "vocab" else TableHead(world) if head is not False else None
    depths = head if type(head) is int else None
    sampled = sample_tree(template([parents] * draws), block, proposer, warp, g, head_depths=depths)
    tree = sampled.tree
    n, vocab, length = tree.max_nodes, world.vocab, world.gamma + 1
    logits = np.zeros((draws, n, vocab), dtype=np.float32)
    for row in range(draws):
        for i, path in enumerate(node_paths(tree, row)):
            logits[row, i] = world.target[path]
    out = verify_rejection(sampled, torch.from_numpy(logits), warp, g)
    counts = np.zeros((vocab,) * length)
    for row in out.tokens.tolist():
        seq = tuple(t for t in row if t >= 0)
        while len(seq) < length:
            p = probs(world.target[seq], warp)
            seq += (int(rng.choice(vocab, p=p / p.sum())),)
        counts[seq[:length]] += 1
    return counts


def top_m(q, m, generator):
    """The biased "draw": every node's children are its top-m of q (deterministic), so that the verifier
    applies min(1, p/q) to deterministic children."""
    return torch.sort(q, dim=-1, descending=True, stable=True).indices[..., :m]


MC_CASES = [("V4g2", "tree", False, "T1"), ("V4g2", "fan", True, "T1"), ("V4g2", "wide", True, "T0.7-topk2"),
            ("V4g2", "chain", False, "topp0.8"), ("V3g3", "deep", False, "T1.3-minp0.3"),
            ("V3g3", "deep", 1, "T1"), ("V4g2", "tree", "vocab", "topp0.8")]


@pytest.mark.parametrize("world,shape,head,warp", MC_CASES, ids=["-".join(map(str, c)) for c in MC_CASES])
def test_monte_carlo_of_one_round_matches_the_target(world, shape, head, warp):
    w, world = WARPS[warp], WORLDS[world]
    stat, df = chi_square(sample_rounds(world, SHAPES[shape], head, w, 1500, seed=11), target_joint(world, w))
    assert within(stat, df), (stat, df)


@pytest.mark.parametrize("kind", ["top-m", "residual"])
def test_monte_carlo_of_one_round_catches_biased_verifiers(kind, monkeypatch):
    world, w = WORLDS["V4g2"], WARPS["T1"]
    if kind == "top-m":
        monkeypatch.setattr(rejection, "_draw_without_replacement", top_m)
    else:                         # the verifier's residual (accept_step's second half), never updated
        after = rejection._after_rejection
        monkeypatch.setattr(rejection, "_after_rejection", lambda r, s, x: (r, after(r, s, x)[1]))
    stat, df = chi_square(sample_rounds(world, SHAPES["tree"], False, w, 1500, seed=11), target_joint(world, w))
    assert not within(stat, df), (stat, df)


# ------------------------------------------------------------------------------------ many rounds in a row
class ToyModel:
    """A target and a drafter that are functions of the whole prefix (seeded by it), over a vocabulary of 3."""

    vocab, gamma = 3, 2

    def __init__(self, seed: int) -> None:
        self.seed, self.cache = seed, {}

    def _logits(self, kind: int, key: tuple[int, ...]) -> np.ndarray:
        if (kind, key) not in self.cache:
            self.cache[kind, key] = np.random.default_rng([self.seed, kind, len(key), *key]).normal(0, 1.5, self.vocab)
        return self.cache[kind, key]

    def target(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self._logits(0, prefix)

    def block(self, prefix: tuple[int, ...]) -> np.ndarray:
        """The drafter's logits at depths 1..gamma: functions of the last two tokens and the depth."""
        return np.stack([self._logits(1 + d, prefix[-2:]) for d in range(self.gamma)])

    def joint(self, warp: Warp, start: tuple[int, ...], length: int) -> np.ndarray:
        joint = np.zeros((self.vocab,) * length)
        for seq in itertools.product(range(self.vocab), repeat=length):
            pr = 1.0
            for i in range(length):
                pr *= probs(self.target(start + seq[:i]), warp)[seq[i]]
            joint[seq] += pr
        return joint


def decode_rows(model: ToyModel, shapes: list[list[int]], warp: Warp, rows: int, length: int, seed: int) -> np.ndarray:
    """``rows`` decodes of ``length`` tokens by repeated rounds of the real code, all rows in one batch
    (row i drafts the shape ``shapes[i % len(shapes)]``); counts of the first ``length`` tokens."""
    g = torch.Generator().manual_seed(seed)
    start = (1,)
    prefixes = [start] * rows
    shape = template([shapes[i % len(shapes)] for i in range(rows)])
    for _ in range(length):                           # every round commits at least one token
        block = DraftBlock(logits=torch.tensor(np.array([model.block(p) for p in prefixes]), dtype=torch.float32),
                           root=torch.tensor([p[-1] for p in prefixes]))
        sampled = sample_tree(shape, block, None, warp, g)
        tree = sampled.tree
        logits = np.zeros((rows, tree.max_nodes, model.vocab), dtype=np.float32)
        for row in range(rows):
            for i, path in enumerate(node_paths(tree, row)):
                logits[row, i] = model.target(prefixes[row] + path)
        logits = torch.from_numpy(logits)
        out = verify_rejection(sampled, logits, warp, g)
        prefixes = [p + tuple(t for t in row if t >= 0) for p, row in zip(prefixes, out.tokens.tolist(), strict=True)]
    counts = np.zeros((model.vocab,) * length)
    for p in prefixes:
        counts[p[len(start): len(start) + length]] += 1
    return counts


MANY = dict(shapes=[[-1, 0, 1], [-1, 0, 0, 1, 1, 2], [-1, 0, 0, 0, 1]], rows=1500, length=4, seed=5)


@pytest.mark.parametrize("warp", ["T1", "T0.7-topk2"])
def test_many_rounds_match_autoregressive_sampling(warp):
    model, w = ToyModel(3), WARPS[warp]
    counts = decode_rows(model, MANY["shapes"], w, MANY["rows"], MANY["length"], MANY["seed"])
    stat, df = chi_square(counts, model.joint(w, (1,), MANY["length"]))
    assert within(stat, df), (stat, df)


def test_many_rounds_catch_min_p_over_q_on_top_m_children(monkeypatch):
    monkeypatch.setattr(rejection, "_draw_without_replacement", top_m)
    model, w = ToyModel(3), WARPS["T1"]
    counts = decode_rows(model, MANY["shapes"], w, MANY["rows"], MANY["length"], MANY["seed"])
    stat, df = chi_square(counts, model.joint(w, (1,), MANY["length"]))
    assert not within(stat, df), (stat, df)
