import pytest

from dartree.eval.bundles import encode
from dartree.eval.concurrency import check_methods
from dartree.eval.costmodel import ConfigStats, VerifyCost, pick_best, score_at_concurrency, score_candidates
from dartree.eval.methods import parse_method
from dartree.eval.probes import measure_verify_cost, replay_settings
from dartree.eval.report import tuning_table
from dartree.eval.simulate import reference
from dartree.eval.tune import tune


def _stats(tau: float, size: float, build_s: float = 0.0) -> ConfigStats:
    return ConfigStats(tau=tau, mean_tree_size=size, draft_s=0.002, build_s=build_s, tree_sizes=(int(size),) * 10)


def test_verify_cost_interpolates_and_extrapolates():
    cost = VerifyCost((1, 5, 9), (0.010, 0.014, 0.030))
    assert cost.at(1) == pytest.approx(0.010)
    assert cost.at(3) == pytest.approx(0.012)
    assert cost.at(7) == pytest.approx(0.022)
    assert cost.at(13) == pytest.approx(0.046)          # past the last size: the last slope continues
    with pytest.raises(ValueError, match="sizes: must be strictly increasing"):
        VerifyCost((4, 2), (0.1, 0.2))
    with pytest.raises(ValueError, match="sizes: need >= 2 sizes"):
        VerifyCost((4,), (0.1,))


def test_synthetic_cost_model_picks_budget_deterministically():
    # Acceptance saturates while verify cost grows linearly: the knee wins, and only there.
    stats = {(4, None): _stats(2.0, 4), (8, None): _stats(2.8, 8), (16, None): _stats(3.2, 16),
             (32, None): _stats(3.3, 32)}
    gpu_like = VerifyCost((1, 64), (0.010, 0.011))         # flat: the biggest tree is best
    cpu_like = VerifyCost((1, 64), (0.010, 0.074))         # 1 ms per node: a middle budget is best
    best_gpu = pick_best(score_candidates(stats, gpu_like, overhead_s=0.001))
    best_cpu = pick_best(score_candidates(stats, cpu_like, overhead_s=0.001))
    assert best_gpu.budget == 32
    assert best_cpu.budget == 8
    c = next(c for c in score_candidates(stats, cpu_like, 0.001) if c.budget == 8)
    assert c.round_s == pytest.approx(0.002 + 0.0 + cpu_like.at(9) + 0.001)   # draft + build + verify + commit
    assert c.tokens_per_s == pytest.approx(2.8 / c.round_s)
    assert pick_best(score_candidates(stats, cpu_like, 0.001)) == best_cpu  # same input, same answer


def test_concurrency_cost_model_shrinks_the_tree_as_the_batch_grows():
    """A batched forward over C trees is compute-bound: the per-C model moves to smaller trees, counts
    every request's tokens, and sizes the forward by the largest of C trees."""
    stats = {(8, None): _stats(2.8, 8, build_s=0.0005), (32, None): _stats(3.6, 32, build_s=0.001)}
    at1 = VerifyCost((1, 64), (0.010, 0.012))              # one request: nodes nearly free
    at8 = VerifyCost((1, 64), (0.020, 0.148))              # eight: 2 ms per node
    assert pick_best(score_at_concurrency(stats, at1, 1, draft_s=0.003, commit_s=0.001)).budget == 32
    best8 = pick_best(score_at_concurrency(stats, at8, 8, draft_s=0.006, commit_s=0.002))
    assert best8.budget == 8
    assert best8.round_s == pytest.approx(0.006 + 8 * 0.0005 + at8.at(9) + 0.002)
    assert best8.tokens_per_s == pytest.approx(8 * 2.8 / best8.round_s)
    ragged = {(8, None): ConfigStats(2.0, 5.0, 0.0, 0.0, (2, 4, 6, 8))}
    one, two = (score_at_concurrency(ragged, at8, c, 0.0, 0.0)[0] for c in (1, 2))
    assert one.verify_s == pytest.approx(sum(at8.at(s + 1) for s in (2, 4, 6, 8)) / 4)      # the mean
    # the largest of two draws: 2 w.p. 1/16, 4 w.p. 3/16, 6 w.p. 5/16, 8 w.p. 7/16
    assert two.verify_s == pytest.approx((at8.at(3) + 3 * at8.at(5) + 5 * at8.at(7) + 7 * at8.at(9)) / 16)
    batched = pick_best(score_at_concurrency(stats, at8, 8, 0.006, 0.002, build_scale=2.0))
    assert batched.build_s == pytest.approx(2.0 * 0.0005)                  # measured batching of the build
    with pytest.raises(ValueError, match="rows"):
        score_at_concurrency(stats, at8, 0, 0.0, 0.0)
    with pytest.raises(ValueError, match="build_scale"):
        score_at_concurrency(stats, at8, 8, 0.0, 0.0, build_scale=0.0)


