"""Commands that replay rounds on AR references: ``sweep`` (one setting over a grid), ``show-tree``
(one round's tree, depth distributions) and ``tune`` (the adaptive budget)."""

from __future__ import annotations

import argparse
import dataclasses
from functools import partial

from dartree.cli.helpers import (
    UsageError,
    check_fit,
    check_grid,
    dataset_prompts,
    file_stem,
    load,
    log,
    prepare_out,
    references,
    setting_defaults,
    user_input,
    warps_of,
    write_named,
    written,
)

__all__ = ["cmd_sweep", "cmd_show_tree", "cmd_tune"]


def cmd_sweep(args: argparse.Namespace) -> int:
    from dartree.eval.methods import make_method_builder, parse_methods
    from dartree.eval.outdir import named_files
    from dartree.eval.plots import plot_sweep
    from dartree.eval.sweep import DEFAULT_VALUES, check_sweep_values, run_sweep, sweep_table

    names = args.methods or (["dartree-pruned"] if args.param in ("width", "beta")
                             else ["ddtree", "dartree-fixed", "dartree-pruned"])
    values = args.values if args.values is not None else list(DEFAULT_VALUES[args.param])
    with user_input():
        methods = parse_methods(names, setting_defaults(args))
        check_sweep_values(args.param, values, methods)
        for m in methods:
            for v in values:                            # every point's builder config is valid
                make_method_builder(m.with_settings(**{args.param: v if args.param == "beta" else int(v)}), "ref")
    prompts = dataset_prompts(args)
    with prepare_out(args, args.out, named_files(f"sweep_{args.param}")) as run:
        bundle = load(args)
        check_fit(bundle, methods, [int(v) for v in values] if args.param == "topk" else ())
        refs = references(bundle, args, [p.text for p in prompts])
        result = run_sweep(bundle, methods, args.param, values, refs, args.backend, progress=log)
        table = sweep_table(result)
        with written(run):          # the three files replace an earlier sweep of this parameter together
            write_named(run, f"sweep_{args.param}", f"# Sweep of {args.param} on {bundle.name}, {args.dataset}, "
                        f"T={args.temperature:g}\n\n{table}\n", dataclasses.asdict(result),
                        partial(plot_sweep, args.param, result.series()))
    print(table)
    log(f"wrote {', '.join(map(str, run.committed))}")
    return 0


def cmd_show_tree(args: argparse.Namespace) -> int:
    from dartree.eval.bundles import decode
    from dartree.eval.methods import parse_method, parse_methods
    from dartree.eval.outdir import TREE_FILES
    from dartree.eval.plots import plot_depth_distribution, plot_tree
    from dartree.eval.simulate import depth_counts, recorded_rounds

    with user_input():
        method = parse_method(args.method, setting_defaults(args))
        depth_methods = parse_methods(args.depth_methods, setting_defaults(args))
        for m in (method, *depth_methods):
            if m.is_ar:
                raise ValueError("method: 'ar' builds no tree; pick tree builders")
            if m.auto_fields:
                raise ValueError(f"method: {m.label!r}: give numbers instead of 'auto' to draw trees")
    if args.prompt is not None and not args.prompt:
        raise UsageError("--prompt: the prompt is empty; give at least one character")
    texts = [args.prompt] if args.prompt is not None else [p.text for p in dataset_prompts(args)]
    with prepare_out(args, args.out, TREE_FILES) as run:
        bundle = load(args)
        check_fit(bundle, [method, *depth_methods])
        refs = references(bundle, args, texts)
        rounds = recorded_rounds(bundle, method, refs[0], args.backend)
        if args.round > len(rounds):
            raise UsageError(f"--round: the first prompt took {len(rounds)} rounds; pick 1..{len(rounds)}")
        r = rounds[args.round - 1]
        gamma = int(getattr(bundle.drafter, "gamma", 0)) or max(int(x.tree.depths.max()) for x in rounds)
        counts = {}
        for m in depth_methods:
            all_rounds = [x for ref in refs for x in recorded_rounds(bundle, m, ref, args.backend)]
            counts[m.label] = depth_counts(all_rounds, gamma)
        with written(run):          # both plots replace an earlier run's together
            plot_tree(r.tree, r.accepted, lambda t: decode(bundle.tokenizer, [t]),
                      run.path(f"tree_{file_stem(method.label)}_round{args.round}.png"),
                      title=f"{method.label}, round {args.round}: {r.tree_size} draft nodes, "
                            f"{r.accepted_length} accepted (green), then the target's bonus token "
                            f"{decode(bundle.tokenizer, [r.bonus]) if r.bonus >= 0 else '(end)'!r}")
            plot_depth_distribution(counts, run.path("depth_distribution.png"))
    print(r.tree.format(0, lambda t: repr(decode(bundle.tokenizer, [t]))))
    log(f"wrote {', '.join(map(str, run.committed))}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from dartree.eval.methods import parse_method
    from dartree.eval.outdir import named_files
    from dartree.eval.plots import plot_tuning
    from dartree.eval.report import tuning_table
    from dartree.eval.tune import tune
    from dartree.eval.tune_cache import cache_key, entry_of, store_or_warn

    with user_input():
        method = parse_method(args.method, setting_defaults(args))      # unset budget / width are searched
        if method.is_auto:
            method = method.under(args.verifier)                            # auto ranked under --verifier only
            check_grid(method, args.budgets, args.widths, "--budgets", "--widths")
        elif method.is_ar or "budget" not in method.fields():
            raise ValueError(f"method: {method.label!r} has no budget to tune (or give --method auto: the tuner "
                             "picks the builder too)")
        else:                    # something is left to search, and every setting of the grid is valid
            searched = method.searched
            if not searched:     # every tunable setting is fixed: --budgets / --widths would be ignored
                raise ValueError(f"method: {method.label!r} (with --budget/--width) fixes every setting tune "
                                 "searches; leave budget (or width) unset or 'auto'")
            check_grid(method, args.budgets, args.widths, "--budgets", "--widths", searched)
    warp = warps_of(args)
    prompts = dataset_prompts(args)
    with prepare_out(args, args.out, named_files(f"tune_{method.builder}")) as run:
        bundle = load(args)
        check_fit(bundle, [method])
        refs = references(bundle, args, [p.text for p in prompts], warp)
        result = tune(bundle, method, refs, args.backend, args.budgets, args.widths, progress=log,
                      temperature=args.temperature, seed=args.seed, warps=warp)
        table = tuning_table(result)
        with written(run):          # the three files replace an earlier tuning of this builder together
            write_named(run, f"tune_{method.builder}", f"# Adaptive budget for {method.label} on {bundle.name}\n\n"
                        f"{table}\n", dataclasses.asdict(result), partial(plot_tuning, result))
    cached = store_or_warn(cache_key(bundle, method, args.temperature, warps=warp), entry_of(result), log)
    print(table)
    chosen = "plain AR (no tree is forecast to beat it)" if result.use_ar else " ".join(
        f"--{k} {v}" for k, v in result.settings().items())
    if method.is_auto and not result.use_ar:        # the method itself: as --method would name it
        spec = result.resolve(method)
        chosen = f"--method {spec.builder}:" + ",".join(
            [f"{k}={v}" for k, v in spec.settings] + ([f"verifier={spec.verifier}"] if spec.verifier else []))
    print(f"\nchosen: {chosen}  {result.forecast_text(len(refs))}")
    if cached is not None:
        log(f"cached for `dartree generate` (this model, machine, threads and temperature) in {cached}")
    log(f"wrote {', '.join(map(str, run.committed))}")
    return 0
