"""T>0 decoding end to end: target-side warpers in AR and both verifiers, the rejection verifier's output
distribution on a real model, and the options' errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import dartree
from dartree.batch import generate_ar_batch
from dartree.decode import SpeculativeDecoder, generate_ar
from dartree.models.target import HFTarget
from dartree.serve import serve
from dartree.testing import OracleDrafter, PathHashHead
from dartree.verify import GeneratorSampler, KeyedSampler
from dartree.verify.warp import Warp
from tests.test_decode import GAMMA, V, builder_and_head, model_for
from tests.verify.helpers import one_thread  # noqa: F401 (autouse fixture)

PROMPT = torch.tensor([3, 14, 15, 92])


@pytest.mark.parametrize("warp", [dict(top_p=0.9), dict(top_k=5), dict(min_p=0.2), dict(top_k=20, top_p=0.8)],
                         ids=lambda w: ",".join(f"{k}={v}" for k, v in w.items()))
@pytest.mark.parametrize("name", ["ddtree", "dartree-pruned"])
def test_matching_with_warps_equals_ar_token_for_token(name, warp):
    """Keyed draws from the warped distribution: speculative == AR with the same warp, row by row alone and
    batched; and the warp is real (AR differs from the unwarped AR)."""
    model = model_for("llama", "sdpa")
    sampler = KeyedSampler(3)
    builder, head = builder_and_head(name)
    dec = SpeculativeDecoder(model, OracleDrafter(model, GAMMA, demote=0.3, seed=1), builder, head)
    ar = generate_ar(model, PROMPT, 12, temperature=0.8, sampler=sampler, **warp).tokens.tolist()
    assert dec.generate(PROMPT, 12, temperature=0.8, sampler=sampler, **warp).tokens.tolist() == ar
    rows = dec.generate_batch([PROMPT, PROMPT[:2]], 12, temperature=0.8, sampler=sampler, **warp)
    assert rows[0].tokens.tolist() == ar
    assert generate_ar_batch(model, [PROMPT], 12, temperature=0.8, sampler=sampler, **warp)[0].tokens.tolist() == ar
    plain = generate_ar(model, PROMPT, 12, temperature=0.8, sampler=sampler).tokens.tolist()
    if warp.get("top_k") == 5:
        assert plain != ar            # the tiny model's distributions are wide: the filter changes draws


def _exact_joint(model, warp: Warp, length: int) -> dict[tuple[int, ...], float]:
    """The target's distribution over its next ``length`` tokens after PROMPT (enumerated; a sparse warp)."""
    out = {(): 1.0}
    with torch.no_grad():
        for _ in range(length):
            nxt = {}
            for seq, pr in out.items():
                ids = torch.cat([PROMPT, torch.tensor(seq, dtype=torch.int64)])[None]
                p = warp.logits(model(ids).logits[0, -1]).double().softmax(-1)
                for v in torch.nonzero(p).reshape(-1).tolist():
                    nxt[seq + (v,)] = pr * float(p[v])
            out = nxt
    return out


@pytest.mark.parametrize("name", ["dartree-pruned"])     # corrected-sequoia: the reused-blocks test below
def test_rejection_decoding_follows_the_target_distribution(name):
    """Seeded chi-square of 3-token outputs of the rejection verifier against the target's exact joint (top-k
    3: at most 27 outcomes), on a real model with a drafter that is not the target; rounds accept drafts.
    With the residual update removed (tests/verify/test_rejection_distribution.py's biased step) the same
    check gave 115 against the bound 78 (ddtree, 2026-12-04)."""
    model = model_for("llama", "sdpa")
    warp = Warp(1.0, top_k=3)
    joint = _exact_joint(model, warp, 3)
    builder, head = builder_and_head(name)
    drafter = OracleDrafter(model, GAMMA, demote=0.5, seed=4)
    dec = SpeculativeDecoder(model, drafter, builder, head)
    draws = 300
    counts, rounds = _sampled_outputs(dec, draws, 3, seed=5)
    assert sum(r.accepted_length for r in rounds) > draws // 4     # the rounds do accept sampled drafts
    stat = _chi_square(counts, joint, draws)
    assert stat < 3 * (len(joint) - 1), stat                       # df <= 26: far past the 1e-6 quantile


def _sampled_outputs(dec, draws: int, length: int, seed: int) -> tuple[dict[tuple[int, ...], int], list]:
    """How often each ``length``-token output came out of ``draws`` rejection decodes (T=1, top-k 3), and every
    round of them."""
    sampler = GeneratorSampler(torch.Generator().manual_seed(seed))
    counts: dict[tuple[int, ...], int] = {}
    rounds: list = []
    for _ in range(draws):
        out = dec.generate(PROMPT, length, temperature=1.0, sampler=sampler, top_k=3, verifier="rejection")
        key = tuple(out.tokens[0].tolist())
        counts[key] = counts.get(key, 0) + 1
        rounds += out.rounds
    return counts, rounds


def _chi_square(counts: dict[tuple[int, ...], int], joint: dict[tuple[int, ...], float], draws: int) -> float:
    assert set(counts) <= set(joint)                               # nothing outside the warped support
    expected = np.array([draws * joint[k] for k in joint])
    got = np.array([counts.get(k, 0) for k in joint])
    return float(((got - expected) ** 2 / expected).sum())