def test_ties_go_to_the_smaller_budget_then_width():
    stats = {(8, 4): _stats(2.0, 8), (8, 2): _stats(2.0, 8), (16, 2): _stats(2.0, 8)}
    best = pick_best(score_candidates(stats, VerifyCost((1, 64), (0.01, 0.01)), 0.0))
    assert (best.budget, best.width) == (8, 2)
    with pytest.raises(ValueError, match="candidates"):
        pick_best([])


def test_tune_on_the_toy_model(bundle):
    refs = [reference(bundle, encode(bundle.tokenizer, "def f(x):\n"), 12)]
    cost = measure_verify_cost(bundle.target, (), prefix_len=16, sizes=(1, 4, 9), repeats=1)
    assert cost.sizes == (1, 4, 9) and all(s > 0 for s in cost.seconds)
    batched = measure_verify_cost(bundle.target, (), prefix_len=16, sizes=(1, 9), repeats=1, rows=3, logits="root")
    assert batched.sizes == (1, 9) and all(s > 0 for s in batched.seconds)
    with pytest.raises(ValueError, match="rows"):
        measure_verify_cost(bundle.target, (), sizes=(1, 9), rows=0)
    result = tune(bundle, parse_method("dartree-pruned:budget=auto,width=auto"), refs, "ref",
                  budgets=(2, 6), widths=(2, 3), verify_cost=cost)
    assert len(result.candidates) == 4 and result.best in result.candidates
    assert len({c.draft_s for c in result.candidates}) == 1   # the drafter's time, pooled over the replays
    assert set(result.settings()) == {"budget", "width"}
    fixed_width = tune(bundle, parse_method("dartree-pruned:width=2"), refs, "ref", budgets=(2, 6), verify_cost=cost)
    assert {c.width for c in fixed_width.candidates} == {2}
    with pytest.raises(ValueError, match="method: 'chain' has no budget"):
        tune(bundle, parse_method("chain"), refs)


def test_beta_auto_keeps_the_best_beta_of_each_setting(bundle):
    """``beta=auto``: every (budget, width) replayed with each beta keeps the one accepted furthest (tau,
    ties to the first); the choice, its real decodes and the resolved method carry it.  Unset, beta is
    not searched."""
    refs = [reference(bundle, encode(bundle.tokenizer, "def f(x):\n"), 12)]
    cost = VerifyCost((1, 4, 9), (1e-3, 2e-3, 4e-3), 16)
    method = parse_method("dartree-pruned:budget=auto,width=auto,beta=auto")
    assert method.auto_fields == ("beta", "budget", "width")
    betas = (0.0, -0.5, -3.0)
    result = tune(bundle, method, refs, "ref", budgets=(2, 6), widths=(2,), verify_cost=cost, betas=betas,
                  min_speedup=0)                 # never AR: the tree is resolved
    for c in result.candidates:
        settings = [method.with_settings(budget=c.budget, width=2, beta=beta) for beta in betas]
        taus = [stats.tau for stats in replay_settings(bundle, settings, refs, "ref")]
        assert c.beta == betas[taus.index(max(taus))] and c.tau == max(taus)
    assert result.settings() == {"budget": result.best.budget, "width": 2, "beta": result.best.beta}
    assert result.resolve(method).config == result.settings()
    assert all(m.beta == next(c.beta for c in result.candidates if (c.budget, c.width) == (m.budget, m.width))
               for m in result.measured if not m.is_ar)
    assert f"beta={result.best.beta:g}" in result.choice_text and "| beta |" in tuning_table(result)
    plain = tune(bundle, parse_method("dartree-pruned:budget=auto,width=2"), refs, "ref", budgets=(2,),
                 verify_cost=cost, finalists=0)
    assert plain.best.beta is None and "beta" not in plain.settings() and "| beta |" not in tuning_table(plain)
    with pytest.raises(ValueError, match=r"betas: need numbers <= 0"):
        tune(bundle, method, refs, "ref", budgets=(2,), widths=(2,), verify_cost=cost, betas=(0.5,))
    with pytest.raises(ValueError, match=r"beta: not a setting of 'ddtree'"):
        parse_method("ddtree:beta=auto")
    with pytest.raises(ValueError, match=r"beta: 'auto' is not searched per concurrency level"):
        check_methods([method])


