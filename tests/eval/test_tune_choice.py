"""The tuner's choice, its forecast table and its cache: fake costs and measurements, no timing."""

import dataclasses
import json
import os

import pytest

from dartree.eval.bench import BenchConfig, BenchResult, Summary
from dartree.eval.costmodel import ConfigStats, VerifyCost, pick_best, pick_finalists, score_candidates
from dartree.eval.forecast import ratio_prediction, ratio_units_for, t_quantile
from dartree.eval.methods import parse_method
from dartree.eval.probes import Measurement
from dartree.eval.report import forecast_table, table1, tuning_table
from dartree.eval.tune import TuneResult, choose
from dartree.eval.tune_cache import (
    CACHE_FILE,
    DEVICE_DEFAULT_BUDGET,
    cache_dir,
    cache_key,
    check_cached,
    entry_of,
    lookup,
    model_hash,
    resolve_unset,
    store,
    store_or_warn,
)

COST = VerifyCost((1, 65), (0.010, 0.042))             # a CPU-like 0.5 ms per node


def _stats(tau: float, size: int) -> ConfigStats:
    return ConfigStats(tau=tau, mean_tree_size=size, draft_s=0.008, build_s=0.004, tree_sizes=(size,) * 10)


def _candidates(taus=(1.4, 1.5, 1.5)):
    stats = {(b, 4): _stats(t, b) for b, t in zip((4, 16, 64), taus, strict=True)}
    return score_candidates(stats, COST, overhead_s=0.003)


def _measured(rate: float, budget: int | None, width: int | None = 4, labels=("humaneval", "stdlib"), spread=0.2):
    # two prompts of 50 tokens per label, one ``spread`` faster and one as much slower than ``rate``: totals of
    # 100 tokens at ``rate`` tokens/s per label
    prompts = tuple((label, 50, 50 / rate * f) for label in labels for f in (1 - spread, 1 + spread))
    per = tuple((label, 100, 100 / rate) for label in labels)
    return Measurement(budget, None if budget is None else width, 100 * len(labels), 100 * len(labels) / rate, 50,
                       per, None, prompts)


def _result(candidates, measured, ar_rate, use_ar, best=None, temperature=1.0):
    best = best or pick_best(candidates)
    return TuneResult("dartree-pruned:budget=auto,width=4", "dartree-pruned", tuple(candidates), best, COST, 0.003,
                      ar_rate, tuple(measured), use_ar, temperature, 1.03, 8)


def test_nothing_beats_ar_resolves_to_ar():
    """T=1 on the zoo: every tree is slower than AR, so auto is plain AR (measured or modelled alike)."""
    cands = _candidates()
    measured = [_measured(55.0, None), _measured(30.0, 16), _measured(26.0, 64)]
    best, use_ar = choose(cands, 55.0, measured, min_speedup=1.03)
    assert use_ar and (best.budget, best.width) == (16, 4)      # the fastest tree is still reported
    modelled = max(c.tokens_per_s for c in cands)
    assert choose(cands, modelled * 1.5, (), 1.0)[1]            # no measurements: the cost model against AR
    assert not choose(cands, modelled / 1.5, (), 1.0)[1]


def test_measured_finalists_decide_not_the_cost_model():
    cands = _candidates(taus=(2.0, 4.0, 6.0))
    model_best = pick_best(cands)
    measured = [_measured(50.0, None), _measured(90.0, 4), _measured(70.0, model_best.budget)]
    best, use_ar = choose(cands, 50.0, measured, 1.03)
    assert not use_ar and best.budget == 4
    # within the 3% margin of AR is not a win
    assert choose(cands, 50.0, [_measured(50.0, None), _measured(51.0, 4)], 1.03)[1]
    assert not choose(cands, 50.0, [_measured(50.0, None), _measured(51.0, 4)], 0.0)[1]    # 0: never AR
    with pytest.raises(ValueError, match="min_speedup"):
        choose(cands, 50.0, measured, -1.0)
    with pytest.raises(ValueError, match="candidates"):
        choose([], 50.0)


