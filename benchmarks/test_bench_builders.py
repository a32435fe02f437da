"""Build latency per round of every registry entry: providers ref / fast (/ host for ``ddtree``).

    DARTREE_BENCH=goals .venv/bin/python -m pytest benchmarks/test_bench_builders.py --benchmark-only \
        --benchmark-json=run.json && .venv/bin/python benchmarks/summarize.py run.json

Batch 1, K=64, gamma=16, a GRU head of hidden 512 for the corrected builders (see common.py).

- ``goals`` (DARTREE_BENCH=goals): exactly the groups the ratios of the issue are read from, in one
  run: ``ddtree`` build + ancestor mask at B=64, gamma=15, V in {4096, 151936} (providers ref / fast
  / host: DDTree's published heapq + numpy builder, :mod:`benchmarks.host_ddtree`, checked node for
  node against ours); ``sequential-heap`` and ``dartree-pruned`` W in {4, 12, 32} at B=64 with the GRU
  head and with ``PathHashHead`` (a head that costs nothing, which isolates the builders); ``chain``.
  The GRU groups record the share of the build spent inside head calls (``extra_info``).
- ``full``: the whole grid (B in {16, 64, 128}, W in {4, 12, 32}, V in {4096, 151936}).
- default (CI, ``--benchmark-disable``): the smallest configuration of each group.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from benchmarks.common import BUDGETS, FULL, GOALS, TOPK, VOCABS, WIDTHS, draft_block, gru_head, run
from benchmarks.host_ddtree import build_ddtree
from dartree import DraftBlock, make_builder
from dartree.testing import PathHashHead
from dartree.timing import TimedHead  # times every head call, the prepared ones too
from dartree.tree import check_decodable


def configs() -> list:
    out = []
    grid_vocabs = VOCABS if not GOALS else ()
    for vocab in grid_vocabs:
        for name in ("chain", "corrected-chain"):
            out.append(pytest.param(name, vocab, {}, "gru", id=f"{name}-V{vocab}"))
        for name in ("ddtree", "corrected-chain-ddtree", "sequential-heap", "dartree-fixed"):
            for budget in BUDGETS:
                out.append(pytest.param(name, vocab, {"budget": budget}, "gru", id=f"{name}-V{vocab}-B{budget}"))
        for budget in BUDGETS:
            for width in WIDTHS:
                out.append(pytest.param("dartree-pruned", vocab, {"budget": budget, "width": width}, "gru",
                                        id=f"dartree-pruned-V{vocab}-B{budget}-W{width}"))
    if FULL or GOALS:
        if GOALS:
            out.append(pytest.param("chain", 4096, {}, "gru", id="chain-V4096"))
        for head_name in ("gru", "path-hash"):
            if GOALS or head_name == "path-hash":
                out.append(pytest.param("sequential-heap", 4096, {"budget": 64}, head_name,
                                        id=f"sequential-heap-V4096-B64-{head_name}"))
                for width in (4, 12, 32):
                    out.append(pytest.param("dartree-pruned", 4096, {"budget": 64, "width": width}, head_name,
                                            id=f"dartree-pruned-V4096-B64-W{width}-{head_name}"))
    return out


@pytest.mark.parametrize("provider", ("ref", "fast"))
@pytest.mark.parametrize(("name", "vocab", "cfg", "head_name"), configs())
def test_build(benchmark, provider: str, name: str, vocab: int, cfg: dict, head_name: str) -> None:
    builder = make_builder(name, backend=provider, topk=TOPK, **cfg)
    block = draft_block(vocab)
    head = None
    if builder.needs_head:
        head = TimedHead(gru_head(vocab) if head_name == "gru" else PathHashHead())
    benchmark.group = f"build {name} V={vocab}" + "".join(f" {k[0].upper()}={v}" for k, v in cfg.items())
    if head_name != "gru":
        benchmark.group += f" head={head_name}"
    start = time.perf_counter()
    tree = run(benchmark, builder.build, block, head)
    if head is not None:
        benchmark.extra_info["head_share"] = head.seconds / (time.perf_counter() - start)
    assert int(tree.num_nodes.max()) <= 1 + cfg.get("budget", block.gamma)


DDTREE_VOCABS = (4096, 151936) if GOALS or FULL else (4096,)


def ddtree_block(vocab: int) -> DraftBlock:
    """gamma=15, the setting of DDTree's comparison."""
    block = draft_block(vocab)
    return DraftBlock(logits=block.logits[:, :15].contiguous(), root=block.root)


@pytest.mark.parametrize("provider", ("ref", "fast", "host"))
@pytest.mark.parametrize("vocab", DDTREE_VOCABS)
def test_ddtree_and_mask(benchmark, provider: str, vocab: int) -> None:
    """``ddtree`` build + ancestor mask, B=64, K=64 (DDTree's published builder as ``host``)."""
    block = ddtree_block(vocab)
    benchmark.group = f"ddtree+mask V={vocab} B=64 gamma=15"
    if provider == "host":
        out = run(benchmark, build_ddtree, block.logits[0], 64, TOPK)
        ours = make_builder("ddtree", backend="fast", budget=64, topk=TOPK).build(block)
        assert out.tokens.tolist() == ours.tokens[0, 1:].tolist()  # the same tree, node for node
        assert out.parents.tolist() == ours.parents[0, 1:].tolist()
        assert np.array_equal(out.mask, ours.ancestor_mask()[0].numpy())
        return
    builder = make_builder("ddtree", backend=provider, budget=64, topk=TOPK)

    def build_and_mask():
        tree = builder.build(block)
        return tree, tree.ancestor_mask()

    tree, mask = run(benchmark, build_and_mask)
    assert torch.equal(mask.sum((1, 2)), tree.depths.sum(1) + tree.num_nodes)  # ancestors-or-self per node


@pytest.mark.parametrize("budget", [16, 64])
def test_check_decodable(benchmark, budget: int) -> None:
    """The decoder's check of a tree from a strategy registered from outside (once per round; about
    50-60 us on one thread against a 10-20 ms round; was a timed unit test in tests/test_builders.py)."""
    blk = DraftBlock(logits=torch.randn(1, 16, 1000), root=torch.tensor([5]))
    tree = make_builder("ddtree", budget=budget, topk=8).build(blk)
    benchmark(check_decodable, tree, blk)
