"""The method ``auto``: builders x budgets x verifiers, ranked by acceptance measured under the verifier each will
use, chosen on real decodes, and plain AR unless something beats AR."""

import pytest

import dartree.eval.bundles
import dartree.eval.tune as tune_mod
from dartree.eval.bench import BenchConfig, run_bench
from dartree.eval.bundles import encode
from dartree.eval.costmodel import ConfigStats, VerifyCost
from dartree.eval.methods import parse_method, parse_methods
from dartree.eval.probes import Measurement
from dartree.eval.report import table1
from dartree.eval.simulate import reference
from dartree.eval.tune import AUTO_BUILDERS, tune
from tests.eval.cli_helpers import fails

COST = VerifyCost((1, 9), (0.004, 0.006))
#: rejection's tau per (builder, budget) as the screen decodes would measure it; matching replays 1.2 everywhere
REJECTION_TAU = {("corrected-sequoia", 4): 2.4, ("corrected-sequoia", 16): 2.0, ("ddtree", 4): 1.6,
                 ("ddtree", 16): 1.7, ("dartree-pruned", 4): 1.5, ("dartree-pruned", 16): 1.8}


def _stats(tau: float, size: int, measured: bool) -> ConfigStats:
    rounds = 10
    return ConfigStats(tau, size, 0.002, 0.001, rounds, (size,) * rounds, (round(tau) - 1,) * rounds,
                       0.005 if measured else None, 0.0005 if measured else None)


@pytest.fixture
def fake(monkeypatch):
    """The tuner's measurements replaced by a table (no decode runs): matching replays tau 1.2, rejection's
    screen :data:`REJECTION_TAU`; a real decode's rate is ``100 x`` the tau of its verifier (AR: ``ar_rate``)."""
    state = {"ar_rate": 100.0, "scale": 100.0, "specs": []}

    def replay(bundle, methods, refs, backend, progress=None):
        return [_stats(1.2, m.config["budget"], False) for m in methods]

    def screen(bundle, methods, refs, backend, temperature, seed=0, verifier="traversal", warps=None):
        assert verifier == "traversal" and temperature == 1.0
        return [_stats(REJECTION_TAU[(m.builder, m.config["budget"])], m.config["budget"], True) for m in methods]

    def decode(bundle, specs, refs, backend, temperature=0.0, seed=0, labels=None, builders=False, warps=None):
        state["specs"] = [(m.builder, m.config["budget"], v) for m, v, _ in specs]
        out = [Measurement(None, None, 100, 100 / state["ar_rate"], 100, (("x", 100, 100 / state["ar_rate"]),))]
        for m, v, beta in specs:
            tau = REJECTION_TAU[(m.builder, m.config["budget"])] if v == "traversal" else 1.2
            rate = state["scale"] * tau
            out.append(Measurement(m.config["budget"], m.config.get("width"), 100, 100 / rate, 40,
                                   (("x", 100, 100 / rate),), beta, (), v, m.builder))
        return tuple(out)

    monkeypatch.setattr(tune_mod, "replay_settings", replay)
    monkeypatch.setattr(tune_mod, "screen_decodes", screen)
    monkeypatch.setattr(tune_mod, "measure_specs", decode)
    monkeypatch.setattr(tune_mod, "measure_overhead", lambda *a, **k: 0.0005)
    return state


def _refs(bundle):
    return [reference(bundle, encode(bundle.tokenizer, "def f(x):\n"), 6, temperature=1.0, seed=1)]


