"""``dartree bench --concurrency``: serving rows are lossless, the table and files are written, bad input exits 2."""

import dataclasses
import json

import pytest

from dartree.cli import main
from dartree.eval.bench import BenchConfig
from dartree.eval.concurrency import concurrency_markdown, run_concurrency
from dartree.eval.methods import parse_method

TOY = ["--model", "tiny-random", "--threads", "1", "--backend", "ref"]


def test_run_concurrency_is_lossless_and_reports_every_cell(bundle):
    config = BenchConfig((parse_method("chain"), parse_method("ddtree:budget=6")), num_prompts=4, max_new_tokens=6,
                         temperatures=(1.0,), warmup=False, verifier="match")
    rows = run_concurrency(bundle, config, [1, 3], progress=False)
    assert [(r.method, r.concurrency) for r in rows] == [
        (m, c) for c in (1, 3) for m in ("ar", "chain", "ddtree:budget=6")]
    assert all(r.lossless_prompts == r.prompts == 4 and r.tokens == 24 for r in rows)
    assert all(r.speedup == 1.0 for r in rows if r.method == "ar")
    ar3 = next(r for r in rows if r.method == "ar" and r.concurrency == 3)
    assert ar3.steps < 4 * 6                      # batched: fewer forwards than tokens
    text = concurrency_markdown(rows)
    assert "| chain | " in text and "C=3" in text
    with pytest.raises(ValueError, match="concurrency"):
        run_concurrency(bundle, config, [0], progress=False)


def test_cli_concurrency_writes_table_and_json(tmp_path, capsys):
    out = tmp_path / "cc"
    code = main(["bench", *TOY, "--concurrency", "1", "2", "--methods", "chain", "--num-prompts", "3",
                 "--max-new-tokens", "4", "--no-warmup", "--out", str(out)])
    assert code == 0
    data = json.loads((out / "concurrency.json").read_text())
    assert [(r["method"], r["concurrency"]) for r in data["rows"]] == [("ar", 1), ("chain", 1), ("ar", 2),
                                                                        ("chain", 2)]
    assert "| chain |" in capsys.readouterr().out
    assert (out / "concurrency.png").stat().st_size > 0
    with pytest.raises(SystemExit) as e:     # no calibration prompts left after the evaluation prompts
        main(["bench", *TOY, "--concurrency", "2", "--methods", "ddtree:budget=auto", "--num-prompts", "164",
              "--out", str(tmp_path / "x")])
    assert e.value.code == 2


def test_auto_budget_is_tuned_per_concurrency(bundle):
    config = BenchConfig((parse_method("ddtree:budget=auto"),), num_prompts=2, max_new_tokens=4, warmup=False,
                         tune_budgets=(2, 6))
    rows = run_concurrency(bundle, config, [1, 2], progress=False, log=lambda _m: None)
    auto = [r for r in rows if r.method == "ddtree:budget=auto"]
    assert [r.concurrency for r in auto] == [1, 2]
    assert all(r.settings in ("budget=2", "budget=6") and r.lossless_prompts == 2 for r in auto)

    # an unset budget is searched with an 'auto' width (it used to raise KeyError: 'budget')
    config = BenchConfig((parse_method("dartree-pruned:width=auto"),), num_prompts=2, max_new_tokens=4,
                         warmup=False, tune_budgets=(2, 6), tune_widths=(1, 2))
    rows = run_concurrency(bundle, config, [2], progress=False, log=lambda _m: None)
    assert {r.settings for r in rows if r.method != "ar"} <= {f"budget={b},width={w}" for b in (2, 6) for w in (1, 2)}
    assert all(r.lossless_prompts == 2 for r in rows)


def test_the_warpers_and_the_verifier_reach_every_served_row(bundle, monkeypatch):
    """``top_k`` / ``top_p`` / ``min_p`` reach AR and every method; the run's verifier every method without
    its own, a method's ``verifier=`` wins; rejection rows are not counted against AR's tokens."""
    import dartree.eval.concurrency as cc
    seen = []

    def recording(engine, prompts, c, max_new, temperature, sampler, stop, on_finish, **options):
        seen.append((type(engine).__name__, options))
        return serve(engine, prompts, c, max_new, temperature, sampler, stop, on_finish, **options)

    serve = cc.serve
    monkeypatch.setattr(cc, "serve", recording)
    config = BenchConfig((parse_method("chain"), parse_method("ddtree:budget=4,verifier=match")), num_prompts=2,
                         max_new_tokens=4, temperatures=(0.8,), warmup=False, top_k=3, top_p=0.9, min_p=0.05,
                         verifier="rejection")
    rows = run_concurrency(bundle, config, [2], progress=False)
    warps = {"top_k": 3, "top_p": 0.9, "min_p": 0.05}
    ar = type(bundle.target).__name__           # the match row's untimed keyed AR serve last, warped alike
    assert seen == [(kind, {**warps, "verifier": v}) for kind, v in
                    ((ar, None), ("SpeculativeDecoder", "rejection"), ("SpeculativeDecoder", "match"), (ar, None))]
    by = {r.method: r for r in rows}
    assert (by["chain"].verifier, by["ddtree:budget=4,verifier=match"].verifier) == ("rejection", "match")
    assert not by["chain"].token_checked and by["ddtree:budget=4,verifier=match"].lossless_prompts == 2
    assert "law (rejection)" in concurrency_markdown(rows)


