"""Peer decoders as benchmark rows: they decode what AR decodes, their rows have no stages, bad names are refused."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from dartree import generate_ar
from dartree.eval import peers
from dartree.eval.bench import BenchConfig, RunRecord, run_bench, summarize
from dartree.eval.bundles import tiny_random_bundle
from dartree.eval.methods import AR, MethodSpec, parse_methods
from dartree.eval.report import bench_markdown, table1, table2
from dartree.rounds import ROUND_STAGES
from dartree.verify.warp import Warp


@pytest.fixture(scope="module")
def bundle():
    return tiny_random_bundle()


@pytest.mark.parametrize("name", ["hf-generate", "hf-prompt-lookup"])
def test_hf_peers_decode_what_ar_decodes(bundle, name):
    ids = torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6]])
    out = peers.make_peer(name, bundle)(ids, 12)
    assert out.tokens.shape == (1, 12) and out.committed is None
    assert torch.equal(out.tokens, generate_ar(bundle.target, ids, 12).tokens)


def test_dflash_absent_is_a_reason_not_a_crash(bundle, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "dflash" else real(n, *a))
    assert "pip install --no-deps dflash" in peers.peer_unavailable("dflash", bundle)
    with pytest.raises(ValueError, match="peer: dflash cannot run"):
        peers.make_peer("dflash", bundle)


def test_dflash_needs_a_dflash_drafter(bundle):
    if importlib.util.find_spec("dflash") is None:
        pytest.skip("the dflash package is not installed (pip install --no-deps dflash==0.1.0)")
    assert "not a DFlash drafter" in peers.peer_unavailable("dflash", bundle)      # the toy's OracleDrafter


def test_bad_peer_names_are_refused():
    with pytest.raises(ValueError, match="peer: must be one of"):
        peers.peer_unavailable("vllm")
    with pytest.raises(ValueError, match="peers: each must be one of"):
        BenchConfig(methods=(MethodSpec("chain", label="chain"),), peers=("nope",))
    with pytest.raises(ValueError, match="stop_at_eos"):
        BenchConfig(methods=(MethodSpec("chain", label="chain"),), peers=("hf-generate",), stop_at_eos=True)


def _record(method: str, seconds: float, committed: tuple[int, ...], new_tokens: int = 8) -> RunRecord:
    return RunRecord(method, "humaneval", 0.0, "p0", 5, new_tokens, seconds, 0.0, tuple(c - 1 for c in committed),
                     committed, (0,) * len(committed), (0.0,) * len(ROUND_STAGES), True)


def test_a_peer_row_has_a_speedup_and_no_stages():
    ar = _record(AR, 2.0, (1,) * 7)
    lookup = _record(peers.PEER_PREFIX + "hf-prompt-lookup", 1.0, ())
    dflash = _record(peers.PEER_PREFIX + "dflash", 0.5, (4, 3))
    summaries = summarize([ar, lookup, dflash], (MethodSpec(AR, label=AR),), "auto", 4)
    by = {s.method: s for s in summaries}
    assert by["peer:hf-prompt-lookup"].speedup == pytest.approx(2.0) and by["peer:hf-prompt-lookup"].rounds == 0
    assert by["peer:dflash"].speedup == pytest.approx(4.0) and by["peer:dflash"].tau == pytest.approx(3.5)
    text = table1(summaries, 0.0)
    assert "| peer:hf-prompt-lookup |  | 2.00x | - |" in text and "| peer:dflash |  | 4.00x | 3.50 |" in text
    assert "peer:" not in table2(summaries, 0.0)


@pytest.mark.parametrize("name", ["hf-generate", "hf-prompt-lookup"])
def test_hf_peers_sample_at_t_above_0_with_the_runs_warpers_and_seed(bundle, monkeypatch, name):
    """At T>0 HF's generate samples with exactly the run's warpers (its default top-k 50 off), each call seeded
    by the peer's seed and the call's index, torch's global generator left as it was."""
    ids = torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6]])
    seen, real = [], bundle.target.generate
    monkeypatch.setattr(bundle.target, "generate", lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    before = torch.random.get_rng_state()
    warp = Warp(0.7, top_p=0.9)
    first = peers.make_peer(name, bundle, warp=warp, seed=3)
    out = [first(ids, 12).tokens for _ in range(2)]
    again = peers.make_peer(name, bundle, warp=warp, seed=3)(ids, 12).tokens
    other = peers.make_peer(name, bundle, warp=warp, seed=4)(ids, 12).tokens
    assert torch.equal(out[0], again) and not torch.equal(out[0], out[1]) and not torch.equal(out[0], other)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert {k: seen[0][k] for k in ("do_sample", "temperature", "top_k", "top_p", "min_p")} == dict(
        do_sample=True, temperature=0.7, top_k=0, top_p=0.9, min_p=None)
    greedy = peers.make_peer(name, bundle)
    assert torch.equal(greedy(ids, 12).tokens, generate_ar(bundle.target, ids, 12).tokens)
    assert seen[-1]["do_sample"] is False
    assert "greedy only" in peers.peer_unavailable("dflash", bundle, warp)
    peers.make_peer(name, bundle, warp=Warp(1.0, top_p=0.0), seed=2**63 - 1)(ids, 3)     # any --seed; top-p 0 kept
    assert seen[-1]["top_p"] == 0.0 and seen[-1]["top_k"] == 0


def test_the_bench_times_hf_peers_at_every_temperature_and_compares_them_at_0_only(bundle):
    config = BenchConfig(methods=parse_methods(["chain"]), datasets=("humaneval",), temperatures=(0.0, 1.0),
                         num_prompts=1, max_new_tokens=6, max_prompt_tokens=32, backend="ref", warmup=False,
                         law_draws=2, peers=("hf-generate",))
    logged: list[str] = []
    res = run_bench(bundle, config, log=logged.append, progress=False)
    rows = {(r.method, r.temperature): r for r in res.records}
    assert rows[("peer:hf-generate", 0.0)].verifier == "greedy" and rows[("peer:hf-generate", 0.0)].matches_ar
    assert rows[("peer:hf-generate", 1.0)].verifier == "sample" and rows[("peer:hf-generate", 1.0)].new_tokens == 6
    assert "| peer:hf-generate |" in table1(res.summaries, 1.0).split("\n")[-1]
    assert table1(res.summaries, 1.0).split("\n")[-1].endswith(" | - |")      # not compared, not law-tested
    assert table1(res.summaries, 0.0).split("\n")[-1].endswith(" | 1/1 = AR |")
    assert "peer:hf-generate at T>0 sample with HF's own sampler: timed, not compared" in bench_markdown(res)
