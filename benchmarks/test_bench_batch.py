"""Batched AR vs single-request AR on the zoo target (issue 13's goal: >= 3x tokens/s at C=8, one thread).

provider ``single``: ``generate_ar`` on 8 prompts one after the other; ``batched``: ``serve`` with
the 8 prompts in flight (``dartree.batch.generate_ar_batch``: one forward per step for every live row).  Both
decode the same tokens (asserted); compare the medians (same work, so the time ratio is the
tokens/s ratio).  Prompts: the first 8 humaneval prompts (last 128 tokens), 32 new tokens each
(``DARTREE_BENCH=full``: 64).
"""

from __future__ import annotations

import functools

import pytest
import torch

from benchmarks.common import FULL, run
from dartree.decode import generate_ar
from dartree.serve import serve

NEW_TOKENS = 64 if FULL else 32
CONCURRENCY = 8


@functools.cache
def zoo_and_prompts():
    from dartree.eval.bundles import encode
    from dartree.eval.datasets import load_prompts
    from dartree.models import zoo

    bundle = zoo.load()
    prompts = [torch.tensor(encode(bundle.tokenizer, p.text)[-128:]) for p in load_prompts("humaneval", CONCURRENCY)]
    return bundle.target, prompts


@pytest.mark.parametrize("provider", ["single", "batched"])
def test_ar_concurrency_8(benchmark, provider: str) -> None:
    target, prompts = zoo_and_prompts()
    benchmark.group = f"ar C={CONCURRENCY} x {NEW_TOKENS} tokens"
    if provider == "single":
        def fn():
            return [generate_ar(target, p, NEW_TOKENS).tokens for p in prompts]
    else:
        def fn():
            return [r.tokens for r in serve(target, prompts, CONCURRENCY, NEW_TOKENS).results]
    out = run(benchmark, fn)
    assert [t.tolist() for t in out] == [generate_ar(target, p, NEW_TOKENS).tokens.tolist() for p in prompts]
