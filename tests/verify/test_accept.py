"""Greedy and sampled verification, samplers, and the chi-square losslessness test."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import dartree
from dartree.models.target import HFTarget
from dartree.testing import OracleDrafter
from dartree.tree import DraftTree
from dartree.verify import GeneratorSampler, KeyedSampler, accept_picks, hash32, verify_greedy, verify_sampled
from tests.verify.helpers import GOLDEN, make_tree, one_thread, random_tree  # noqa: F401 (autouse fixture)

V = 32


def one_hot_logits(picks: list[list[int]], vocab: int = V) -> torch.Tensor:
    """Logits whose argmax at node i of row r is picks[r][i]."""
    t = torch.tensor(picks)
    return torch.nn.functional.one_hot(t, vocab).float() * 5.0 + 0.1 * torch.randn(*t.shape, vocab).clamp(-1, 1)


def test_golden_greedy_batch_of_different_sizes():
    # Row 0: root(10) -> a(11) -> c(13); root -> b(12).  Row 1: root(20) -> d(21), one padding slot.
    # Row 0 target picks: at root 11 (-> a), at a 13 (-> c), at c 7 (bonus).  Full path accepted.
    # Row 1 target picks: at root 5 (no child 5): zero accepted, bonus 5.
    res = verify_greedy(GOLDEN, one_hot_logits([[11, 13, 3, 7], [5, 9, 0, 0]]))
    assert res.accepted_length.tolist() == [2, 0]
    assert res.accepted.tolist() == [[0, 1, 3, -1], [0, -1, -1, -1]]
    assert res.bonus.tolist() == [7, 5]
    assert res.tokens.tolist() == [[11, 13, 7, -1], [5, -1, -1, -1]]
    assert (res.tokens >= 0).sum(1).tolist() == [3, 1]         # accepted draft tokens + 1 bonus
    assert res.picks[1].tolist() == [5, 9, -1, -1]       # padding picks are -1


def test_golden_partial_and_sibling():
    # root picks 12 (-> b, the second child); b is a leaf: bonus = pick at b.
    res = verify_greedy(GOLDEN, one_hot_logits([[12, 13, 4, 1], [21, 21, 0, 0]]))
    assert res.accepted.tolist() == [[0, 2, -1, -1], [0, 1, -1, -1]]
    assert res.tokens.tolist() == [[12, 4, -1, -1], [21, 21, -1, -1]]
    assert res.bonus.tolist() == [4, 21]


@pytest.mark.parametrize("seed", range(5))
def test_accept_picks_matches_walk(seed):
    tree = random_tree([15, 6, 1], seed)
    g = torch.Generator().manual_seed(seed)
    # picks drawn from the node tokens so that deep walks happen
    picks = torch.randint(1, 15, tree.tokens.shape, generator=g)
    res = accept_picks(tree, picks)
    for r in range(tree.batch_size):
        par = tree.parents[r].tolist()
        tok = tree.tokens[r].tolist()
        count = int(tree.num_nodes[r])
        node, path = 0, [0]
        while True:
            nxt = [i for i in range(1, count) if par[i] == node and tok[i] == int(picks[r, node])]
            if not nxt:
                break
            node = nxt[0]
            path.append(node)
        assert res.accepted[r, : len(path)].tolist() == path
        assert res.accepted_length[r].item() == len(path) - 1
        assert res.bonus[r].item() == int(picks[r, node])
        assert res.tokens[r, : len(path)].tolist() == [tok[i] for i in path[1:]] + [int(picks[r, node])]


class FixedSampler:
    """Returns preset picks and records what it was given."""

    def __init__(self, picks):
        self.picks = picks

    def sample(self, logits, positions):
        self.logits, self.positions = logits, positions
        return self.picks


def test_sampled_uses_sampler_positions_and_temperature():
    logits = torch.randn(2, 4, V)
    picks = torch.tensor([[11, 13, 0, 2], [21, 3, 0, 0]])
    s = FixedSampler(picks)
    res = verify_sampled(GOLDEN, logits, 0.5, s, prefix_len=7)
    assert res.tokens.tolist() == [[11, 13, 2, -1], [21, 3, -1, -1]]
    torch.testing.assert_close(s.logits, logits / 0.5)
    # the token drawn at node i occupies position prefix + depth + 1
    assert s.positions.tolist() == [[8, 9, 9, 10], [8, 9, 8, 8]]


def test_bad_inputs():
    with pytest.raises(ValueError, match="target_logits"):
        verify_greedy(GOLDEN, torch.randn(2, 3, V))
    with pytest.raises(ValueError, match="target_logits"):
        verify_greedy(GOLDEN, torch.zeros(2, 4, V, dtype=torch.int64))
    for t in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature"):
            verify_sampled(GOLDEN, torch.randn(2, 4, V), t, KeyedSampler(0))
    with pytest.raises(ValueError, match="sampler"):
        verify_sampled(GOLDEN, torch.randn(2, 4, V), 1.0, None)
    with pytest.raises(ValueError, match="picks"):
        accept_picks(GOLDEN, torch.zeros(2, 4, dtype=torch.int32))


# ------------------------------------------------------------------------------------ samplers
def fmix32(x: int) -> int:
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_hash32_is_murmur3_fmix32():
    xs = [0, 1, 2, 12345, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xDEADBEEF, 0xFFFFFFFF]
    assert hash32(torch.tensor(xs)).tolist() == [fmix32(x) for x in xs]
    assert fmix32(1) == 0x514E28B7


def test_keyed_sampler_is_a_pure_function_of_seed_position_token():
    s = KeyedSampler(1234)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, V, generator=g)
    pos = torch.arange(15).reshape(3, 5) + 40
    full = s.sample(logits, pos)
    # element-wise: sampling one position alone gives the same token
    for r in range(3):
        for c in range(5):
            alone = s.sample(logits[r, c][None], pos[r, c][None])
            assert alone.item() == full[r, c].item()
    tree_pos = torch.tensor([[40, 41, 41, 42, 42, 42], [7, 8, 8, 9, 10, 10]])   # a tree: depths repeat
    tree_logits = torch.randn(2, 6, V, generator=g)
    shared = s.sample(tree_logits, tree_pos)                # the CPU path hashes each position once
    for r in range(2):
        for c in range(6):
            alone = s.sample(tree_logits[r, c][None], tree_pos[r, c][None])
            assert alone.item() == shared[r, c].item()
    assert torch.equal(KeyedSampler(1234).noise(pos, V), s.noise(pos, V))
    assert not torch.equal(KeyedSampler(1235).noise(pos, V), s.noise(pos, V))
    assert not torch.equal(s.noise(pos + 1, V), s.noise(pos, V))
    with pytest.raises(ValueError, match="seed"):
        KeyedSampler(-1)
    with pytest.raises(ValueError, match="positions"):
        s.sample(logits, pos[:, :2])


@pytest.mark.parametrize("seed", [0, 1234, 2**32 - 1, 2**32 + 5, 2**63 - 1])
@pytest.mark.parametrize("count", [1, 6, 65, 130], ids=lambda n: f"positions{n}")   # host-hashed and tensor-hashed
def test_keyed_noise_is_the_documented_hash_of_seed_position_token(seed: int, count: int):
    """Every noise value equals the docstring's formula evaluated with Python ints, one token at a time."""
    vocab = 37
    pos = torch.randint(0, 2**40, (count,), generator=torch.Generator().manual_seed(seed % 997))
    key = fmix32(seed) ^ fmix32((seed >> 32) + 0x9E3779B9)
    want = [[(fmix32(fmix32(key ^ fmix32(p)) ^ ((t + 1) * 0x27D4EB2F & 0xFFFFFFFF)) >> 8) for t in range(vocab)]
            for p in pos.tolist()]
    u = (torch.tensor(want, dtype=torch.float64) + 0.5) / float(1 << 24)
    assert torch.equal(KeyedSampler(seed).noise(pos, vocab), -torch.log(-torch.log(u)))
    grid = pos.reshape(-1, 1)                          # a second leading dimension: the same values
    assert torch.equal(KeyedSampler(seed).noise(grid, vocab)[:, 0], -torch.log(-torch.log(u)))


