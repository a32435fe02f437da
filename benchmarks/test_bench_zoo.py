"""Loading the bundled zoo from the package (target, tokenizer, drafter, both heads), offline.

    .venv/bin/python -m pytest benchmarks/test_bench_zoo.py --benchmark-only

It was a unit test with a 15 s limit; timing belongs here (68 ms median on one thread, 2026-12-04).
"""

from __future__ import annotations

from dartree.models import zoo


def test_zoo_load(benchmark):
    bundle = benchmark.pedantic(zoo.load, args=(zoo.DEFAULT_NAME,), rounds=3, iterations=1, warmup_rounds=1)
    assert set(bundle.heads) == {"gru", "markov"}
