"""``dartree bench --concurrency 1 2 4 8``: serving throughput against batched AR at each concurrency."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from dartree.cli.errors import UsageError, user_input
from dartree.cli.helpers import bench_preset, check_fit, check_grid, check_lengths, load, log, prepare_out, written
from dartree.eval.outdir import CONCURRENCY_FILES

__all__ = ["cmd_bench_concurrency", "CONCURRENCY_FILES"]


def cmd_bench_concurrency(args: argparse.Namespace) -> int:
    from dartree.eval.bench import run_meta
    from dartree.eval.concurrency import (
        check_methods,
        concurrency_markdown,
        plot_concurrency,
        run_concurrency,
    )
    from dartree.eval.datasets import load_prompts
    from dartree.eval.methods import parse_methods

    preset, defaults = bench_preset(args, ("methods", "datasets", "temperatures", "max_new_tokens", "budget", "out"))
    levels = list(dict.fromkeys(args.concurrency))
    num_prompts = args.num_prompts if args.num_prompts is not None else 2 * max(levels)
    dataset, temperature = preset["datasets"][0], float(preset["temperatures"][0])
    with user_input():
        methods = parse_methods([m for m in preset["methods"] if m != "ar"] or ["ar"], defaults)
        prompts = load_prompts(dataset, num_prompts)
        if any(m.auto_fields for m in methods):
            try:
                prompts += load_prompts(dataset, max(levels), offset=num_prompts)
            except ValueError as e:
                raise UsageError(f"--concurrency: 'auto' settings are tuned at each C on {max(levels)} prompts of "
                                 f"{dataset!r} after its {num_prompts} evaluation prompts; {e}") from e
        check_methods(methods)
        for m in methods:
            check_grid(m, args.tune_budgets, args.tune_widths, "--tune-budgets", "--tune-widths")
    out = Path(preset["out"])
    with prepare_out(args, out, CONCURRENCY_FILES) as run:
        bundle = load(args)
        timed = [m for m in methods if not m.is_ar]
        check_fit(bundle, timed)        # heads, topk: before anything is served
        check_lengths(bundle, [p.text for p in prompts], args.max_prompt_tokens, preset["max_new_tokens"])
        rows = run_concurrency(bundle, timed, levels, dataset=dataset,
                               num_prompts=num_prompts, max_new_tokens=preset["max_new_tokens"],
                               temperature=temperature, seed=args.seed, backend=args.backend,
                               max_prompt_tokens=args.max_prompt_tokens, stop_at_eos=args.stop_at_eos,
                               warmup=not args.no_warmup, tune_budgets=tuple(args.tune_budgets),
                               tune_widths=tuple(args.tune_widths), log=log, top_k=args.top_k, top_p=args.top_p,
                               min_p=args.min_p, verifier=args.verifier)
        meta = run_meta(bundle, args.argv)
        meta.update(dataset=dataset, temperature=temperature, prompts=num_prompts,
                    max_new_tokens=preset["max_new_tokens"])
        if temperature > 0:         # the warpers and the run's verifier, as they were passed to every row
            meta.update(top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, verifier=args.verifier or "default")
        text = concurrency_markdown(rows, meta)
        with written(run):          # the three files replace an earlier run together, once all are written
            run.write("concurrency.md", text)
            rows_json = [dataclasses.asdict(r) for r in rows]
            run.write("concurrency.json", json.dumps({"meta": meta, "rows": rows_json}, indent=1))
            plot_concurrency(rows, run.path("concurrency.png"))
    print(text)
    log(f"wrote {', '.join(map(str, run.committed))}")
    lost = [r for r in rows if r.token_checked and r.lossless_prompts != r.prompts]
    if lost:
        log(f"LOSSLESS CHECK FAILED: {[(r.method, r.concurrency) for r in lost]} differ from AR's output"
            + ("" if args.strict else "; exit status 0 because of --no-strict"))
        return 1 if args.strict else 0
    return 0
