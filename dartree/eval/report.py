"""Markdown tables of benchmark, tuning and sweep results (the paper's Tables 1, 2 and 4)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dartree.eval.bench import MODEL_STAGES, BenchResult, Summary
from dartree.eval.datasets import DATASETS, count_prompts
from dartree.eval.methods import AR, AUTO
from dartree.eval.tune import TuneResult
from dartree.rounds import ROUND_STAGES, SAMPLED_VERIFIERS

__all__ = ["markdown_table", "table1", "table2", "tuning_table", "forecast_table", "bench_markdown"]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; every row must have ``len(header)`` cells."""
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"rows: each row needs {len(header)} cells, got {len(row)}: {row}")
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _settings(s: Summary) -> str:
    if s.builder == AR and s.method != AR:          # budget=auto (or auto) resolved to plain AR
        return "auto -> ar"
    short = {"budget": "B", "width": "W", "topk": "K", "beta": "beta"}
    known = [f"{name}={s.settings[k]:g}" if k == "beta" else f"{name}={s.settings[k]}"
             for k, name in short.items() if k in s.settings]
    # a plugin's own fields, set in the method's text (or defaulted), after dartree's
    custom = [f"{k}={v}" for k, v in sorted(s.settings.items()) if k not in short and k != "normalize"]
    if s.method.split(":")[0] == AUTO:              # auto chose the builder (and at T>0 the verifier) too
        return " ".join([f"auto -> {s.builder}", *known, *custom] + ([s.verifier] if s.temperature > 0 else []))
    return " ".join(known + custom)


def _methods(summaries: Sequence[Summary]) -> list[str]:
    return list(dict.fromkeys(s.method for s in summaries))


def _per_round(group: Sequence[Summary], value) -> float:
    """``value`` of the summaries pooled over their rounds."""
    return sum(value(s) * s.rounds for s in group) / sum(s.rounds for s in group)


def table1(summaries: Sequence[Summary], temperature: float) -> str:
    """Rows: methods; per dataset: speedup over AR and tau; then lossless prompts (Table 1)."""
    at = [s for s in summaries if s.temperature == temperature]
    cells = {(s.method, s.dataset): s for s in at}
    datasets = list(dict.fromkeys(s.dataset for s in at))
    header = ["method", "settings", *(f"{d} {column}" for d in datasets for column in ("speedup", "tau")), "tok/s",
              "lossless"]
    rows = []
    for method in _methods(at):
        mine = [cells[method, d] for d in datasets if (method, d) in cells]
        last = mine[-1]
        row: list[Any] = [method, _settings(last)]
        for d in datasets:                          # a peer may report no rounds: no tau
            s = cells.get((method, d))
            row += ["-", "-"] if s is None else [f"{s.speedup:.2f}x", f"{s.tau:.2f}" if s.rounds else "-"]
        seconds = sum(s.seconds for s in mine)
        law = next((s.law for s in reversed(mine) if s.law), "")
        # what was checked: tokens equal to AR's (greedy; keyed draws for match, AR's own draws for a method
        # resolved to AR), or the law test of sampled rows
        check = (law or "in law: not tested") if last.verifier in SAMPLED_VERIFIERS else \
            f"{sum(s.lossless_prompts for s in mine)}/{sum(s.prompts for s in mine)} = AR" + (
                " (keyed)" if last.verifier == "match" and last.builder != AR else "")
        unchecked = method == AR or last.verifier == "sample"         # a peer's own sampling at T>0: not compared
        row += [f"{sum(s.tokens for s in mine) / seconds:.1f}" if seconds else "-", "-" if unchecked else check]
        rows.append(row)
    return markdown_table(header, rows)


def table2(summaries: Sequence[Summary], temperature: float) -> str:
    """Rows: methods; mean ms per round of each disjoint stage, pooled over datasets (Table 2); ``overhead`` =
    round - (draft + head + target + context)."""
    rows = []
    for method in _methods([s for s in summaries if s.temperature == temperature]):
        group = [s for s in summaries if s.method == method and s.temperature == temperature]
        if group[0].builder == "peer":        # a peer's loop is timed whole: no stages
            continue
        ms = {st: _per_round(group, lambda s, st=st: s.stage_ms[st]) for st in ROUND_STAGES}
        total = sum(ms.values())
        overhead = total - sum(ms[st] for st in MODEL_STAGES)
        tree, tau = _per_round(group, lambda s: s.mean_tree_size), _per_round(group, lambda s: s.tau)
        rows.append([method, *(f"{ms[st]:.2f}" for st in ROUND_STAGES), f"{total:.2f}", f"{overhead:.2f}",
                     f"{100 * overhead / total:.0f}%" if total > 0 else "-", f"{tree:.1f}", f"{tau:.2f}",
                     f"{total / tau:.2f}"])
    header = ["method", *(f"{st} ms" for st in ROUND_STAGES), "round ms", "overhead ms", "overhead %", "tree size",
              "tau", "ms/token"]
    return markdown_table(header, rows)


