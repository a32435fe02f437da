"""Build latency per round of every registry entry, ref vs fast (one group per configuration).

    DARTREE_BENCH=full .venv/bin/python -m pytest benchmarks --benchmark-only \
        --benchmark-columns=median,iqr,rounds --benchmark-sort=name

Batch 1, K=64, gamma=16, a GRU head of hidden 512 for the corrected builders (see common.py).  The
full grid also times ``sequential-heap`` and ``dartree-pruned`` at B=64 with ``PathHashHead`` (an
element-wise head that costs almost nothing), which isolates the builders' own overhead from the
head's arithmetic.
"""

from __future__ import annotations

import pytest

from benchmarks.common import BUDGETS, FULL, TOPK, VOCABS, WIDTHS, draft_block, gru_head, run
from dartree import make_builder
from dartree.testing import PathHashHead

PROVIDERS = ("ref", "fast")


def configs() -> list:
    out = []
    for vocab in VOCABS:
        for name in ("chain", "corrected-chain"):
            out.append(pytest.param(name, vocab, {}, "gru", id=f"{name}-V{vocab}"))
        for name in ("ddtree", "corrected-chain-ddtree", "sequential-heap", "dartree-fixed"):
            for budget in BUDGETS:
                out.append(pytest.param(name, vocab, {"budget": budget}, "gru", id=f"{name}-V{vocab}-B{budget}"))
        for budget in BUDGETS:
            for width in WIDTHS:
                out.append(pytest.param("dartree-pruned", vocab, {"budget": budget, "width": width}, "gru",
                                        id=f"dartree-pruned-V{vocab}-B{budget}-W{width}"))
    if FULL:
        out.append(pytest.param("sequential-heap", 4096, {"budget": 64}, "path-hash",
                                id="sequential-heap-V4096-B64-pathhash"))
        for width in WIDTHS:
            out.append(pytest.param("dartree-pruned", 4096, {"budget": 64, "width": width}, "path-hash",
                                    id=f"dartree-pruned-V4096-B64-W{width}-pathhash"))
    return out


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize(("name", "vocab", "cfg", "head_name"), configs())
def test_build(benchmark, provider: str, name: str, vocab: int, cfg: dict, head_name: str) -> None:
    builder = make_builder(name, backend=provider, topk=TOPK, **cfg)
    block = draft_block(vocab)
    head = None
    if builder.needs_head:
        head = gru_head(vocab) if head_name == "gru" else PathHashHead()
    benchmark.group = f"build {name} V={vocab}" + "".join(f" {k[0].upper()}={v}" for k, v in cfg.items())
    if head_name != "gru":
        benchmark.group += f" head={head_name}"
    tree = run(benchmark, builder.build, block, head)
    budget = cfg.get("budget", block.gamma)
    assert int(tree.num_nodes.max()) <= 1 + budget