def test_result_resolves_to_ar_and_forecasts_the_measurement():
    cands = _candidates()
    measured = [_measured(55.0, None), _measured(30.0, 16)]
    r = _result(cands, measured, 55.0, use_ar=True, best=cands[1])
    method = parse_method("dartree-pruned:budget=auto,width=4")
    spec = r.resolve(method)
    assert spec.is_ar and spec.label == method.label
    assert r.choice_text == "ar" and r.forecast_tokens_per_s == pytest.approx(55.0)
    assert r.forecast_by_label() == pytest.approx({"humaneval": 55.0, "stdlib": 55.0})
    tree = dataclasses.replace(r, use_ar=False)
    assert tree.resolve(method).config == {"budget": 16, "width": 4}
    assert tree.forecast_tokens_per_s == pytest.approx(30.0) and tree.choice_text == "B=16 W=4"


def test_tuning_table_columns_model_and_measured():
    cands = _candidates()
    r = _result(cands, [_measured(55.0, None), _measured(30.0, 16)], 55.0, use_ar=True, best=cands[1])
    lines = tuning_table(r).splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["budget", "width", "tau", "tree size", "draft ms", "build ms", "verify ms (model)",
                      "accept + commit ms", "round ms", "model tok/s", "model speedup", "measured tok/s",
                      "measured speedup"]
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.strip("|").split("|")] for r in lines[2:]}
    assert rows["16"][-2:] == ["30.0", "0.55x"] and rows["4"][-2:] == ["-", "-"]     # only finalists measured
    assert rows["ar **(chosen)**"][-2:] == ["55.0", "1.00x"]
    assert all(len(v) == len(header) for v in rows.values())


def test_tuning_table_names_the_verifiers_measured_at_t_above_0():
    """A finalist decoded with both verifiers: its measured cell is the faster one's, both named."""
    cands = _candidates()
    fast, slow = (dataclasses.replace(_measured(rate, 16), verifier=v) for rate, v in ((40.0, "rejection"),
                                                                                       (30.0, "match")))
    r = _result(cands, [_measured(55.0, None), slow, fast], 55.0, use_ar=True, best=cands[1])
    lines = tuning_table(r).splitlines()[2:]
    rows = {x.split("|")[1].strip(): [c.strip() for c in x.strip("|").split("|")] for x in lines}
    assert rows["16"][-2:] == ["40.0 (rejection; match 30.0)", "0.73x"]
    assert rows["ar **(chosen)**"][-2:] == ["55.0", "1.00x"]


def _summary(method, builder, dataset, tokens, seconds, settings=None):
    return Summary(method, builder, settings or {}, "-", dataset, 1.0, 3, tokens, seconds, tokens / seconds, 1.0, 1.0,
                   tokens, 0.0, {}, 0.0, 0.0, 3, ())