def test_auto_picks_the_method_by_acceptance_measured_under_the_sampled_verifier(bundle, fake):
    """Matching's replays say every setting accepts 1.2 a round; the default sampled verifier's (traversal)
    screen says corrected-sequoia B=4 accepts 2.4: it is ranked first under it, decoded for real (with
    traversal) beside the best under matching, chosen, and ``auto`` resolves to it with the GRU head and the
    traversal verifier."""
    result = tune(bundle, parse_method("auto"), _refs(bundle), "ref", budgets=(4, 16), verify_cost=COST,
                  temperature=1.0, seed=1)
    assert {c.builder for c in result.candidates} == set(AUTO_BUILDERS)
    by = {(c.builder, c.budget, c.verifier): c.tau for c in result.candidates}
    assert by[("corrected-sequoia", 4, "traversal")] == 2.4 and by[("corrected-sequoia", 4, "match")] == 1.2
    assert ("corrected-sequoia", 4, "traversal") in fake["specs"]
    assert {v for _, _, v in fake["specs"]} == {"match", "traversal"}        # the best of each verifier decoded
    assert len(fake["specs"]) == tune_mod.DEFAULT_AUTO_FINALISTS
    assert not result.use_ar and (result.best.builder, result.best.budget) == ("corrected-sequoia", 4)
    assert result.verifier == "traversal" and result.choice_text == "corrected-sequoia B=4 traversal"
    spec = result.resolve(parse_method("auto"))
    assert (spec.builder, spec.config, spec.head, spec.verifier, spec.label) == (
        "corrected-sequoia", {"budget": 4}, "gru", "traversal", "auto")
    fixed = tune(bundle, parse_method("auto:verifier=match"), _refs(bundle), "ref", budgets=(4,), verify_cost=COST,
                 temperature=1.0, seed=1)
    assert {c.verifier for c in fixed.candidates} == {"match"} and fixed.verifier == "match"


def test_auto_falls_back_to_ar_unless_measured_above_it(bundle, fake):
    """The best measured setting at 0.96x AR, or at 0.98x: plain AR (``auto`` never runs something measured below
    AR); at 1.2x AR the tree."""
    for scale, use_ar in ((40.0, True), (40.8, True), (50.0, False)):       # 2.4 x scale / 100: 0.96, 0.98, 1.2
        fake["scale"] = scale
        result = tune(bundle, parse_method("auto"), _refs(bundle), "ref", budgets=(4, 16), verify_cost=COST,
                      temperature=1.0, seed=1)
        assert result.use_ar is use_ar
        if use_ar:
            assert result.choice_text == "ar" and result.resolve(parse_method("auto")).is_ar
            assert result.chosen is result.measurement(None)


@pytest.fixture
def loads(monkeypatch, bundle):
    """Count model loads; every load returns the session's toy bundle."""
    calls = []
    monkeypatch.setattr(dartree.eval.bundles, "load_bundle", lambda name: calls.append(name) or bundle)
    return calls


def test_auto_in_the_bench_and_its_errors(bundle, loads, capsys):
    """``auto`` on the toy end to end (a tree forced with min speedup 0): resolved at T=1 to a searched builder,
    named in the table; its errors are one line before anything decodes."""
    config = BenchConfig(methods=parse_methods(["auto"]), datasets=("humaneval",), temperatures=(1.0,),
                         num_prompts=1, max_new_tokens=6, max_prompt_tokens=24, backend="ref", calibration_prompts=1,
                         warmup=False, tune_budgets=(2,), tune_min_speedup=0.0, law_draws=2)
    res = run_bench(bundle, config, log=lambda s: None, progress=False)
    (tuned,) = res.tuning
    cell = next(s for s in res.summaries if s.method == "auto")
    assert cell.builder == tuned.best.builder in AUTO_BUILDERS and cell.verifier == tuned.verifier
    assert f"| auto -> {cell.builder} B=2" in table1(res.summaries, 1.0)
    with pytest.raises(ValueError, match=r"'auto' takes only verifier=, head= and drafter="):
        parse_method("auto:budget=4")
    with pytest.raises(ValueError, match=r"verifier: expected one of \('match', 'rejection', 'traversal'\)"):
        parse_method("auto:verifier=exact")
    toy = ["--model", "tiny-random", "--threads", "1"]
    line = fails(["generate", *toy, "--method", "auto", "--temperature", "1", "--prompt", "x"], capsys)
    assert "no tuning of auto is cached" in line and "dartree tune --method auto --temperature 1" in line
    assert loads == []                                          # nothing cached: said before the model loads
