"""One depth step of a correction head: ``advance`` + ``logits`` (two calls) vs the fused ``advance_logits``.

    .venv/bin/python -m pytest benchmarks/test_bench_heads.py --benchmark-only \
        --benchmark-columns=median,iqr,rounds --benchmark-sort=name

m = 12 branches, K = 64 candidates, batch 1, one thread; heads: the bundled zoo's GRU and Markov
heads and a GRU of hidden 512 (common.py).  The fused call is asserted bit-identical to the two.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.common import TOPK, draft_block, gru_head, run

BRANCHES = 12


def _head(name: str):
    if name == "gru-512":
        return gru_head(4096), draft_block(4096)
    from dartree.models import zoo

    bundle = zoo.load()
    head = bundle.heads[name.removeprefix("zoo-")]
    g = torch.Generator().manual_seed(0)
    vocab, hidden = bundle.drafter.config.vocab_size, bundle.drafter.config.hidden_size
    from dartree import DraftBlock

    block = DraftBlock(logits=torch.randn(1, 15, vocab, generator=g), root=torch.randint(0, vocab, (1,), generator=g),
                       hidden=torch.randn(1, 15, hidden, generator=g))
    return head, block


@pytest.mark.parametrize("provider", ["two-calls", "fused"])
@pytest.mark.parametrize("name", ["zoo-gru", "zoo-markov", "gru-512"])
def test_depth_step(benchmark, provider: str, name: str) -> None:
    head, block = _head(name)
    g = torch.Generator().manual_seed(1)
    states = head.initial_state(block)[:, None].expand(-1, BRANCHES, -1).contiguous()
    tokens = torch.randint(0, block.vocab_size, (1, BRANCHES), generator=g)
    candidates = torch.randperm(block.vocab_size, generator=g)[:TOPK][None]

    def two_calls():
        s = head.advance(block, 3, states, tokens)
        return s, head.logits(block, 4, s, candidates)

    def fused():
        return head.advance_logits(block, 3, states, tokens, candidates)

    benchmark.group = f"head depth step {name} m={BRANCHES} K={TOPK}"
    with torch.no_grad():
        got = run(benchmark, two_calls if provider == "two-calls" else fused)
        want = two_calls()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("provider", ["bare", "proxy"])
@pytest.mark.parametrize("name", ["zoo-gru", "path-hash"])
def test_proxy_depth_step(benchmark, provider: str, name: str) -> None:
    """What the decoder's head proxy (``TimedHead``: output checks, and a copy of ``states`` for a user
    head such as ``PathHashHead``; none for dartree's own) adds to one ``advance`` + ``logits`` step."""
    from dartree.testing import PathHashHead
    from dartree.timing import TimedHead

    head, block = _head("zoo-gru") if name == "zoo-gru" else (PathHashHead(), _head("zoo-gru")[1])
    proxy = TimedHead(head)
    g = torch.Generator().manual_seed(1)
    proxy.initial_state(block)                                   # the proxy learns the state width
    states = head.initial_state(block)[:, None].expand(-1, BRANCHES, -1).contiguous()
    tokens = torch.randint(0, block.vocab_size, (1, BRANCHES), generator=g)
    candidates = torch.randperm(block.vocab_size, generator=g)[:TOPK][None]
    call = head if provider == "bare" else proxy

    def step():
        s = call.advance(block, 3, states, tokens)
        return s, call.logits(block, 4, s, candidates)

    benchmark.group = f"head proxy {name} m={BRANCHES} K={TOPK}"
    with torch.no_grad():
        got = run(benchmark, step)
        want = head.advance(block, 3, states, tokens)
        want = want, head.logits(block, 4, want, candidates)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