def chi2_pvalue(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson chi-square p-value; cells with expected < 5 are pooled into one."""
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum()[None]]) if small.any() else observed
    exp = torch.cat([expected[~small], expected[small].sum()[None]]) if small.any() else expected
    stat = ((obs - exp) ** 2 / exp).sum()
    df = obs.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat.double() / 2))


@pytest.mark.parametrize("sampler", [KeyedSampler(3), GeneratorSampler(torch.Generator().manual_seed(3))],
                         ids=["keyed", "generator"])
def test_sampler_marginals(sampler):
    logits = torch.tensor([1.0, 0.0, -1.0, 2.0, 0.5, -3.0])
    n = 20000
    picks = sampler.sample(logits.expand(n, 6), torch.arange(n))
    observed = torch.bincount(picks, minlength=6).double()
    assert chi2_pvalue(observed, torch.softmax(logits.double(), 0) * n) > 1e-3


# ------------------------------------------------------------------ chi-square, exact matching
TINY_V = 6


@pytest.fixture(scope="module")
def tiny_round():
    """A tree on a tiny target and the target's logits at its nodes (one forward)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=TINY_V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                      attn_implementation="eager", initializer_range=0.1)
    model = LlamaForCausalLM(cfg).eval()
    prompt = torch.tensor([[1, 4, 2]])
    target = HFTarget(model)
    target.prefill(prompt[:, :-1])
    drafter = OracleDrafter(model, 3, demote=0.5, seed=5)
    drafter.append_context(None, prompt[:, :-1])
    block = drafter.draft(prompt[:, -1])
    tree = dartree.make_builder("ddtree", budget=7, topk=3).build(block).validate()
    logits = target.forward_tree(target.tree_inputs(tree)).logits
    return tree, logits


def expand(tree: DraftTree, n: int) -> DraftTree:
    return DraftTree(*(getattr(tree, f).expand(n, *getattr(tree, f).shape[1:]) for f in
                       ("tokens", "parents", "depths", "scores", "ranks", "num_nodes")))


def exact_cells(tree: DraftTree, probs: torch.Tensor) -> dict[tuple[int, int], float]:
    """P(the walk ends at node u with bonus v) = P(path to u) * p_u(v), v not a child token of u."""
    par, tok = tree.parents[0].tolist(), tree.tokens[0].tolist()
    count = int(tree.num_nodes[0])
    reach = [1.0] + [0.0] * (count - 1)
    for i in range(1, count):
        reach[i] = reach[par[i]] * float(probs[par[i], tok[i]])
    cells = {}
    for u in range(count):
        children = {tok[i] for i in range(1, count) if par[i] == u}
        for v in range(TINY_V):
            if v not in children:
                cells[(u, v)] = reach[u] * float(probs[u, v])
    return cells


def lenient_verify(tree, logits, temperature, sampler):
    """A deliberately wrong verifier: also accepts a child the target likes at least as much as its
    own sample (a bias towards draft tokens)."""
    probs = torch.softmax(logits / temperature, -1)
    picks = sampler.sample(logits / temperature, tree.positions(0) + 1)
    p_pick = torch.gather(probs, 2, picks[..., None])[..., 0]
    valid = tree.valid()
    par = tree.parents.clamp(min=0)
    p_child = torch.gather(probs, 1, par[..., None].expand(-1, -1, probs.shape[-1]))
    p_child = torch.gather(p_child, 2, tree.tokens.clamp(min=0)[..., None])[..., 0]
    likes = valid & (torch.arange(tree.max_nodes) > 0) & (p_child >= torch.gather(p_pick, 1, par))
    # the liked child (first by index) replaces the parent's pick
    better = picks.clone()
    for i in reversed(range(1, tree.max_nodes)):
        row = likes[:, i]
        better[row, par[row, i]] = tree.tokens[row, i]
    return accept_picks(tree, better)


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_chi_square_exact_target_sample_matching(tiny_round, temperature):
    tree, logits = tiny_round
    n = 20000
    probs = torch.softmax(logits[0].double() / temperature, -1)
    cells = exact_cells(tree, probs)
    keys = list(cells)
    expected = torch.tensor([cells[k] for k in keys], dtype=torch.float64)
    assert abs(float(expected.sum()) - 1.0) < 1e-9
    expected = expected * n

    def observed(res):
        last = torch.gather(res.accepted, 1, res.accepted_length[:, None])[:, 0]
        counts = {k: 0 for k in keys}
        for u, v in zip(last.tolist(), res.bonus.tolist(), strict=True):
            counts[(u, v)] += 1          # KeyError would mean the walk ended somewhere impossible
        return torch.tensor([counts[k] for k in keys], dtype=torch.float64)

    big, big_logits = expand(tree, n), logits.expand(n, -1, -1)
    good = verify_sampled(big, big_logits, temperature, GeneratorSampler(torch.Generator().manual_seed(11)))
    assert chi2_pvalue(observed(good), expected) > 1e-3
    deep = good.accepted_length.float().mean()
    assert deep > 0.3                    # the tree is actually walked, not just the root
    bad = lenient_verify(big, big_logits, temperature, GeneratorSampler(torch.Generator().manual_seed(11)))
    assert chi2_pvalue(observed(bad), expected) < 1e-6


@pytest.mark.parametrize("seed", range(6))
def test_walk_greedy_scores_only_the_path_and_equals_verify_greedy(seed):
    """T=0 with the LM head run lazily along the walk (all rows in step) gives the same result as full logits."""
    from dartree.verify import walk_greedy

    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 12, (1 + seed % 3,), generator=g).tolist()     # 1-3 rows of ragged sizes
    tree = random_tree(sizes, seed, vocab=V)
    b, n = tree.tokens.shape
    logits = torch.randn(b, n, V, generator=g)
    for r in range(b):
        tokens, parents = tree.tokens[r].tolist(), tree.parents[r].tolist()
        for i in range(sizes[r]):                       # most nodes pick one of their children: long walks
            kids = [j for j in range(1, sizes[r]) if parents[j] == i]
            if kids and float(torch.rand(1, generator=g)) < 0.8:
                logits[r, i, tokens[kids[int(torch.randint(0, len(kids), (1,), generator=g))]]] += 10.0
    calls = []

    def rows(rs, nodes):
        calls.append(list(zip(rs, nodes, strict=True)))
        return logits[rs, nodes]

    lazy = walk_greedy(tree, logits[:, 0], rows)
    full = verify_greedy(tree, logits)
    for field in ("accepted", "accepted_length", "bonus", "tokens"):
        assert torch.equal(getattr(lazy, field), getattr(full, field)), field
    paths = [[i for i in full.accepted[r].tolist() if i >= 0] for r in range(b)]
    scored = sorted(pair for call in calls for pair in call)
    assert scored == sorted((r, i) for r in range(b) for i in paths[r][1:])   # only accepted nodes after roots
    assert len(calls) == max(len(p) for p in paths) - 1                      # one call per depth
    for r in range(b):
        assert lazy.picks[r, paths[r]].tolist() == full.picks[r, paths[r]].tolist()
        assert all(lazy.picks[r, i] == -1 for i in range(n) if i not in paths[r])
    with pytest.raises(ValueError, match="root_logits"):
        walk_greedy(tree, torch.zeros(V), rows)


