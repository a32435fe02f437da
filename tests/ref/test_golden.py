"""Golden trees: tiny blocks whose exact trees were derived by hand (derivations in comments).

Block A (V=4, gamma=2, root token 0, topk=2, normalize="candidates"):
    L_1 = [0, 2, 1, -5]  -> C_1 = [1, 2]; log q_1 = [2, 1] - lse(2, 1)   = [-0.3133, -1.3133]
    L_2 = [3, 0, 3, 1]   -> C_2 = [0, 2] (tie 3 = 3: token 0 first);     log q_2 = [-ln 2, -ln 2]
Table head: after token 1, candidate token 2 gets +2 (so at depth 2 below token 1 the corrected
logits of C_2 are [3, 5]: log q = [-2.1269, -0.1269]); no correction elsewhere.
"""

from __future__ import annotations

import math

import pytest
import torch

from dartree import DraftBlock, make_builder

LSE21 = math.log(math.exp(2) + math.exp(1))
A1 = 2 - LSE21  # -0.3133: token 1 at depth 1
B1 = 1 - LSE21  # -1.3133: token 2 at depth 1
HALF = -math.log(2)
LSE35 = math.log(math.exp(3) + math.exp(5))
C_TOK0, C_TOK2 = 3 - LSE35, 5 - LSE35  # corrected depth 2 under token 1


