"""The bench at T>0: the library's default verifier, and the distribution check of rejection rows on the run."""

import dataclasses

import pytest
import torch

import dartree.eval.bench as bench_mod
from dartree.decode import generate_ar
from dartree.eval.bench import BenchConfig, run_bench
from dartree.eval.bundles import encode
from dartree.eval.lawcheck import ALPHA, chi_square_uniform, law_check, pit_values
from dartree.eval.methods import parse_methods
from dartree.eval.report import bench_markdown, table1
from dartree.verify.sampling import GeneratorSampler
from dartree.verify.warp import Warp


def _config(methods, **kw):
    base = dict(methods=parse_methods(methods), datasets=("humaneval",), temperatures=(1.0,), num_prompts=1,
                max_new_tokens=8, max_prompt_tokens=32, backend="ref", warmup=False, law_draws=12)
    return BenchConfig(**(base | kw))


def test_t1_rows_verify_with_the_librarys_default_and_pass_the_law_check(bundle):
    """No verifier named anywhere: rows at T>0 verify by rejection (the library's default), their tokens are
    tested in law on the run (rounds' tokens + the extra one-round draws), and the table says what was checked;
    a method that names ``match`` is compared with AR token for token."""
    res = run_bench(bundle, _config(["chain", "ddtree:budget=4,verifier=match"]), log=lambda s: None,
                    progress=False)
    rows = {r.method: r.verifier for r in res.records}
    assert rows == {"ar": "greedy", "chain": "traversal", "ddtree:budget=4,verifier=match": "match"}
    (check,) = res.law_checks
    assert (check.method, check.temperature) == ("chain", 1.0)
    assert check.tokens == 7 + 12 and check.passed and check.alpha == ALPHA   # 8 new tokens but the prefill's
    assert res.lossless
    t1 = table1(res.summaries, 1.0)
    assert f"| {check.text} |" in t1 and "| 1/1 = AR (keyed) |" in t1
    assert "distribution check" not in bench_markdown(res) or res.lossless


def test_the_law_check_catches_a_decoder_whose_first_verified_token_is_off(bundle, monkeypatch):
    """A decoder whose first round's first token is the target's argmax (not a draw from its law) fails the
    distribution check, and the run is not lossless."""
    make = bench_mod.make_decoder

    class ArgmaxFirst:
        def __init__(self, decoder):
            self.decoder = decoder

        def generate(self, ids, n, temperature=0.0, sampler=None, stop_token_ids=None, **options):
            res = self.decoder.generate(ids, n, temperature, sampler, stop_token_ids, **options)
            if temperature == 0 or res.tokens.shape[1] < 2:
                return res
            logits = bundle.target(input_ids=res.sequence[:, : ids.shape[1] + 1]).logits[0, -1]
            tokens = res.tokens.clone()
            tokens[0, 1] = logits.argmax()
            return dataclasses.replace(res, tokens=tokens)

    monkeypatch.setattr(bench_mod, "make_decoder", lambda *a, **k: ArgmaxFirst(make(*a, **k)))
    res = run_bench(bundle, _config(["chain"], law_draws=24), log=lambda s: None, progress=False)
    (check,) = res.law_checks
    assert not check.passed and check.p_value < ALPHA and "FAILS" in check.text
    assert not res.lossless and "FAILED" in bench_markdown(res)


def test_pit_is_uniform_under_the_law_and_not_under_another(bundle):
    """AR draws at T=1 pass a T=1 check; draws at T=0.3 (a sharper law: the toy's logits are nearly flat) fail
    it; a token outside top-k is impossible and fails alone."""
    ids = torch.tensor([encode(bundle.tokenizer, "def f(x):\n")])
    warp = Warp(1.0)
    jitter = torch.Generator().manual_seed(0)
    u_ok, u_bad = [], []
    for seed in range(4):
        gen = GeneratorSampler(torch.Generator().manual_seed(seed))
        ok = generate_ar(bundle.target, ids, 40, 1.0, gen)
        sharp = generate_ar(bundle.target, ids, 40, 0.3, GeneratorSampler(torch.Generator().manual_seed(seed)))
        u_ok += pit_values(bundle.target, ok.sequence, ids.shape[1], warp, jitter)[0]
        u_bad += pit_values(bundle.target, sharp.sequence, ids.shape[1], warp, jitter)[0]
    assert law_check("ar", 1.0, u_ok).passed
    assert not law_check("sharp", 1.0, u_bad).passed
    seq = torch.cat([ids, torch.tensor([[int(bundle.target(input_ids=ids).logits[0, -1].argmin())]])], dim=1)
    u, impossible = pit_values(bundle.target, seq, ids.shape[1], Warp(1.0, top_k=5), jitter)
    assert impossible == 1 and not law_check("x", 1.0, u, impossible).passed
    stat, df, p = chi_square_uniform([0.05] * 10 + [0.95] * 10)
    assert df == 9 and stat == pytest.approx(80.0) and p < 1e-12
    with pytest.raises(ValueError, match="law_draws"):
        _config(["chain"], law_draws=-1)


def test_ar_is_timed_with_the_generator_sampler_and_match_rows_equal_an_untimed_keyed_ar(bundle, monkeypatch):
    """The AR baseline at T>0 draws with the cheap generator sampler (as a user's AR does; the keyed sampler hashes
    the vocabulary every token, ~13% of an AR step on the zoo); a ``match`` row is compared with an untimed keyed
    AR run, and a method resolved to AR (``auto`` -> ar) with the timed AR's own draws."""
    from dartree.verify.sampling import KeyedSampler

    calls, inside = [], []
    real_ar, real_timed = bench_mod.generate_ar, bench_mod.timed

    def spy_ar(*args, **kwargs):
        calls.append((type(args[4]).__name__, bool(inside)))
        return real_ar(*args, **kwargs)

    def spy_timed(device, fn):
        inside.append(1)
        try:
            return real_timed(device, fn)
        finally:
            inside.pop()

    monkeypatch.setattr(bench_mod, "generate_ar", spy_ar)
    monkeypatch.setattr(bench_mod, "timed", spy_timed)
    res = run_bench(bundle, _config(["ddtree:budget=4,verifier=match"], law_draws=0), log=lambda s: None,
                    progress=False)
    assert calls == [("GeneratorSampler", True), ("KeyedSampler", False)]
    assert res.lossless and all(r.matches_ar for r in res.records)
    assert isinstance(bench_mod.sampler_for("match", 0), KeyedSampler)
    calls.clear()                              # no match row: no keyed AR run at all
    run_bench(bundle, _config(["chain"], law_draws=0), log=lambda s: None, progress=False)
    assert calls == [("GeneratorSampler", True)]