def accelerator_forecast(summaries: Sequence[Summary], temperature: float) -> str:
    """Per method: the speedup forecast where a tree verify costs one AR step (the paper's GPU regime), every
    other stage as measured: ``tau * ar_round / (round - target + ar_target)``, pooled over datasets."""
    rows = []
    group = [s for s in summaries if s.temperature == temperature and s.rounds]
    ar = [s for s in group if s.method == AR]
    if not ar:
        return ""
    ar_round, ar_target = _per_round(ar, lambda s: s.round_ms), _per_round(ar, lambda s: s.stage_ms["target"])
    for method in _methods(group):
        rs = [s for s in group if s.method == method]
        if rs[0].builder == AR:                     # AR itself, or a method tuned to plain AR
            continue
        tau, round_ms = _per_round(rs, lambda s: s.tau), _per_round(rs, lambda s: s.round_ms)
        target = _per_round(rs, lambda s: s.stage_ms["target"])
        measured = sum(s.tokens for s in rs) / sum(s.seconds for s in rs) / (
            sum(s.tokens / s.speedup for s in rs) / sum(s.seconds for s in rs))
        forecast = tau * ar_round / (round_ms - target + ar_target)
        rows.append([method, f"{tau:.2f}", f"{measured:.2f}x", f"{forecast:.2f}x", f"{tau * ar_round / ar_target:.2f}x"
                     if ar_target > 0 else "-"])
    return markdown_table(["method", "tau", "measured speedup", "forecast: verify = 1 AR step",
                           "forecast: verify = 1 AR step, nothing else"], rows)


def tuning_table(result: TuneResult) -> str:
    """Every setting the tuner scored, the choice marked (Table 4): the cost model's columns (the ranking),
    then the real decodes of the finalists and AR (``-`` where not measured)."""
    ar = result.ar_tokens_per_s
    betas = any(c.beta is not None for c in result.candidates)     # beta=auto: the beta each setting kept
    builders = result.builder == AUTO                                # auto: several builders
    verifiers = any(c.verifier is not None for c in result.candidates)
    rows = []
    for c in result.candidates:
        mark = " **(chosen)**" if c == result.best and not result.use_ar else ""
        m = result.measurement(c.budget, c.width, c.verifier, c.builder if builders else None)
        rows.append([*([c.builder] if builders else []), f"{c.budget}{mark}", "-" if c.width is None else c.width,
                     *([f"{c.beta:g}"] if betas else []), *([c.verifier] if verifiers else []), f"{c.tau:.2f}",
                     f"{c.mean_tree_size:.1f}", f"{1000 * c.draft_s:.2f}", f"{1000 * c.build_s:.2f}",
                     f"{1000 * c.verify_s:.2f}", f"{1000 * c.overhead_s:.2f}", f"{1000 * c.round_s:.2f}",
                     f"{c.tokens_per_s:.1f}", f"{c.tokens_per_s / ar:.2f}x",
                     "-" if m is None else f"{m.tokens_per_s:.1f}" + ("" if verifiers else _verifiers(result, c, m)),
                     "-" if m is None else f"{m.tokens_per_s / ar:.2f}x"])
    a = result.measurement(None)
    if a is not None:
        rows.append([*(["ar"] if builders else []), ("-" if builders else "ar")
                     + (" **(chosen)**" if result.use_ar else ""), "-", *(["-"] if betas else []),
                     *(["-"] if verifiers else []), "1.00", "0.0", *["-"] * 7, f"{a.tokens_per_s:.1f}", "1.00x"])
    header = [*(["builder"] if builders else []), "budget", "width", *(["beta"] if betas else []),
              *(["verifier (tau measured under it)"] if verifiers else []), "tau", "tree size", "draft ms",
              "build ms", "verify ms (model; rejection: measured)" if verifiers else "verify ms (model)",
              "accept + commit ms", "round ms", "model tok/s",
              "model speedup", "measured tok/s", "measured speedup"]
    return markdown_table(header, rows)


def _verifiers(result: TuneResult, c, best) -> str:
    """At T>0 the verifier of the measured rate and the others' rates, e.g. `` (rejection; match 120.3)``."""
    other = [m for m in result.measured if (m.budget, m.width) == (c.budget, c.width) and m is not best]
    if best.verifier is None or not other:
        return ""
    return f" ({best.verifier}; " + ", ".join(f"{m.verifier} {m.tokens_per_s:.1f}" for m in other) + ")"