def test_cli_concurrency_passes_the_sampling_options(monkeypatch, tmp_path):
    import dartree.eval.concurrency as cc
    import dartree.eval.plots
    got = {}

    def fake(bundle, config, levels, **kwargs):
        got.update(top_k=config.top_k, top_p=config.top_p, min_p=config.min_p, verifier=config.verifier,
                   temperature=config.temperatures[0])
        return []

    monkeypatch.setattr(cc, "run_concurrency", fake)
    monkeypatch.setattr(dartree.eval.plots, "plot_concurrency", lambda rows, path: path.write_bytes(b"png") and path)
    main(["bench", *TOY, "--concurrency", "1", "--methods", "chain", "--num-prompts", "2", "--temperatures", "0.7",
          "--verifier", "match", "--top-k", "4", "--top-p", "0.8", "--min-p", "0.1", "--no-warmup",
          "--out", str(tmp_path / "cc")])
    assert {k: got[k] for k in ("top_k", "top_p", "min_p", "verifier", "temperature")} == {
        "top_k": 4, "top_p": 0.8, "min_p": 0.1, "verifier": "match", "temperature": 0.7}


def test_the_prompts_are_cut_as_the_bench_cuts_them(bundle, monkeypatch):
    """``BenchConfig.prompt_chars`` reaches the serving benchmark's prompts (it was dropped there)."""
    import dartree.eval.concurrency as cc

    seen = []
    real = cc.load_prompts
    monkeypatch.setattr(cc, "load_prompts", lambda *a, **k: seen.append(k.get("prompt_chars")) or real(*a, **k))
    config = BenchConfig((parse_method("chain"),), num_prompts=2, max_new_tokens=2, warmup=False, prompt_chars=300,
                         datasets=("stdlib",))
    run_concurrency(bundle, config, [1], progress=False)
    assert seen == [300]


def test_ar_is_served_with_the_generator_sampler_and_match_rows_equal_an_untimed_keyed_ar(bundle, monkeypatch):
    """As in the bench: the batched AR baseline at T>0 draws with the cheap generator sampler (the draw a user's
    AR gets; the keyed sampler hashes the vocabulary every token), its serve is the row's timing; a ``match`` row
    is compared with an untimed keyed AR serve, and a run without one serves no keyed AR at all."""
    import dartree.eval.concurrency as cc

    calls = []
    real = cc.serve

    def spy(engine, prompts, c, max_new, temperature, sampler, *args, **kwargs):
        out = real(engine, prompts, c, max_new, temperature, sampler, *args, **kwargs)
        if engine is bundle.target:
            calls.append((type(sampler).__name__, out))
        return out

    monkeypatch.setattr(cc, "serve", spy)
    config = BenchConfig((parse_method("chain"), parse_method("ddtree:budget=4,verifier=match")), num_prompts=3,
                         max_new_tokens=6, temperatures=(1.0,), warmup=False)
    rows = run_concurrency(bundle, config, [2], progress=False)
    assert [kind for kind, _ in calls] == ["GeneratorSampler", "KeyedSampler"]
    (_, timed), (_, keyed) = calls
    by = {r.method: r for r in rows}
    assert (by["ar"].seconds, by["ar"].tokens) == (timed.seconds, timed.tokens)        # the timed AR: generator
    assert by["ddtree:budget=4,verifier=match"].lossless_prompts == 3                  # equal to the keyed AR
    assert by["ddtree:budget=4,verifier=match"].speedup == pytest.approx(
        by["ddtree:budget=4,verifier=match"].tokens_per_s / timed.tokens_per_s)
    assert [r.tokens.tolist() for r in timed.results] != [r.tokens.tolist() for r in keyed.results]
    calls.clear()                                 # no match row: no keyed AR serve
    run_concurrency(bundle, dataclasses.replace(config, methods=(parse_method("chain"),)), [2], progress=False)
    assert [kind for kind, _ in calls] == ["GeneratorSampler"]