def test_forecast_table_puts_forecast_beside_measured_and_ar_in_table1():
    cands = _candidates()
    r = _result(cands, [_measured(55.0, None), _measured(30.0, 16)], 55.0, use_ar=True, best=cands[1])
    label = r.method
    summaries = (_summary("ar", "ar", "humaneval", 192, 3.2), _summary("ar", "ar", "stdlib", 192, 3.6),
                 _summary(label, "ar", "humaneval", 192, 3.5), _summary(label, "ar", "stdlib", 192, 3.5))
    result = BenchResult(BenchConfig(methods=(parse_method(label),)), {}, (), summaries, (r,))
    lines = forecast_table(result).splitlines()
    assert lines[0] == ("| method | T | resolved | dataset | forecast tok/s | 90% interval | measured tok/s | error "
                        "| forecast speedup | 90% interval | measured speedup | speedup error "
                        "| in 90% (tok/s / speedup) | prompts for +-15% (each side) "
                        "| AR tok/s calibration -> evaluation |")
    cells = [[c.strip() for c in x.strip("|").split("|")] for x in lines[2:]]
    assert [c[3] for c in cells] == ["humaneval", "stdlib", "all"]
    # 1.00x forecast against 0.91x measured (AR ran at 60 tok/s in the evaluation, 55 in calibration): +9%;
    # a choice of AR has no speedup interval (AR against itself)
    lo, hi = (float(x) for x in cells[0][5].split("-"))
    assert lo < 54.9 < hi and cells[0][9] == "-" and cells[0][12] == "yes / -"
    assert cells[0][2] == "auto -> ar" and cells[0][4] == "55.0" and cells[0][6:9] == ["54.9", "+0%", "1.00x"]
    assert cells[0][10:12] == ["0.91x", "+9%"] and cells[0][14] == "55.0 -> 60.0"
    assert cells[2][4] == "55.0" and cells[2][6:8] == ["54.9", "+0%"] and cells[2][14] == "55.0 -> 56.5"
    # two calibration prompts a dataset, +-20% apart: tens needed a side, more than stdlib has (the cell says so)
    from dartree.eval.datasets import count_prompts
    from dartree.eval.report import _need

    need, have = r.prompts_for("humaneval"), count_prompts("stdlib")
    assert 10 <= need == r.prompts_for("stdlib") and 2 * need > have and 2 * need <= 164
    assert [c[13] for c in cells] == [str(need), f"{need} (stdlib has {have})", str(r.prompts_for(None))]
    assert _need(have // 2, "stdlib", 600) == str(have // 2)
    assert _need(have // 2 + 1, "stdlib", 600) == f"{have // 2 + 1} (stdlib has {have})"
    assert _need(500, "all", 600) == "500" and _need(None, "stdlib", 600) == "-"
    # the pooled row's interval is for 6 evaluation prompts from 4 calibration ones: narrower than a dataset's
    lo_all, hi_all = (float(x) for x in cells[2][5].split("-"))
    assert hi_all - lo_all < hi - lo
    tree = dataclasses.replace(r, use_ar=False)
    speedup = [[c.strip() for c in x.strip("|").split("|")] for x in
               forecast_table(dataclasses.replace(result, tuning=(tree,))).splitlines()[2:]][0]
    assert speedup[9] != "-" and speedup[12] in ("no / yes", "no / no", "yes / yes", "yes / no")
    assert f"| {label} | auto -> ar |" in table1(summaries, 1.0)


def test_t_quantile_matches_the_tables_and_checks_its_arguments():
    # Student's t table values (two-sided 90% and 95%), and the normal quantile for many degrees of freedom
    for p, df, value in ((0.95, 1, 6.3138), (0.95, 2, 2.9200), (0.95, 7, 1.8946), (0.975, 7, 2.3646),
                         (0.95, 30, 1.6973), (0.975, 1, 12.7062), (0.95, 2000, 1.6456)):
        assert t_quantile(p, df) == pytest.approx(value, abs=2e-4)
    assert t_quantile(0.5, 3) == pytest.approx(0.0, abs=1e-9)
    for p, df, match in ((0.95, 0, "df: expected an int >= 1"), (1.0, 3, r"p: must be in \[0.5, 1\)"),
                         (0.4, 3, r"p: must be in"), (0.95, True, "df: expected an int")):
        with pytest.raises(ValueError, match=match):
            t_quantile(p, df)


def _zoo_like(seed: int):
    """``sample(n)``: n prompts' (tokens, seconds) spread like the zoo's (64 tokens, tau 1.5-9), seeded."""
    import random

    rng = random.Random(seed)

    def sample(n):
        return [64.0] * n, [64 / (60 * rng.uniform(1.5, 9.0)) for _ in range(n)]

    return sample


def test_ratio_prediction_covers_a_new_sample_at_its_level():
    """The interval holds the ratio of another sample drawn alike about 90% of the time (seeded simulation,
    per-prompt seconds spread like the zoo's: tau 2-13 per prompt), for a few and for many prompts."""
    sample = _zoo_like(7)

    for n_cal, n_new in ((8, 8), (32, 8), (8, 40)):
        hits = 0
        for _ in range(1500):
            num, den = sample(n_cal)
            interval = ratio_prediction(num, den, n_new)
            new_num, new_den = sample(n_new)
            hits += (sum(new_num) / sum(new_den)) in interval
        assert 0.85 <= hits / 1500 <= 0.95, (n_cal, n_new, hits / 1500)
    num, den = sample(8)
    few, many = ratio_prediction(num, den, 8), ratio_prediction(num, den, 800)
    assert few.estimate == many.estimate == pytest.approx(sum(num) / sum(den))
    assert few.low < many.low < many.estimate < many.high < few.high      # the new sample's spread is in it
    assert ratio_prediction([64.0], [0.3], 8) is None                      # one prompt: no spread to go on
    for args, match in ((([1.0, 2.0], [1.0], 8), r"den: need one per num \(2\)"),
                        (([1.0, 2.0], [1.0, 1.0], 0), "new_units: expected an int >= 1"),
                        (([1.0, 2.0], [1.0, 1.0], 8, 1.0), r"level: must be in \(0, 1\)")):
        with pytest.raises(ValueError, match=match):
            ratio_prediction(*args)


def test_ratio_units_for_gives_the_prompts_a_forecast_within_the_tolerance_needs():
    """With n = ratio_units_for(...) prompts on each side, a sample's ratio lands within the tolerance of
    another's about 90% of the time, and with n / 4 well under that (seeded simulation, the zoo's spread;
    the spread itself estimated on 400 prompts)."""
    sample = _zoo_like(11)

    n = ratio_units_for(*sample(400), tolerance=0.15)
    assert 20 <= n <= 80                              # tau 1.5-9 per prompt: tens of prompts, not 8

    def within(k):
        hits = 0
        for _ in range(1500):
            (a, b), (c, d) = sample(k), sample(k)
            hits += abs((sum(a) / sum(b)) / (sum(c) / sum(d)) - 1) <= 0.15
        return hits / 1500

    assert 0.85 <= within(n) <= 0.95
    assert within(max(2, n // 4)) < 0.75
    # the answer is the smallest n whose ratio_prediction interval (n units for n others) is within 15%:
    # checked on synthetic samples of n and n - 1 units with the given sample's ratio and spread
    num, den = sample(8)
    need = ratio_units_for(num, den, 0.15)
    ratio = sum(num) / sum(den)
    s = (sum((a - ratio * b) ** 2 for a, b in zip(num, den, strict=True)) / 7) ** 0.5
    mean_den = sum(den) / 8

    def relative_half_width(units: int) -> float:
        signs = [(-1) ** i for i in range(units - units % 2)] + [0] * (units % 2)   # residuals summing to 0
        a = s * ((units - 1) / sum(x * x for x in signs)) ** 0.5                      # sample variance s^2
        interval = ratio_prediction([ratio * mean_den + a * x for x in signs], [mean_den] * units, units)
        return (interval.high - interval.estimate) / interval.estimate

    assert relative_half_width(need) <= 0.15 + 1e-9 < relative_half_width(need - 1)
    assert ratio_units_for([64.0, 64.0], [0.2, 0.2], 0.15) == 2                 # no spread: the fewest
    assert ratio_units_for([64.0], [0.2], 0.15) is None
    for args, match in ((([1.0, 2.0], [1.0], 0.15), r"den: need one per num \(2\)"),
                        (([1.0, 2.0], [1.0, 1.0], 0), "tolerance: must be a number > 0"),
                        (([1.0, 2.0], [1.0, 1.0], 0.15, 0.0), r"level: must be in \(0, 1\)")):
        with pytest.raises(ValueError, match=match):
            ratio_units_for(*args)


def test_forecast_interval_per_set_pooled_and_without_per_prompt_times():
    cands = _candidates()
    measured = [_measured(50.0, None, spread=0.0), _measured(80.0, 16)]
    r = _result(cands, measured, 50.0, use_ar=False, best=cands[1], temperature=0.0)
    rate, speedup = r.forecast_interval("humaneval", 8)
    assert rate.estimate == pytest.approx(80.0) and rate.low < 80.0 < rate.high and rate.level == 0.9
    assert speedup.estimate == pytest.approx(80.0 / 50.0) and speedup.low < 1.6 < speedup.high
    pooled = r.forecast_interval(None, 8)[0]
    assert pooled.estimate == pytest.approx(80.0) and pooled.high - pooled.low < rate.high - rate.low
    assert r.forecast_interval("packages", 8) == (None, None)              # no calibration prompt of that set
    assert r.forecast_interval("humaneval", 8, level=0.5)[0].high < rate.high
    bare = _result(cands, [dataclasses.replace(m, per_prompt=()) for m in measured], 50.0, use_ar=False,
                   best=cands[1], temperature=0.0)
    assert bare.forecast_interval(None, 8) == (None, None)                 # an older result: no per-prompt times
    # prompts each side needs for +-15%: from the chosen setting's spread, more for a narrower tolerance
    need, pooled_need = r.prompts_for("humaneval"), r.prompts_for(None)
    assert need > 2 and r.prompts_for("humaneval", tolerance=0.05) > need and pooled_need <= need
    assert r.prompts_for("packages") is None and bare.prompts_for(None) is None


def test_cache_key_and_roundtrip(bundle, tmp_path, monkeypatch):
    monkeypatch.setenv("DARTREE_CACHE_DIR", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("DARTREE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "dartree"
    digest = model_hash(bundle)
    assert digest == model_hash(bundle) and len(digest) == 64
    auto = parse_method("dartree-pruned:budget=auto,width=auto")
    unset = parse_method("dartree-pruned")
    k0 = cache_key(bundle, auto, 0.0, digest)
    assert k0 == cache_key(bundle, unset, 0.0, digest)                 # searched fields are not part of the key
    assert k0 != cache_key(bundle, auto, 1.0, digest)                  # nor is the temperature shared
    assert k0 != cache_key(bundle, parse_method("dartree-pruned:budget=auto,width=8"), 0.0, digest)
    assert k0 != cache_key(bundle, auto, 0.0, "0" * 64)                # other weights, other key
    key = json.loads(k0)
    assert {"model", "device", "device_name", "torch_threads", "builder", "head", "temperature"} <= set(key)
    assert lookup(k0) is None
    cands = _candidates()
    r = _result(cands, [_measured(50.0, None), _measured(80.0, 16)], 50.0, use_ar=False, best=cands[1],
                temperature=0.0)
    path = store(k0, entry_of(r))
    assert path == tmp_path / "xdg" / "dartree" / CACHE_FILE
    assert lookup(k0)["settings"] == {"budget": 16, "width": 4}
    store(cache_key(bundle, auto, 1.0, digest), entry_of(dataclasses.replace(r, use_ar=True)))
    assert lookup(k0)["settings"] == {"budget": 16, "width": 4}          # the second write kept the first entry
    assert [p.name for p in path.parent.iterdir()] == [CACHE_FILE]      # no temporary file left behind
    assert os.access(path, os.R_OK)
    path.write_text("{not json")                                       # a damaged cache is an empty one
    assert lookup(k0) is None
    (tmp_path / "plain").write_text("")
    assert path.stat().st_mode & 0o777 == (tmp_path / "plain").stat().st_mode & 0o777   # as a file open() makes
    warnings = []
    assert store_or_warn(k0, entry_of(r), warnings.append, folder=path / "sub") is None   # a file, not a folder
    assert len(warnings) == 1 and warnings[0].startswith("warning: the tuning was not cached")
    assert "DARTREE_CACHE_DIR" in warnings[0]


def test_stores_at_once_keep_each_others_entries(tmp_path, monkeypatch):
    """Two runs storing together: the second waits for the first's read-update-replace (a flock)."""
    import threading

    import dartree.eval.tune_cache as tc

    real, first_read = tc._read, threading.Event()

    def slow_read(path):
        data = real(path)
        if threading.current_thread().name == "first":
            first_read.set()
            threading.Event().wait(0.3)           # the second store starts while the first holds its copy
        return data

    monkeypatch.setattr(tc, "_read", slow_read)
    first = threading.Thread(target=store, args=("key1", {"settings": "ar"}, tmp_path), name="first")
    first.start()
    first_read.wait()
    store("key2", {"settings": "ar"}, tmp_path)
    first.join()
    assert sorted(json.loads((tmp_path / CACHE_FILE).read_text())) == ["key1", "key2"]


def test_generate_resolution_uses_the_cache_then_the_device_default(bundle):
    auto = parse_method("dartree-pruned:budget=auto,width=auto")
    with pytest.raises(ValueError, match=r"budget=auto: no tuning of dartree-pruned is cached.*dartree tune"):
        check_cached(auto, 0.0)
    check_cached(parse_method("dartree-pruned"), 0.0)                   # nothing asked for auto: no error
    method, note = resolve_unset(bundle, parse_method("dartree-pruned"), 0.0)
    assert method.config["budget"] == DEVICE_DEFAULT_BUDGET["cpu"] and "measured default on cpu" in note
    assert resolve_unset(bundle, parse_method("dartree-pruned:budget=8"), 0.0)[0].config == {"budget": 8}
    with pytest.raises(ValueError, match="budget=auto: no tuning"):
        resolve_unset(bundle, auto, 0.0)
    cands = _candidates()
    r = _result(cands, [_measured(50.0, None), _measured(80.0, 16)], 50.0, use_ar=False, best=cands[1])
    store(cache_key(bundle, auto, 0.0), entry_of(r))
    check_cached(auto, 0.0)
    method, note = resolve_unset(bundle, auto, 0.0)
    assert method.config == {"budget": 16, "width": 4} and "tuned for this machine" in note
    assert resolve_unset(bundle, parse_method("dartree-pruned"), 0.0)[0].config == {"budget": 16, "width": 4}
    store(cache_key(bundle, auto, 1.0), entry_of(dataclasses.replace(r, use_ar=True)))
    method, note = resolve_unset(bundle, auto, 1.0)
    assert method.is_ar and method.label == auto.label and "auto -> ar" in note


def test_a_tuned_beta_is_cached_apart_and_resolved_as_a_number(bundle):
    """``beta=auto`` is its own cache entry (a tuning that kept the default beta is another), and the
    cached beta comes back as a float."""
    auto = parse_method("dartree-pruned:budget=auto,width=auto")
    with_beta = parse_method("dartree-pruned:budget=auto,width=auto,beta=auto")
    assert cache_key(bundle, with_beta, 0.0) != cache_key(bundle, auto, 0.0)
    cands = _candidates()
    best = dataclasses.replace(cands[1], beta=-0.1)
    r = _result((cands[0], best, cands[2]), [_measured(50.0, None), _measured(80.0, 16)], 50.0, use_ar=False,
                best=best)
    assert r.settings() == {"budget": 16, "width": 4, "beta": -0.1} and r.choice_text == "B=16 W=4 beta=-0.1"
    store(cache_key(bundle, with_beta, 0.0), entry_of(r))
    method, note = resolve_unset(bundle, with_beta, 0.0)
    assert method.config == {"budget": 16, "width": 4, "beta": -0.1} and isinstance(method.config["beta"], float)
    assert "beta=-0.1" in note
    with pytest.raises(ValueError, match="budget=auto: no tuning"):   # the beta entry is not the plain one's
        resolve_unset(bundle, auto, 0.0)
    # the default method (nothing set) takes it, beta included, while no plain tuning is cached
    method, note = resolve_unset(bundle, parse_method("dartree-pruned"), 0.0)
    assert method.config == {"budget": 16, "width": 4, "beta": -0.1} and "beta=-0.1" in note
    assert resolve_unset(bundle, parse_method("dartree-pruned:beta=0"), 0.0)[0].config["budget"] == \
        DEVICE_DEFAULT_BUDGET["cpu"]                                   # a beta given: not the beta tuning's
    plain = _result(cands, [_measured(50.0, None), _measured(80.0, 16)], 50.0, use_ar=False, best=cands[1])
    store(cache_key(bundle, auto, 0.0), entry_of(plain))                # a plain tuning, once cached, comes first
    assert resolve_unset(bundle, parse_method("dartree-pruned"), 0.0)[0].config == {"budget": 16, "width": 4}


def test_finalists_take_the_best_of_each_budget_first():
    """The best-ranked setting of each budget first (a noisy probe moves a budget's widths together),
    then the next best of any budget; in the cost model's order."""
    stats = {(64, 8): _stats(3.2, 64), (64, 12): _stats(3.2, 64), (64, 16): _stats(3.1, 64),
             (16, 4): _stats(1.5, 16), (16, 8): _stats(1.45, 16), (32, 8): _stats(1.9, 32)}
    cands = score_candidates(stats, COST, overhead_s=0.003)
    ranked = sorted(cands, key=lambda c: -c.tokens_per_s)
    assert [c.budget for c in ranked[:3]] == [64, 64, 64]                   # the plain top 3: one budget
    got = pick_finalists(cands, 3)
    assert [(c.budget, c.width) for c in got] == [(ranked[0].budget, ranked[0].width)] + sorted(
        [(32, 8), (16, 4)], key=lambda bw: -next(c.tokens_per_s for c in cands if (c.budget, c.width) == bw))
    assert [c.tokens_per_s for c in got] == sorted((c.tokens_per_s for c in got), reverse=True)
    five = pick_finalists(cands, 5)                                         # three budgets, then the next best
    assert {c.budget for c in five} == {16, 32, 64} and len(five) == 5 and five[0] is ranked[0]
    assert (ranked[1].budget, ranked[1].width) in [(c.budget, c.width) for c in five]
    assert pick_finalists(cands, 0) == [] and len(pick_finalists(cands, 10)) == len(cands)