def test_the_walks_lm_head_rows_are_in_the_model(bundle):
    """Decoding that scores the root only in the forward runs one LM-head row per accepted node in the
    walk: the probe times that row, and the model adds tau - 1 of them to a round's verify cost; with
    both ways timed (``logits="walk"``) it charges the way the decoder takes (walk_pays)."""
    lazy = measure_verify_cost(bundle.target, (), prefix_len=16, sizes=(1, 9), repeats=1, logits="root")
    full = measure_verify_cost(bundle.target, (), prefix_len=16, sizes=(1, 9), repeats=1, logits="all")
    both = measure_verify_cost(bundle.target, (), prefix_len=16, sizes=(1, 9), repeats=1, logits="walk")
    assert lazy.row_s > 0 and full.row_s == 0 and not lazy.root_seconds and not full.root_seconds
    assert both.row_s > 0 and len(both.root_seconds) == len(both.seconds) == 2
    cost = VerifyCost((1, 9), (0.010, 0.018), row_s=0.002)
    (c,) = score_candidates({(8, 2): _stats(tau=3.5, size=8)}, cost, 0.0)
    assert c.verify_s == pytest.approx(0.018 + 2.5 * 0.002)
    # 9 nodes: the walk pays below 1 + 9/16 committed a round
    walk = VerifyCost((1, 9), (0.010, 0.018), row_s=0.002, root_seconds=(0.009, 0.015))
    (long,) = score_candidates({(8, 2): _stats(tau=3.5, size=8)}, walk, 0.0)
    (short,) = score_candidates({(8, 2): _stats(tau=1.25, size=8)}, walk, 0.0)
    assert long.verify_s == pytest.approx(0.018) and short.verify_s == pytest.approx(0.015 + 0.25 * 0.002)
    with pytest.raises(ValueError, match=r"row_s: must be finite and >= 0"):
        VerifyCost((1, 9), (0.010, 0.018), row_s=-1.0)
    with pytest.raises(ValueError, match=r"root_seconds: need one finite time >= 0 per size"):
        VerifyCost((1, 9), (0.010, 0.018), row_s=0.002, root_seconds=(0.009,))
    with pytest.raises(ValueError, match=r"logits: 'walk' times single-request rounds"):
        measure_verify_cost(bundle.target, (), prefix_len=16, sizes=(1, 9), repeats=1, rows=2, logits="walk")


def test_tune_at_t1_ranks_both_verifiers(bundle):
    """At T>0 every setting is ranked under each verifier (matching by its replay, rejection by real decodes
    with rejection), the finalists are the best of each verifier first, each decoded with its own verifier; the
    choice names the faster one, its forecast is that verifier's measurement, and the resolved method carries it
    (a method that fixes one is kept to it)."""
    refs = [reference(bundle, encode(bundle.tokenizer, "def f(x):\n"), 10, temperature=1.0, seed=3)]
    cost = measure_verify_cost(bundle.target, (), prefix_len=16, sizes=(1, 4, 9), repeats=1)
    result = tune(bundle, parse_method("ddtree:budget=auto"), refs, "ref", budgets=(2, 6), verify_cost=cost,
                  temperature=1.0, seed=3, finalists=2, min_speedup=0.0)
    assert {(c.budget, c.verifier) for c in result.candidates} == {(2, "match"), (2, "traversal"), (6, "match"),
                                                                    (6, "traversal")}
    trees = [m for m in result.measured if not m.is_ar]
    assert sorted(m.verifier for m in trees) == ["match", "traversal"]
    assert result.verifier in ("match", "traversal") and not result.use_ar
    chosen = result.chosen
    assert chosen.verifier == result.verifier
    assert chosen.tokens_per_s == max(m.tokens_per_s for m in trees)
    assert result.resolve(parse_method("ddtree:budget=auto")).verifier == result.verifier
    assert result.choice_text.endswith(result.verifier)
    fixed = tune(bundle, parse_method("ddtree:budget=auto,verifier=match"), refs, "ref", budgets=(2,),
                 verify_cost=cost, temperature=1.0, seed=3, finalists=1, min_speedup=0.0)
    assert {m.verifier for m in fixed.measured if not m.is_ar} == {"match"} and fixed.verifier == "match"
