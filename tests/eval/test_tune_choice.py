"""The tuner's choice, its forecast table and its cache: fake costs and measurements, no timing."""

import dataclasses
import json
import os

import pytest

from dartree.eval.bench import BenchConfig, BenchResult, Summary
from dartree.eval.methods import parse_method
from dartree.eval.report import forecast_table, table1, tuning_table
from dartree.eval.tune import (
    ConfigStats,
    Measurement,
    TuneResult,
    VerifyCost,
    choose,
    pick_best,
    pick_finalists,
    score_candidates,
)
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
)

COST = VerifyCost((1, 65), (0.010, 0.042))             # a CPU-like 0.5 ms per node


def _stats(tau: float, size: int) -> ConfigStats:
    return ConfigStats(tau=tau, mean_tree_size=size, draft_s=0.008, build_s=0.004, rounds=10,
                       tree_sizes=(size,) * 10, accepted_lengths=())


def _candidates(taus=(1.4, 1.5, 1.5)):
    stats = {(b, 4): _stats(t, b) for b, t in zip((4, 16, 64), taus, strict=True)}
    return score_candidates(stats, COST, overhead_s=0.003)


def _measured(rate: float, budget: int | None, width: int | None = 4, labels=("humaneval", "stdlib")):
    # tokens / seconds split evenly over the labels; ``rate`` tokens/s in each
    per = tuple((label, 100, 100 / rate) for label in labels)
    return Measurement(budget, None if budget is None else width, 100 * len(labels), 100 * len(labels) / rate, 50,
                       per)


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
    assert lines[0] == ("| method | T | resolved | dataset | forecast tok/s | measured tok/s | error "
                        "| forecast speedup | measured speedup | speedup error | AR tok/s calibration -> evaluation |")
    cells = [[c.strip() for c in x.strip("|").split("|")] for x in lines[2:]]
    assert [c[3] for c in cells] == ["humaneval", "stdlib", "all"]
    # 1.00x forecast against 0.91x measured (AR ran at 60 tok/s in the evaluation, 55 in calibration): +9%
    assert cells[0][2] == "auto -> ar" and cells[0][4:] == ["55.0", "54.9", "+0%", "1.00x", "0.91x", "+9%",
                                                            "55.0 -> 60.0"]
    assert cells[2][4:7] == ["55.0", "54.9", "+0%"] and cells[2][10] == "55.0 -> 56.5"
    assert f"| {label} | auto -> ar |" in table1(summaries, 1.0)


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