def forecast_table(result: BenchResult) -> str:
    """Per tuned method and temperature: the tuner's forecast (calibration prompts) beside what the run
    measured (evaluation prompts), per dataset and pooled, with the 90% intervals of
    :meth:`TuneResult.forecast_interval` and :meth:`TuneResult.prompts_for` (the speedup columns take out AR's
    drift between the two)."""
    rows = []
    for tr in result.tuning:
        temp = [s for s in result.summaries if s.temperature == tr.temperature]
        cells = [s for s in temp if s.method == tr.method]
        ar_eval = {s.dataset: s for s in temp if s.method == AR}
        ar_calib = tr.measurement(None)
        ar_by_label = {} if ar_calib is None else ar_calib.label_tokens_per_s()
        by_label = tr.forecast_by_label()
        points = [(s.dataset, by_label.get(s.dataset), ar_by_label.get(s.dataset), s.tokens_per_s,
                   ar_eval[s.dataset].tokens_per_s, s.prompts) for s in cells if s.dataset in ar_eval]
        if cells and ar_eval:
            ars = list(ar_eval.values())
            points.append(("all", tr.forecast_tokens_per_s, tr.ar_tokens_per_s, sum(s.tokens for s in cells)
                           / sum(s.seconds for s in cells), sum(s.tokens for s in ars) / sum(s.seconds for s in ars),
                           sum(s.prompts for s in cells)))
        for dataset, forecast, ar_cal, measured, ar_ev, prompts in points:
            # the speedup error takes out AR's drift between calibration and evaluation (a shared machine)
            known = forecast is not None and bool(ar_cal)
            rate, speedup = tr.forecast_interval(None if dataset == "all" else dataset, max(1, prompts))
            inside = [("-" if i is None else "yes" if x in i else "no")
                      for i, x in ((rate, measured), (speedup, measured / ar_ev))]
            rows.append([tr.method, f"{tr.temperature:g}", f"auto -> {tr.choice_text}", dataset,
                         "-" if forecast is None else f"{forecast:.1f}", "-" if rate is None else rate.text,
                         f"{measured:.1f}",
                         "-" if forecast is None else f"{100 * (forecast / measured - 1):+.0f}%",
                         f"{forecast / ar_cal:.2f}x" if known else "-",
                         "-" if speedup is None else f"{speedup.low:.2f}-{speedup.high:.2f}x",
                         f"{measured / ar_ev:.2f}x",
                         f"{100 * ((forecast / ar_cal) / (measured / ar_ev) - 1):+.0f}%" if known else "-",
                         " / ".join(inside), _need(tr.prompts_for(None if dataset == "all" else dataset), dataset,
                                                   result.config.prompt_chars),
                         "-" if not ar_cal else f"{ar_cal:.1f} -> {ar_ev:.1f}"])
    header = ["method", "T", "resolved", "dataset", "forecast tok/s", "90% interval", "measured tok/s", "error",
              "forecast speedup", "90% interval", "measured speedup", "speedup error", "in 90% (tok/s / speedup)",
              "prompts for +-15% (each side)", "AR tok/s calibration -> evaluation"]
    return markdown_table(header, rows)


def _need(prompts: int | None, dataset: str, prompt_chars: int) -> str:
    """The prompts-for-15% cell: the count, and the dataset's size where both sides together need more."""
    if prompts is None:
        return "-"
    if dataset in DATASETS:
        available = count_prompts(dataset, prompt_chars=prompt_chars)
        if 2 * prompts > available:
            return f"{prompts} ({dataset} has {available})"
    return str(prompts)