@pytest.mark.parametrize("seed", range(8))
def test_walk_greedy_over_full_logits_equals_verify_greedy(seed):
    """The greedy walk over full logits (argmax only where the walk goes) gives verify_greedy's path,
    tokens and picks along it, and PAD elsewhere; with ties (the first maximum) and NaN (the first NaN,
    as torch.argmax)."""
    from dartree.verify import walk_greedy

    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 14, (1 + seed % 3,), generator=g).tolist()
    tree = random_tree(sizes, seed, vocab=V)
    b, n = tree.tokens.shape
    logits = torch.randn(b, n, V, generator=g).round()          # integer logits: ties are common
    for r in range(b):
        tokens, parents = tree.tokens[r].tolist(), tree.parents[r].tolist()
        for i in range(sizes[r]):
            kids = [j for j in range(1, sizes[r]) if parents[j] == i]
            if kids and float(torch.rand(1, generator=g)) < 0.8:
                tok = tokens[kids[int(torch.randint(0, len(kids), (1,), generator=g))]]
                logits[r, i, tok] = 10.0
                if seed % 2:                                     # a tie after the child's token, or before
                    logits[r, i, (tok + 1) % V if seed % 4 == 1 else max(0, tok - 1)] = 10.0
            if seed == 5 and i == 0:
                logits[r, i, 3] = float("nan")                   # NaN wins: the walk stops at the root
    full = verify_greedy(tree, logits)
    results = [walk_greedy(tree, logits[:, 0], lambda rows, nodes: logits[rows, nodes])]
    paths = [[i for i in full.accepted[r].tolist() if i >= 0] for r in range(b)]
    for got in results:
        for field in ("accepted", "accepted_length", "bonus", "tokens"):
            assert torch.equal(getattr(got, field), getattr(full, field)), field
        for r in range(b):
            assert got.picks[r, paths[r]].tolist() == full.picks[r, paths[r]].tolist()
            assert all(got.picks[r, i] == -1 for i in range(n) if i not in paths[r])
    if seed == 5:
        assert full.picks[:, 0].tolist() == [3] * b and full.accepted_length.tolist() == [0] * b
    with pytest.raises(ValueError, match="root_logits"):
        walk_greedy(tree, logits[:, 0, 0], lambda rows, nodes: logits[rows, nodes])


