"""Rows of ``generate_batch`` and requests of ``dartree.serve.serve`` each follow the target's law: prompts of
different lengths in one batch, rows finishing early at a stop token (the batch shrinks under the others),
requests joining as others finish, and rows independent of each other (the joint of two rows' tokens is the
product of their laws).  Seeded chi-square tests at ``ALPHA`` (tests/law/helpers.py)."""

from __future__ import annotations

import functools

import pytest
import torch

from dartree.serve import serve
from dartree.testing.law import chi_square, target_law
from dartree.verify import GeneratorSampler
from tests.law.helpers import ALPHA, PROMPT, WARPS, decoder, options, target
from tests.verify.helpers import one_thread  # noqa: F401 (autouse fixture)

LONG = torch.tensor([4, 0, 5, 1, 2])     # a second prompt, longer than PROMPT
LENGTH = 3
STOP = 1                                 # in ~9% (PROMPT) and ~23% (LONG) of outputs at T=1: those rows finish early


def stopped(law: dict, stop: int) -> dict:
    """``law`` with every outcome cut after its first ``stop`` token (what a decode with that stop token gives)."""
    out: dict = {}
    for k, v in law.items():
        key = k[: k.index(stop) + 1] if stop in k else k
        out[key] = out.get(key, 0.0) + v
    return out


@functools.cache
def laws(warp: str):
    return tuple(stopped(target_law(target(), p, LENGTH, WARPS[warp]), STOP) for p in (PROMPT, LONG))


def marginal(law: dict, i: int) -> dict:
    """The law of the ``i``-th token (``-1``: none, the decode stopped before it)."""
    out: dict = {}
    for k, v in law.items():
        key = (k[i] if i < len(k) else -1,)
        out[key] = out.get(key, 0.0) + v
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name,verifier,warp", [("dartree-pruned", "rejection", "T1"),
                                                ("corrected-sequoia", "rejection", "T0.7"),
                                                ("ddtree", "match", "T1-minp0.05")])
def test_batch_rows_of_different_prompts_and_early_stops_follow_the_law_independently(name, verifier, warp):
    pairs = 400
    dec = decoder(name, "fast")
    sampler = GeneratorSampler(torch.Generator().manual_seed(21))
    rows = dec.generate_batch([PROMPT, LONG] * pairs, LENGTH, sampler=sampler, stop_token_ids=[STOP],
                              verifier=verifier, **options(WARPS[warp]))
    outs = [tuple(r.tokens[0].tolist()) for r in rows]
    assert any(len(o) < LENGTH for o in outs) and any(len(o) == LENGTH for o in outs)   # some rows left early
    for parity, law in enumerate(laws(warp)):
        counts: dict = {}
        for o in outs[parity::2]:
            counts[o] = counts.get(o, 0) + 1
        check = chi_square(counts, law, ALPHA)
        assert check.passed, f"{name} ({verifier}, {warp}), prompt {parity}: {check}"
    # independence: the second tokens of the two rows of a pair, against the product of their laws
    a, b = (marginal(law, 1) for law in laws(warp))
    joint = {ka + kb: va * vb for ka, va in a.items() for kb, vb in b.items()}
    counts = {}
    for x, y in zip(outs[0::2], outs[1::2], strict=True):
        key = (x[1] if len(x) > 1 else -1, y[1] if len(y) > 1 else -1)
        counts[key] = counts.get(key, 0) + 1
    check = chi_square(counts, joint, ALPHA)
    assert check.passed, f"{name} ({verifier}, {warp}): rows not independent: {check}"


@pytest.mark.slow
@pytest.mark.parametrize("name,verifier,concurrency", [("dartree-pruned", "rejection", 24), ("sequoia", "match", 24),
                                                       ("corrected-sequoia", "rejection", 2)])
def test_served_requests_joining_as_others_finish_follow_the_law(name, verifier, concurrency):
    """Concurrency 2: every admission lands beside a row in mid-decode (a slot frees every round or two).  (A row
    left alone would reuse its block, but serve fills the free slot before the next round: measured, no round
    of this run reuses one; tests/law/test_law_edges.py covers reuse.)"""
    requests, warp = 600, "T1-topk3"
    dec = decoder(name, "fast")
    got: dict[int, tuple[int, ...]] = {}
    out = serve(dec, [PROMPT, LONG] * (requests // 2), concurrency, LENGTH, sampler=GeneratorSampler(
        torch.Generator().manual_seed(5)), stop_token_ids=[STOP], verifier=verifier,
        on_finish=lambda i, r: got.__setitem__(i, tuple(r.tokens[0].tolist())), **options(WARPS[warp]))
    assert len(got) == requests and out.tokens == sum(len(v) for v in got.values())
    for parity, law in enumerate(laws(warp)):
        counts: dict = {}
        for i in range(parity, requests, 2):
            counts[got[i]] = counts.get(got[i], 0) + 1
        check = chi_square(counts, law, ALPHA)
        assert check.passed, f"{name} ({verifier}) served, prompt {parity}: {check}"