class TableHead:
    """Markov head with a bias table: corrected logit = base + bias[previous token, candidate]."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table  # [V, V]

    def initial_state(self, block):
        return block.root.float()[:, None]

    def logits(self, block, depth, states, candidates):
        base = torch.gather(block.logits[:, depth - 1].float(), 1, candidates)[:, None, :]
        prev = states[..., 0].long()  # [b, m]
        bias = self.table[prev[..., None], candidates[:, None, :]]
        return base + bias

    def advance(self, block, depth, states, tokens):
        return tokens.float()[..., None]


def block_a() -> DraftBlock:
    logits = torch.tensor([[[0.0, 2.0, 1.0, -5.0], [3.0, 0.0, 3.0, 1.0]]])
    return DraftBlock(logits=logits, root=torch.tensor([0]))


def head_a() -> TableHead:
    table = torch.zeros(4, 4)
    table[1, 2] = 2.0
    return TableHead(table)


# (name, config, expected rows of (token, parent, depth, rank, score)) in node order.
GOLDEN_A = [
    ("chain", dict(topk=2, normalize="candidates"),
     [(1, 0, 1, 0, A1), (0, 1, 2, 0, A1 + HALF)]),
    ("ddtree", dict(budget=3, topk=2, normalize="candidates"),
     # (1,0) and (1,2) tie at A1 - ln2: rank path (0,0) before (0,1).
     [(1, 0, 1, 0, A1), (0, 1, 2, 0, A1 + HALF), (2, 1, 2, 1, A1 + HALF)]),
    ("ddtree", dict(budget=4, topk=2, normalize="candidates"),
     [(1, 0, 1, 0, A1), (0, 1, 2, 0, A1 + HALF), (2, 1, 2, 1, A1 + HALF), (2, 0, 1, 1, B1)]),
    ("corrected-chain", dict(topk=2),
     [(1, 0, 1, 0, A1), (2, 1, 2, 1, A1 + C_TOK2)]),
    ("sequential-heap", dict(budget=3, topk=2),
     [(1, 0, 1, 0, A1), (2, 1, 2, 1, A1 + C_TOK2), (2, 0, 1, 1, B1)]),
    ("corrected-chain-ddtree", dict(budget=4, topk=2),
     # Per-depth distributions along the corrected chain: depth 2 is [C_TOK0, C_TOK2] for every parent.
     [(1, 0, 1, 0, A1), (2, 1, 2, 1, A1 + C_TOK2), (2, 0, 1, 1, B1), (2, 3, 2, 1, B1 + C_TOK2)]),
    ("dartree-fixed", dict(budget=3, topk=2),
     # quota_1 = ceil(3/2) = 2 -> {1, 2}; quota_2 = ceil(1/1) = 1 -> best child (1,2).
     [(1, 0, 1, 0, A1), (2, 1, 2, 1, A1 + C_TOK2), (2, 0, 1, 1, B1)]),
    ("dartree-pruned", dict(budget=2, width=1, topk=2, beta=0.0),
     [(1, 0, 1, 0, A1), (2, 1, 2, 1, A1 + C_TOK2)]),
    ("dartree-pruned", dict(budget=3, width=2, topk=2, beta=0.0),
     # supertree: depth 1 {1, 2}; depth 2 top-2 of {(1,2) A1+C_TOK2, (1,0) A1+C_TOK0, (2,0), (2,2) B1-ln2}
     # = (1,2) and (2,0) (tie with (2,2) broken by rank path (1,0) < (1,1)); top-3 drops (2,0).
     [(1, 0, 1, 0, A1), (2, 1, 2, 1, A1 + C_TOK2), (2, 0, 1, 1, B1)]),
    ("dartree-pruned", dict(budget=3, width=2, topk=2, beta=-1.0),
     # beta = -1 per node: (2) = B1 - 1 = -2.31 now beats (1,2) = A1 + C_TOK2 - 2 = -2.44.
     [(1, 0, 1, 0, A1 - 1), (2, 0, 1, 1, B1 - 1), (2, 1, 2, 1, A1 + C_TOK2 - 2)]),
]


@pytest.mark.parametrize("name,config,expected", GOLDEN_A, ids=[f"{g[0]}-{i}" for i, g in enumerate(GOLDEN_A)])
def test_golden_block_a(name: str, config: dict, expected: list) -> None:
    builder = make_builder(name, **config)
    tree = builder.build(block_a(), head_a() if builder.needs_head else None)
    rows = [(0, -1, 0, -1, 0.0)] + expected
    assert tree.tokens[0].tolist() == [r[0] for r in rows]
    assert tree.parents[0].tolist() == [r[1] for r in rows]
    assert tree.depths[0].tolist() == [r[2] for r in rows]
    assert tree.ranks[0].tolist() == [r[3] for r in rows]
    torch.testing.assert_close(tree.scores[0], torch.tensor([r[4] for r in rows]), rtol=0, atol=1e-6)


def test_golden_budget_larger_than_trie() -> None:
    """Block B (V=3, gamma=3, topk=1): the trie has 3 nodes, so a budget of 10 yields the chain."""
    logits = torch.tensor([[[0.0, 1.0, 0.0], [5.0, 0.0, 0.0], [0.0, 0.0, 2.0]]])
    block = DraftBlock(logits=logits, root=torch.tensor([2]))
    for name in ("ddtree", "dartree-fixed", "dartree-pruned", "sequential-heap"):
        extra = {"beta": 0.0} if name == "dartree-pruned" else {}
        builder = make_builder(name, budget=10, topk=1, normalize="candidates", **extra)
        tree = builder.build(block, head_a() if builder.needs_head else None)
        assert tree.paths(0) == [(), (1,), (1, 0), (1, 0, 2)], name
        assert tree.scores[0].tolist() == [0.0, 0.0, 0.0, 0.0]  # one candidate: log q = 0 under "candidates"


def test_golden_batch_of_three_rows_and_ties() -> None:
    """Block C: three rows, all-equal logits at depth 1 (every score ties: ranks decide, i.e. token ids)."""
    logits = torch.zeros(3, 2, 5)
    logits[1, 1, 4] = 1.0  # row 1 prefers token 4 at depth 2
    block = DraftBlock(logits=logits, root=torch.tensor([0, 1, 2]))
    tree = make_builder("ddtree", budget=4, topk=3, normalize="candidates").build(block)
    third = -math.log(3)
    lse = math.log(math.exp(1) + 2)
    assert tree.paths(0) == [(), (0,), (1,), (2,), (0, 0)]
    assert tree.paths(1) == [(), (0,), (1,), (2,), (0, 4)]
    assert tree.paths(2) == tree.paths(0)
    torch.testing.assert_close(tree.scores[1], torch.tensor([0.0, third, third, third, third + 1 - lse]))