def bench_markdown(result: BenchResult) -> str:
    """The whole benchmark report: Table 1 and Table 2 per temperature, tuning tables, lossless line."""
    meta = result.meta
    native = ", compiled host loops" if meta["native_host_loops"] else ", tensorized builders (no _native)"
    native += ", lean target forward" if meta["target_forward"] == "lean" else ", the target's own forward"
    parts = [f"# dartree bench: {meta['model']}", "",
             f"{meta['date_utc']}; {meta['machine']}, torch {meta['torch']}, {meta['torch_threads']} threads, "
             f"device {meta['device']}{native}; {result.config.num_prompts} prompts per dataset, "
             f"{result.config.max_new_tokens} new tokens each."]
    if meta.get("command"):
        parts += ["", f"Command: `{meta['command']}`"]
    for t in dict.fromkeys(s.temperature for s in result.summaries):
        parts += ["", f"## Speedup over AR and tau, T={t:g}", "", table1(result.summaries, t),
                  "", f"## Time per round (ms), T={t:g}", "", table2(result.summaries, t), "",
                  "Stages are disjoint and sum to the round: draft (drafter forward on the block), head (inside "
                  "correction-head calls), builder (the rest of the build), mask (tree inputs), target (target "
                  "forward), accept (acceptance walk), context (drafter forward over the committed tokens), kv "
                  "(KV compaction, bookkeeping); overhead = round - (draft + head + target + context)."]
        if t > 0:
            forecast = accelerator_forecast(result.summaries, t)
            if forecast:
                parts += ["", f"## Forecast where a tree verify costs one AR step (the paper's GPU regime), T={t:g}",
                          "", "**A forecast, not a measurement**: the measured acceptance (tau) and every stage as "
                          "measured here, with the target forward of a tree priced at one AR step; the last column "
                          "prices the whole round at one AR step (free drafting).", "", forecast]
    if result.tuning:
        parts += ["", "## Tuned budget: forecast vs measured", "",
                  "Forecast: the chosen setting's tokens/s decoded on held-out calibration prompts (the prompts "
                  "after the evaluation prompts of each dataset, at the run's temperature); measured: the same "
                  "setting on the evaluation prompts above.  90% interval: where the measurement should fall, "
                  "from how much the calibration prompts differed from each other and how many prompts each side "
                  "decodes (the machine's speed moving between calibration and evaluation moves tokens/s outside "
                  "it); prompts for +-15%: how many prompts each side would need for that interval to be within "
                  "15% of the forecast, at the spread the calibration prompts showed.", "", forecast_table(result)]
    for tr in result.tuning:
        cost = tr.verify_cost
        by_size = {way: ", ".join(f"n={n}: {1000 * s:.2f} ms" for n, s in zip(cost.sizes, times, strict=True))
                   for way, times in (("all", cost.seconds), ("root", cost.root_seconds)) if times}
        parts += ["", f"## Adaptive budget for {tr.method}, T={tr.temperature:g}", "",
                  f"Verify cost measured on this machine at prefix {cost.prefix_len}: {by_size['all']}"
                  + (f"; scoring the root only: {by_size['root']}" if cost.root_seconds else "")
                  + (f"; one LM-head row of the acceptance walk (per accepted node): {1000 * cost.row_s:.2f} ms"
                     if cost.row_s > 0 else ""),
                  "", f"{tr.calibration_prompts} calibration prompts; the cost model ranks every setting, its "
                  f"{sum(not m.is_ar for m in tr.measured)} best (the best of each "
                  + ("verifier, then of each builder and verifier, then of each budget" if tr.builder == AUTO else
                     "verifier, then of each budget" if tr.verifier is not None else "budget")
                  + " first) are decoded for real beside AR, each with the verifier it was ranked under, and the "
                  "fastest is "
                  f"chosen if it beats AR by {100 * (tr.min_speedup - 1):.0f}% or more, else plain AR: "
                  f"**auto -> {tr.choice_text}**.", "", tuning_table(tr)]
    bad = [r for r in result.records if not r.matches_ar]
    law = sorted({r.method for r in result.records if r.verifier in SAMPLED_VERIFIERS})
    sampling_peers = sorted({r.method for r in result.records if r.verifier == "sample"})
    matched = ("every compared output" if law or sampling_peers else "every method's output") + \
        " equals AR's token for token on " \
        "every prompt (T=0 greedy; T>0 target-sample matching with the run's keyed sampler, against an untimed " \
        "keyed AR: the timed AR draws with its generator sampler, the cheaper draw)"
    failed = [c for c in result.law_checks if not c.passed]
    if law:
        matched += (f"; {', '.join(law)} verified on sampled trees (rejection or traversal: lossless in law, "
                    "not token for token): "
                    "tested on this run instead, every token its rounds committed plus the first verified token of "
                    f"{result.config.law_draws} extra one-round decodes per prompt, against the target's exact warped "
                    "law at its prefix (randomized PIT, chi-square over 10 bins, false-alarm rate "
                    f"{result.law_checks[0].alpha:g} per method and temperature): "
                    + ", ".join(f"{c.method} T={c.temperature:g} {c.text}" for c in result.law_checks)
                    if result.law_checks else "; sampled rows: not tested")
    if sampling_peers:
        matched += f"; {', '.join(sampling_peers)} at T>0 sample with HF's own sampler: timed, not compared"
    if bad:
        parts += ["", f"Lossless check FAILED on {len(bad)} runs: " + ", ".join(
            f"{r.method}/{r.dataset}/T={r.temperature:g}/{r.prompt_id} (from token {r.first_difference})"
            for r in bad)]
    elif failed:
        parts += ["", "Lossless check FAILED: the distribution check rejects " + ", ".join(
            f"{c.method} T={c.temperature:g} ({c.text}, chi-square {c.statistic:.1f}, df {c.df})" for c in failed)]
    else:
        parts += ["", f"Lossless check: {matched}."]
    return "\n".join(parts) + "\n"

