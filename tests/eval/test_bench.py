import json

import pytest

from dartree.eval.bench import BenchConfig, acceptance_curve, run_bench
from dartree.eval.methods import parse_methods
from dartree.eval.plots import plot_acceptance
from dartree.eval.report import bench_markdown, table1, table2
from dartree.rounds import ROUND_STAGES


@pytest.fixture(scope="module")
def result(bundle):
    methods = parse_methods(["chain", "dartree-pruned:budget=auto,width=auto"])
    config = BenchConfig(methods=methods, datasets=("humaneval", "stdlib"), temperatures=(0.0, 1.0), num_prompts=1,
                         max_new_tokens=10, max_prompt_tokens=32, backend="ref", calibration_prompts=1, warmup=False,
                         tune_budgets=(2, 5), tune_widths=(2,), tune_min_speedup=0.0,   # 0: a tree, never AR
                         law_draws=2)
    return run_bench(bundle, config, argv=["dartree", "bench"], log=lambda s: None, progress=False)


def test_records_cover_the_grid_and_are_lossless(result):
    assert len(result.records) == 2 * 2 * 1 * 3          # datasets x temperatures x prompts x (ar + 2 methods)
    assert result.lossless and all(r.matches_ar for r in result.records)
    assert {r.method for r in result.records} == {"ar", "chain", "dartree-pruned:budget=auto,width=auto"}


def test_per_round_stats_add_up(result):
    for r in result.records:
        assert 1 + sum(r.committed) == r.new_tokens == 10       # the first token from the prefill
        assert all(c == a + 1 for c, a in zip(r.committed[:-1], r.accepted_lengths[:-1], strict=True))
        assert sum(r.stage_s) + r.prefill_s <= r.seconds
        assert len(r.stage_s) == len(ROUND_STAGES)
    for s in result.summaries:
        cell = [r for r in result.records if (r.method, r.dataset, r.temperature) == (s.method, s.dataset,
                                                                                      s.temperature)]
        assert s.tokens == sum(r.new_tokens for r in cell) and s.rounds == sum(r.rounds for r in cell)
        model = s.stage_ms["draft"] + s.stage_ms["head"] + s.stage_ms["target"] + s.stage_ms["context"]
        assert s.overhead_ms == pytest.approx(s.round_ms - model)
        assert (s.stage_ms["head"] > 0) == (s.builder == "dartree-pruned")     # chain and ar call no head
        assert s.tau == pytest.approx((s.tokens - len(cell)) / s.rounds)
        assert s.round_ms == pytest.approx(sum(s.stage_ms.values()))
        ar = [r for r in result.records if (r.method, r.dataset, r.temperature) == ("ar", s.dataset, s.temperature)]
        ar_seconds_per_token = sum(r.seconds for r in ar) / sum(r.new_tokens for r in ar)
        assert s.speedup == pytest.approx(ar_seconds_per_token * s.tokens / sum(r.seconds for r in cell))
        if s.method == "ar":
            assert s.speedup == 1.0
        if s.method != "ar":
            assert len(s.acceptance) == 6 and list(s.acceptance) == sorted(s.acceptance, reverse=True)


def test_auto_budget_is_resolved_and_reported(result):
    assert [t.temperature for t in result.tuning] == [0.0, 1.0]        # tuned at each temperature of the run
    for tuned in result.tuning:
        assert not tuned.use_ar and tuned.best.budget in (2, 5) and tuned.calibration_prompts == 2   # 1 per dataset
        assert tuned.measurement(None) is not None and tuned.chosen is not None
        assert set(tuned.forecast_by_label()) == {"humaneval", "stdlib"}
        # per-prompt times of every measured setting, in the references' order: one prompt per dataset, so
        # a dataset alone has no spread to go on and only the pooled pair gives an interval
        assert all([p[0] for p in m.per_prompt] == ["humaneval", "stdlib"] for m in tuned.measured)
        assert all(sum(p[2] for p in m.per_prompt) == pytest.approx(m.seconds) for m in tuned.measured)
        assert tuned.forecast_interval("stdlib", 1) == (None, None)
        rate, speedup = tuned.forecast_interval(None, 2)
        assert rate.estimate == pytest.approx(tuned.forecast_tokens_per_s) and rate.low <= rate.estimate <= rate.high
        assert speedup.estimate == pytest.approx(tuned.forecast_tokens_per_s / tuned.ar_tokens_per_s)
        pruned = [s for s in result.summaries if s.builder == "dartree-pruned" and s.temperature == tuned.temperature]
        assert pruned and all(s.settings == {**tuned.settings(), "width": 2} for s in pruned)
    md = bench_markdown(result)
    assert "## Tuned budget: forecast vs measured" in md and "auto -> B=" in md