@pytest.mark.parametrize("seed", range(6))
def test_walk_sampled_scores_only_the_path_and_equals_verify_sampled(seed):
    """T>0 with a keyed sampler, the LM head and the draws run lazily along the walk: the same result as
    drawing at every node (a keyed draw depends only on the node's logits and position)."""
    from dartree.verify import walk_sampled

    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 12, (1 + seed % 3,), generator=g).tolist()
    tree = random_tree(sizes, seed, vocab=V)
    b, n = tree.tokens.shape
    logits = torch.randn(b, n, V, generator=g)
    for r in range(b):                                   # children likely to be drawn: long walks
        tokens, parents = tree.tokens[r].tolist(), tree.parents[r].tolist()
        for i in range(sizes[r]):
            for j in (j for j in range(1, sizes[r]) if parents[j] == i):
                logits[r, i, tokens[j]] += 4.0
    prefix = torch.tensor([3, 40, 7][:b])
    sampler, temperature = KeyedSampler(seed + 5), 0.8
    calls = []

    def rows(rs, nodes):
        calls.append(list(zip(rs, nodes, strict=True)))
        return logits[rs, nodes]

    lazy = walk_sampled(tree, logits[:, 0], rows, temperature, sampler, prefix)
    full = verify_sampled(tree, logits, temperature, sampler, prefix)
    for field in ("accepted", "accepted_length", "bonus", "tokens"):
        assert torch.equal(getattr(lazy, field), getattr(full, field)), field
    paths = [[i for i in full.accepted[r].tolist() if i >= 0] for r in range(b)]
    assert sorted(p for c in calls for p in c) == sorted((r, i) for r in range(b) for i in paths[r][1:])
    class Custom:
        def sample(self, logits, positions):
            return logits.argmax(-1)

    with pytest.raises(ValueError, match="sampler: walk_sampled needs a KeyedSampler or a GeneratorSampler"):
        walk_sampled(tree, logits[:, 0], rows, temperature, Custom(), prefix)