def test_rejection_with_reused_blocks_follows_the_target_distribution():
    """corrected-sequoia reuses a block across rounds (the head proposes along the committed path): fewer
    drafts than rounds, and the seeded chi-square of 4-token outputs against the target's exact joint (top-k 3:
    81 outcomes) holds: 79 against df 80; with the residual update removed the same check gave 284 (2026-12-04)."""
    model = model_for("llama", "sdpa")
    warp = Warp(1.0, top_k=3)
    joint = _exact_joint(model, warp, 4)
    drafts = []

    class Counting(OracleDrafter):
        def draft(self, root):
            drafts.append(1)
            return super().draft(root)

    builder = dartree.make_builder("corrected-sequoia", budget=4, topk=3, acceptance=(0.5, 0.2), reuse_depths=1)
    dec = SpeculativeDecoder(model, Counting(model, 8, demote=0.0, seed=4), builder, PathHashHead())
    draws = 300
    counts, rounds = _sampled_outputs(dec, draws, 4, seed=6)
    assert len(drafts) < len(rounds) * 0.8                         # most rounds reused a block
    stat = _chi_square(counts, joint, draws)
    assert stat < 2 * (len(joint) - 1), stat                       # df <= 80: far past the 1e-6 quantile


@pytest.mark.parametrize("name", ["ddtree", "dartree-pruned", "corrected-sequoia"])   # drafter's proposals; head's
def test_rejection_runs_batched_and_served(name):
    model = model_for("qwen3", "eager")
    builder, head = builder_and_head(name)
    dec = SpeculativeDecoder(model, OracleDrafter(model, GAMMA, demote=0.3, seed=2), builder, head)
    g = torch.Generator().manual_seed(0)
    rows = dec.generate_batch([PROMPT, PROMPT[:1], PROMPT[1:]], 9, temperature=1.0, sampler=GeneratorSampler(g),
                              verifier="rejection")
    assert [r.tokens.shape[1] for r in rows] == [9, 9, 9]
    assert all(0 <= t < V for r in rows for t in r.tokens[0].tolist())
    out = serve(dec, [PROMPT, PROMPT[:2]], 1, 6, temperature=0.7, sampler=GeneratorSampler(g), verifier="rejection",
                top_p=0.9)
    assert out.tokens == 12


def test_default_verifier_follows_the_sampler():
    model = model_for("llama", "sdpa")
    builder, head = builder_and_head("chain")
    dec = SpeculativeDecoder(model, OracleDrafter(model, GAMMA), builder, head)
    assert dec.engine(None).verifier.name == "greedy"
    from dartree.rounds import DEFAULT_VERIFIER, check_request

    target = HFTarget(model)
    assert check_request(target, PROMPT, 4, 1.0, KeyedSampler(1)).verifier == "match"
    assert check_request(target, PROMPT, 4, 1.0).verifier == DEFAULT_VERIFIER
    assert check_request(target, PROMPT, 4, 0.0, verifier="rejection").verifier == "greedy"


@pytest.mark.parametrize("kwargs, field", [
    (dict(verifier="rejected"), "verifier"), (dict(verifier=1), "verifier"),
    (dict(verifier="rejection", sampler=KeyedSampler(1)), "sampler"),
    (dict(top_p=1.5), "top_p"), (dict(top_k=0), "top_k"), (dict(min_p=-1), "min_p"),
    (dict(top_p=2.0, temperature=0.0), "top_p"),             # checked at T=0 too (a typo)
])
def test_bad_options_are_named(kwargs, field):
    model = model_for("llama", "sdpa")
    builder, head = builder_and_head("chain")
    drafter = OracleDrafter(model, GAMMA)
    dec = SpeculativeDecoder(model, drafter, builder, head)
    args = {"temperature": 1.0} | kwargs
    with pytest.raises(ValueError, match=field):
        dec.generate(PROMPT, 4, **args)
    with pytest.raises(ValueError, match=field):
        dec.generate_batch([PROMPT], 4, **args)
    if "verifier" not in kwargs:
        with pytest.raises(ValueError, match=field):
            generate_ar(model, PROMPT, 4, **args)
    assert drafter.context.shape == (1, 0)                      # nothing was started


def test_traversal_decoding_follows_the_target_distribution():
    """Traversal Verification end to end: 240 rows decoded together (independent draws: each row's coins are its
    own) by corrected-sequoia with a head; seeded chi-square of 3-token outputs against the target's exact joint
    (top-k 3: 27 outcomes), and the rounds accept sampled drafts.  A sanity check of the wiring: the law itself is
    proved by tests/verify/test_traversal.py (exact), whose biased variants this smaller sample does not resolve."""
    model = model_for("llama", "sdpa")
    joint = _exact_joint(model, Warp(1.0, top_k=3), 3)
    builder = dartree.make_builder("corrected-sequoia", budget=6, topk=3, acceptance=(0.5, 0.2))
    dec = SpeculativeDecoder(model, OracleDrafter(model, 2, demote=0.5, seed=4), builder, PathHashHead())
    draws = 240
    rows = dec.generate_batch([PROMPT] * draws, 3, temperature=1.0, sampler=GeneratorSampler(
        torch.Generator().manual_seed(7)), top_k=3, verifier="traversal")
    counts: dict[tuple[int, ...], int] = {}
    for row in rows:
        key = tuple(row.tokens[0].tolist())
        counts[key] = counts.get(key, 0) + 1
    assert sum(r.accepted_length for row in rows for r in row.rounds) > draws // 4
    stat = _chi_square(counts, joint, draws)
    assert stat < 3 * (len(joint) - 1), stat                       # df <= 26: far past the 1e-6 quantile
    out = serve(dec, [PROMPT, PROMPT[:2]], 1, 6, temperature=0.7, sampler=GeneratorSampler(torch.Generator()),
                verifier="traversal", top_p=0.9)                   # served, one request in flight at a time
    assert out.tokens == 12