def test_auto_resolves_to_ar_when_no_tree_is_forecast_to_beat_it(bundle):
    """A bar no tree can clear (min speedup 1e9): ``auto`` runs as plain AR, and the tables say so."""
    methods = parse_methods(["dartree-pruned:budget=auto,width=2"])
    config = BenchConfig(methods=methods, datasets=("humaneval",), num_prompts=1, max_new_tokens=6,
                         max_prompt_tokens=32, backend="ref", calibration_prompts=1, warmup=False,
                         tune_budgets=(2,), tune_min_speedup=1e9)
    res = run_bench(bundle, config, log=lambda s: None, progress=False)
    (tuned,) = res.tuning
    assert tuned.use_ar and tuned.choice_text == "ar"
    cell = next(s for s in res.summaries if s.method == methods[0].label)
    assert cell.builder == "ar" and cell.stage_ms["head"] == 0 and cell.lossless_prompts == 1
    assert "| auto -> ar |" in table1(res.summaries, 0.0)
    assert "auto -> ar" in bench_markdown(res)


def test_tables_and_json_shapes(result, tmp_path):
    t1 = table1(result.summaries, 0.0).splitlines()
    assert t1[0].count("|") == 2 + 2 * 2 + 2 + 1 and len(t1) == 2 + 3
    t2 = table2(result.summaries, 1.0).splitlines()
    assert len(t2) == 2 + 3
    assert all(f"{st} ms" in t2[0] for st in ROUND_STAGES) and "overhead ms" in t2[0] and "overhead %" in t2[0]
    md = bench_markdown(result)
    assert "Adaptive budget" in md and "Lossless check: every compared output" in md and "T=1" in md
    data = json.loads(json.dumps(result.to_json(), indent=1, default=str))     # results.json, as bench writes it
    assert set(data) == {"meta", "config", "lossless", "summaries", "tuning", "records", "law_checks"}
    assert len(data["summaries"]) == 3 * 2 * 2 and data["lossless"] is True
    assert data["meta"]["command"] == "dartree bench"
    png = plot_acceptance(result.summaries, tmp_path / "acc.png")
    assert png.stat().st_size > 1000


def test_acceptance_curve_and_config_errors():
    assert acceptance_curve([0, 2, 3, 1], 4) == (0.75, 0.5, 0.25, 0.0)
    with pytest.raises(ValueError, match="temperatures"):
        BenchConfig(methods=parse_methods(["chain"]), temperatures=(-1.0,))
    with pytest.raises(ValueError, match="num_prompts"):
        BenchConfig(methods=parse_methods(["chain"]), num_prompts=0)


def test_a_difference_from_ar_is_recorded_with_its_first_token():
    import torch

    from dartree.decode import GenerationResult, RoundStats
    from dartree.eval.bench import _record

    rounds = (RoundStats(2, 3, 4, 0.0, 0.0, 0.0, 0.0, 0.0), RoundStats(0, 1, 4, 0.0, 0.0, 0.0, 0.0, 0.0))
    result = GenerationResult(torch.tensor([[5, 6, 7, 8]]), torch.tensor([[1]]), rounds, "max_new_tokens", 0.0)
    same = _record("m", "d", 0.0, "p", result, 1.0, torch.tensor([[5, 6, 7, 8]]))
    differs = _record("m", "d", 0.0, "p", result, 1.0, torch.tensor([[5, 6, 9, 8]]))
    assert (same.matches_ar, same.first_difference) == (True, -1)
    assert (differs.matches_ar, differs.first_difference) == (False, 2)


def test_methods_run_in_order_on_even_prompts_and_reversed_on_odd_ones(bundle):
    """AR first, then the methods; their order alternates prompt by prompt (so none always runs after the same
    decode)."""
    config = BenchConfig(methods=parse_methods(["chain", "ddtree:budget=3"]), datasets=("humaneval",),
                         temperatures=(0.0,), num_prompts=3, max_new_tokens=4, max_prompt_tokens=32, backend="ref",
                         warmup=False)
    res = run_bench(bundle, config, log=lambda s: None, progress=False)
    assert [r.method for r in res.records] == ["ar", "chain", "ddtree:budget=3", "ar", "ddtree:budget=3", "chain",
                                               "ar", "chain", "ddtree:budget=3"]
    assert [r.prompt_id for r in res.records][::3] == list(dict.fromkeys(r.prompt_id for r in res.records))