@pytest.mark.parametrize("wrong", [False, True], ids=["walk", "biased-walk"])
def test_walk_sampled_with_a_generator_is_ar_sampling_in_law(wrong):
    """A GeneratorSampler's fresh draw at each visited node: the first two committed tokens (the second only
    when the first is a child) have AR's joint law, by a seeded chi-square over 2,000 rounds of a tree on 5
    tokens; a walk that draws every node from the root's distribution (the wrong law) fails the same check."""
    from dartree.verify import walk_sampled

    vocab, temperature = 5, 0.9
    tree = make_tree([([0, 1, 3, 2, 4], [-1, 0, 0, 1, 1])])           # root -> {1, 3}; node 1 -> {2, 4}
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 5, vocab, generator=g) * 1.5
    p = (logits[0].double() / temperature).softmax(-1)
    children = {0: {1: 1, 3: 2}, 1: {2: 3, 4: 4}}                  # node -> {token: child node}
    joint = {}                                                      # (t1, t2 or -1) -> probability
    for t1 in range(vocab):
        child = children[0].get(t1)
        if child is None:
            joint[(t1, -1)] = float(p[0, t1])
        else:
            for t2 in range(vocab):
                joint[(t1, t2)] = float(p[0, t1] * p[child, t2])
    rows = (lambda rs, nodes: logits[rs, [0] * len(nodes)]) if wrong else (lambda rs, nodes: logits[rs, nodes])
    sampler, counts, n = GeneratorSampler(torch.Generator().manual_seed(1)), {}, 2000
    for _ in range(n):
        out = walk_sampled(tree, logits[:, 0], rows, temperature, sampler)
        t = out.tokens[0].tolist()
        key = (t[0], t[1] if len(t) > 1 and t[1] >= 0 else -1)
        counts[key] = counts.get(key, 0) + 1
    assert set(counts) <= set(joint)
    stat = sum((counts.get(k, 0) - n * q) ** 2 / (n * q) for k, q in joint.items())
    df = len(joint) - 1
    assert (stat < 2 * df + 30) != wrong, (stat, df)   # 12.5 and 2,875 for df 12
