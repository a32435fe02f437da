"""Commands that decode for real: ``generate`` (text streamed round by round) and ``bench`` (methods x
datasets x temperatures against AR, wall time, the lossless check)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from functools import partial
from pathlib import Path

from dartree.cli.helpers import (
    UsageError,
    bench_preset,
    check_fit,
    check_grid,
    file_stem,
    load,
    log,
    prepare_out,
    prompt_ids,
    round_summary,
    setting_defaults,
    user_input,
    warps_of,
    write_named,
    written,
)
from dartree.cli.parser import methods_for

__all__ = ["cmd_generate", "cmd_bench"]


def cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from dartree.decode import generate_ar
    from dartree.eval.bundles import decode, stop_token_id
    from dartree.eval.checks import check_positions, read_prompt_file
    from dartree.eval.methods import make_decoder, parse_method, sampler_for
    from dartree.eval.tune_cache import check_cached, resolve_unset
    from dartree.rounds import DEFAULT_VERIFIER

    if (args.prompt is None) == (args.prompt_file is None):
        raise UsageError("generate: give exactly one of --prompt and --prompt-file")
    with user_input():
        method = parse_method(args.method, setting_defaults(args))
        check_cached(method, args.temperature, args.threads)
        text = args.prompt if args.prompt is not None else read_prompt_file(args.prompt_file)
        try:                                # a non-UTF-8 argument arrives with surrogate escapes
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError("--prompt: the text is not valid UTF-8 (check the terminal's or the shell's encoding); "
                             "give UTF-8 text, or --prompt-file with a UTF-8 file") from None
    if not text:
        raise UsageError(f"{'--prompt' if args.prompt is not None else '--prompt-file'}: the prompt is empty; "
                         "give at least one character")
    bundle = load(args)
    # AR verifies nothing: at T>0 it draws as the run's verifier would (a method resolved to AR: as its own): the
    # generator sampler seeded by --seed by default, the draw bench times AR with; keyed only under match, where
    # it equals a match tree decode with the same seed token for token
    ar_draws = method.verifier or args.verifier or DEFAULT_VERIFIER
    with user_input():          # budget / width unset or auto: this machine's tuned choice, or the device's default
        method, note = resolve_unset(bundle, method, args.temperature, warps_of(args))
    if note:
        log(f"{method.label}: {note}")
    check_fit(bundle, [method])
    ids = torch.tensor([prompt_ids(bundle, text, 1 << 30)], dtype=torch.int64)
    with user_input():
        check_positions(bundle, [ids.shape[1]], args.max_new_tokens)
    stops = None if args.no_stop or stop_token_id(bundle) is None else [stop_token_id(bundle)]
    verifier = method.verifier_at(args.temperature, args.verifier)
    sampler = sampler_for(ar_draws if method.is_ar else verifier, args.seed) if args.temperature > 0 else None
    options = {**warps_of(args), "verifier": verifier if args.temperature > 0 else None}
    out = sys.stdout
    out.write(text)
    out.flush()
    generated: list[int] = []
    shown = [0]

    def show(tokens: list[int], final: bool = False) -> None:
        generated.extend(tokens)
        full = decode(bundle.tokenizer, generated)
        if not final:                 # an incomplete UTF-8 sequence decodes to U+FFFD: wait for its bytes
            full = full.rstrip("\ufffd")
        if len(full) > shown[0]:
            out.write(full[shown[0]:])
            out.flush()
            shown[0] = len(full)

    start = time.perf_counter()
    if method.is_ar:
        result = generate_ar(bundle.target, ids, args.max_new_tokens, args.temperature, sampler, stops,
                             **warps_of(args))
        show(result.tokens[0].tolist())
    else:
        result = make_decoder(bundle, method, args.backend).generate(
            ids, args.max_new_tokens, args.temperature, sampler, stops,
            on_round=None if args.no_stream else lambda stats, tokens: show(tokens), **options)
        if args.no_stream:
            show(result.tokens[0].tolist())
    seconds = time.perf_counter() - start
    show([], final=True)
    out.write("\n")
    verified = f", verifier: {verifier}" if args.temperature > 0 and not method.is_ar else ""
    log(f"--- {method.label} ({bundle.name}), T={args.temperature:g}{verified}, stop: {result.stop_reason}, "
        f"{seconds:.2f} s wall")
    log(round_summary(result))
    return 0


def tuning_plot_names(tuning) -> list[str]:
    """A file name per tuning result: ``tuning_BUILDER.png``, with the method label and then the temperature
    added where several results would share a name (no plot of the run overwrites another)."""
    stems = [t.builder if len({u.method for u in tuning if u.builder == t.builder}) == 1 else file_stem(t.method)
             for t in tuning]
    return [f"tuning_{stem}" + (f"_T{t.temperature:g}" if stems.count(stem) > 1 else "") + ".png"
            for stem, t in zip(stems, tuning, strict=True)]


def _cache_tuning(bundle, config, result) -> None:
    """Keep the bench's tuning of each ``auto`` method for ``dartree generate`` on this machine (after
    the results are committed: a cache that cannot be written is a warning, never a lost run)."""
    from dartree.eval.tune_cache import cache_key, entry_of, model_hash, store_or_warn

    if not result.tuning:
        return
    digest, by_label = model_hash(bundle), {m.label: m for m in config.methods}
    for t in result.tuning:
        method = by_label[t.method]
        if method.is_auto and t.temperature > 0:        # ranked under the run's --verifier
            method = method.under(config.verifier)
        path = store_or_warn(cache_key(bundle, method, t.temperature, digest, config.warps), entry_of(t), log)
    if path is not None:
        log(f"tuning cached for `dartree generate` in {path}")


def cmd_bench(args: argparse.Namespace) -> int:
    levels = list(dict.fromkeys(args.concurrency or ()))
    if levels and args.peers is not None:
        raise UsageError("--peers: the peers run one request at a time; drop --concurrency to compare them")
    from dartree.eval.bench import BenchConfig, run_bench, run_meta
    from dartree.eval.bundles import encode
    from dartree.eval.checks import check_positions
    from dartree.eval.concurrency import check_methods, concurrency_markdown, run_concurrency
    from dartree.eval.datasets import load_prompts
    from dartree.eval.methods import parse_methods
    from dartree.eval.outdir import BENCH_FILES, named_files
    from dartree.eval.peers import PEERS
    from dartree.eval.plots import plot_acceptance, plot_concurrency, plot_tuning
    from dartree.eval.report import bench_markdown

    preset, defaults = bench_preset(args, ("methods", "datasets", "temperatures", "num_prompts", "max_new_tokens",
                                           "budget", "out"))
    if levels:         # serving: the first dataset and temperature, 2 max(C) prompts unless --num-prompts
        preset.update(datasets=preset["datasets"][:1], temperatures=preset["temperatures"][:1],
                      num_prompts=args.num_prompts or 2 * max(levels))
    elif args.methods is None:              # at T>0 the preset's methods that pay there
        preset["methods"] = methods_for(preset, [float(t) for t in preset["temperatures"]])
    # the preset's peers unless --peers says otherwise (they decode the full length: not with --stop-at-eos);
    # --peers alone: every peer (BenchConfig checks the names)
    peers = args.peers if args.peers is not None else None if args.stop_at_eos else preset.get("peers")
    with user_input():
        methods = parse_methods([m for m in preset["methods"] if m != "ar"] or ["ar"], defaults)
        config = BenchConfig(
            methods=tuple(m for m in methods if not m.is_ar), datasets=tuple(dict.fromkeys(preset["datasets"])),
            temperatures=tuple(dict.fromkeys(float(t) for t in preset["temperatures"])),
            num_prompts=preset["num_prompts"], max_new_tokens=preset["max_new_tokens"],
            max_prompt_tokens=args.max_prompt_tokens, seed=args.seed, backend=args.backend,
            warmup=not args.no_warmup, stop_at_eos=args.stop_at_eos,
            calibration_prompts=args.calibration_prompts or preset.get("calibration_prompts", 4),
            tune_budgets=tuple(args.tune_budgets), tune_widths=tuple(args.tune_widths),
            peers=() if peers is None else tuple(dict.fromkeys(peers)) or PEERS,
            verifier=args.verifier, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, law_draws=args.law_draws)
        # Enough prompts in every dataset (and calibration prompts for budget=auto)?
        prompts = [p for d in config.datasets for p in load_prompts(d, config.num_prompts,
                                                                    prompt_chars=config.prompt_chars)]
        if any(m.auto_fields for m in config.methods):
            option, count = ("--concurrency", max(levels)) if levels else ("--calibration-prompts",
                                                                           config.calibration_prompts)
            for d in config.datasets:
                try:
                    prompts += load_prompts(d, count, offset=config.num_prompts, prompt_chars=config.prompt_chars)
                except ValueError as e:
                    raise UsageError(f"{option}: 'auto' settings are tuned on the prompts of {d!r} after its "
                                     f"{config.num_prompts} evaluation prompts; {e}") from e
        if levels:
            check_methods(config.methods)
        for m in config.methods:
            check_grid(m, config.tune_budgets, config.tune_widths, "--tune-budgets", "--tune-widths")
    with prepare_out(args, Path(preset["out"]), named_files("concurrency") if levels else BENCH_FILES) as run:
        bundle = load(args)
        check_fit(bundle, config.methods)        # heads, topk: before anything is run
        with user_input():                       # every prompt, cut to --max-prompt-tokens, fits with its new tokens
            check_positions(bundle, [min(len(encode(bundle.tokenizer, p.text)), config.max_prompt_tokens)
                                     for p in prompts], config.max_new_tokens, "--max-prompt-tokens")
        start = time.perf_counter()
        if levels:
            rows = run_concurrency(bundle, config, levels, log=log)
            meta = run_meta(bundle, args.argv)
            meta.update(dataset=config.datasets[0], temperature=config.temperatures[0], prompts=config.num_prompts,
                        max_new_tokens=config.max_new_tokens)
            if config.temperatures[0] > 0:      # the warpers and the run's verifier, as they were passed to every row
                meta.update(config.warps, verifier=config.verifier or "default")
            text = concurrency_markdown(rows, meta)
        else:
            result = run_bench(bundle, config, argv=args.argv, log=log)
            text = bench_markdown(result)
        with written(run):          # the files replace an earlier run together, once all are written
            if levels:
                write_named(run, "concurrency", text, {"meta": meta, "rows": [dataclasses.asdict(r) for r in rows]},
                            partial(plot_concurrency, rows))
            else:
                run.write("results.md", text)
                run.write("results.json", json.dumps(result.to_json(), indent=1, default=str))
                plot_acceptance(result.summaries, run.path("acceptance.png"))
                for t, name in zip(result.tuning, tuning_plot_names(result.tuning), strict=True):
                    plot_tuning(t, run.path(name))
    if levels:
        print(text)
        log(f"wrote {', '.join(map(str, run.committed))}")
        lost = [(r.method, r.concurrency) for r in rows if r.token_checked and r.lossless_prompts != r.prompts]
        failure = f"{lost} differ from AR's output" if lost else ""
    else:
        _cache_tuning(bundle, config, result)
        print(text)
        log(f"wrote {', '.join(map(str, run.committed))} in {time.perf_counter() - start:.0f} s")
        bad = sum(not r.matches_ar for r in result.records)
        law = [f"{c.method} T={c.temperature:g}" for c in result.law_checks if not c.passed]
        failure = "" if result.lossless else (
            (f"{bad} of {len(result.records)} outputs differ from AR's" if bad else "") + ("; " if bad and law else "")
            + (f"the distribution check rejects {', '.join(law)}" if law else "")
            + " (see the table's lossless column and the report's last line)")
    if failure:
        log(f"LOSSLESS CHECK FAILED: {failure}" + ("" if args.strict else "; exit status 0 because of --no-strict"))
        return 1 if args.strict else 0
    return 0
