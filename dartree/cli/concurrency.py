"""``dartree bench --concurrency 1 2 4 8``: serving throughput against batched AR at each concurrency."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from dartree.cli.helpers import check_fit, check_lengths, load, log, prepare_out, written
from dartree.eval.outdir import CONCURRENCY_FILES

__all__ = ["bench_concurrency"]


def bench_concurrency(args: argparse.Namespace, config, levels: list[int], prompts, out: Path) -> int:
    """Serve ``config`` at every concurrency of ``levels`` and write the run (``config`` and ``prompts``, its
    evaluation and calibration prompts, were checked by :func:`dartree.cli.decode.cmd_bench`)."""
    from dartree.eval.bench import run_meta
    from dartree.eval.concurrency import concurrency_markdown, plot_concurrency, run_concurrency

    with prepare_out(args, out, CONCURRENCY_FILES) as run:
        bundle = load(args)
        check_fit(bundle, config.methods)        # heads, topk: before anything is served
        check_lengths(bundle, [p.text for p in prompts], config.max_prompt_tokens, config.max_new_tokens)
        rows = run_concurrency(bundle, config, levels, log=log)
        meta = run_meta(bundle, args.argv)
        temperature = config.temperatures[0]
        meta.update(dataset=config.datasets[0], temperature=temperature, prompts=config.num_prompts,
                    max_new_tokens=config.max_new_tokens)
        if temperature > 0:         # the warpers and the run's verifier, as they were passed to every row
            meta.update(config.warps, verifier=config.verifier or "default")
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
