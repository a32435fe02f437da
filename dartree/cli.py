"""The ``dartree`` command line: generate, bench, sweep, show-tree, tune.

    dartree generate --prompt "def fib(n):" --method dartree-pruned:budget=32,width=8
    dartree bench --preset demo                 # AR + six methods on the bundled zoo, tables + plots
    dartree sweep --param budget --methods ddtree dartree-pruned
    dartree show-tree --method dartree-pruned --round 3
    dartree tune --method dartree-pruned        # adaptive budget for this machine (Appendix B)

Methods are ``ar`` or ``BUILDER[:KEY=VALUE,...]`` (see :mod:`dartree.eval.methods`); ``--budget``,
``--width``, ``--topk`` and ``--beta`` set those fields for every method that has them and does not
set them itself.  ``--model tiny-random`` runs any command on a toy model in seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["main", "build_parser", "PRESETS", "UsageError"]

DESCRIPTION = """Draft-tree speculative decoding: generate, benchmark, sweep, draw trees, tune the budget.

examples:
  dartree generate --prompt "def fib(n):" --method dartree-pruned:budget=32,width=8
  dartree bench --preset demo          # AR + six methods on the bundled zoo: tables, plots, lossless check
  dartree sweep --param budget --methods ddtree dartree-pruned
  dartree show-tree --method dartree-pruned --round 3
  dartree tune --method dartree-pruned # adaptive budget for this machine (Appendix B of the paper)

A method is 'ar' or BUILDER[:KEY=VALUE,...], e.g. dartree-pruned:budget=32,width=8,head=markov.
--budget/--width/--topk/--beta set those fields for every method that has them and does not set
them itself. --model tiny-random runs any command on a toy model in seconds.
"""
DEFAULT_MODEL = "pystdlib-tiny"          # dartree.models.zoo.DEFAULT_NAME (not imported: keeps --help fast)

PRESETS: dict[str, dict[str, Any]] = {
    # `make demo`: a few minutes on 2 CPU cores, greedy, the six methods of the issue plus the tuned budget.
    "demo": {
        "methods": ["chain", "ddtree", "corrected-chain", "dartree-fixed", "dartree-pruned",
                    "dartree-pruned:budget=auto,width=auto"],
        "datasets": ["humaneval", "stdlib"],
        "temperatures": [0.0],
        "num_prompts": 3,
        "max_new_tokens": 64,
        "budget": 16,
        "out": "runs/demo",
        # One thread: two threads on a 2-core machine that anything else is using oversubscribe
        # OpenMP and make every timing several times slower (measured: AR 8 ms -> 23 ms per token).
        "threads": 1,
    },
    # The full Table 1 grid of the paper on the zoo: both temperatures, three datasets, every builder.
    "paper": {
        "methods": ["chain", "ddtree", "corrected-chain", "corrected-chain-ddtree", "sequential-heap",
                    "dartree-fixed", "dartree-pruned", "dartree-pruned:budget=auto,width=auto"],
        "datasets": ["humaneval", "stdlib", "packages"],
        "temperatures": [0.0, 1.0],
        "num_prompts": 10,
        "max_new_tokens": 128,
        "budget": 16,
        "out": "runs/paper",
        "threads": 1,
    },
}
BENCH_DEFAULTS: dict[str, Any] = {
    "methods": ["chain", "ddtree", "corrected-chain", "dartree-fixed", "dartree-pruned"],
    "datasets": ["humaneval"],
    "temperatures": [0.0],
    "num_prompts": 4,
    "max_new_tokens": 64,
    "budget": None,
    "out": "runs/bench",
    "threads": None,
}


# ---------------------------------------------------------------------------------------------- errors
class UsageError(ValueError):
    """A mistake in the command line or in what it names (a file, a folder, a setting the model cannot take).

    :func:`main` prints it as one line, ``dartree: error: ...``, and exits with status 2.  Only errors
    raised here or by a check of the user's input (:func:`_user_input`) become a ``UsageError``; any
    other exception is a bug and keeps its traceback.
    """


@contextmanager
def _user_input() -> Iterator[None]:
    """Inside this block a ``ValueError`` is a check of the user's input failing: re-raise it as a UsageError."""
    try:
        yield
    except UsageError:
        raise
    except ValueError as e:
        raise UsageError(str(e)) from e


# ---------------------------------------------------------------------------------------------- parsing
def _budget(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return _positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 or 'auto', got {text!r}") from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _threads(text: str) -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    value = _positive_int(text)
    if value > cpus:      # more only oversubscribe; absurd counts crash OpenMP (100000 segfaults torch 2.13)
        raise argparse.ArgumentTypeError(f"expected an integer in 1..{cpus} (the CPUs this process may use), "
                                         f"got {text!r}")
    return value


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**63), got {text!r}") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**63), got {text!r}")
    return value


def _numbers(text: str) -> list[float]:
    """Comma-separated finite numbers, at least one; an empty item (``1,,2``) is an error, not skipped."""
    items = [x.strip() for x in text.split(",")]
    try:
        values = [float(x) for x in items]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated finite numbers, got {text!r}")
    return values


def _ints(text: str) -> list[int]:
    try:
        values = _numbers(text)
    except argparse.ArgumentTypeError:
        values = []
    if not values or any(v != int(v) or v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {text!r}")
    return [int(v) for v in values]


def _common() -> argparse.ArgumentParser:
    from dartree.eval.methods import BACKEND_CHOICES

    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("model and runtime")
    g.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"bundled zoo model, or 'tiny-random' (a toy for trying commands) (default {DEFAULT_MODEL})")
    g.add_argument("--backend", choices=BACKEND_CHOICES, default="auto",
                   help="tree builders: fast when registered (auto), or force ref / fast")
    g.add_argument("--threads", type=_threads, default=None, help="torch CPU threads (default: torch's)")
    g.add_argument("--seed", type=_seed, default=0, help="keyed-sampler seed for T > 0, in [0, 2**63) (default 0)")
    return p


def _out_args(p: argparse.ArgumentParser, default: Path | None, what: str) -> None:
    p.add_argument("--out", type=Path, default=default, help=f"output folder ({what}); must be empty or new"
                   + (f" (default {default})" if default is not None else ""))
    p.add_argument("--force", action="store_true",
                   help="replace the results of an earlier run in --out (its files are removed first)")


def _method_defaults(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tree settings applied to every method that has them (unless the method sets its own)")
    g.add_argument("--budget", type=_budget, default=None, help="draft nodes per tree, or 'auto' (tuned here)")
    g.add_argument("--width", type=_budget, default=None, help="dartree-pruned supertree width, or 'auto'")
    g.add_argument("--topk", type=_positive_int, default=None, help="candidates per depth")
    g.add_argument("--beta", type=float, default=None, help="dartree-pruned depth penalty (<= 0)")


def _prompt_args(p: argparse.ArgumentParser, dataset_default: str = "humaneval") -> None:
    from dartree.eval.datasets import DATASETS

    g = p.add_argument_group("prompts")
    g.add_argument("--dataset", choices=DATASETS, default=dataset_default, help="prompt set")
    g.add_argument("--num-prompts", type=_positive_int, default=2, help="prompts (default 2)")
    g.add_argument("--max-new-tokens", type=_positive_int, default=64, help="tokens per prompt (default 64)")
    g.add_argument("--temperature", type=_temperature, default=0.0, help="0 = greedy (default)")
    g.add_argument("--max-prompt-tokens", type=_positive_int, default=256, help="prompts keep their last N tokens")


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``dartree`` (exposed for tests and docs)."""
    from dartree.eval.datasets import DATASETS
    from dartree.eval.sweep import SWEEP_PARAMS

    common = _common()
    parser = argparse.ArgumentParser(prog="dartree", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    g = sub.add_parser("generate", parents=[common], help="prompt in, streamed text out, round statistics")
    g.add_argument("--prompt", help="the prompt text")
    g.add_argument("--prompt-file", type=Path, help="read the prompt from a file")
    g.add_argument("--method", default="dartree-pruned", help="ar or BUILDER[:KEY=VALUE,...] (default dartree-pruned)")
    g.add_argument("--max-new-tokens", type=_positive_int, default=128)
    g.add_argument("--temperature", type=_temperature, default=0.0)
    g.add_argument("--no-stream", action="store_true", help="print the text once at the end")
    g.add_argument("--no-stop", action="store_true", help="do not stop at the end-of-text token")
    _method_defaults(g)

    b = sub.add_parser("bench", parents=[common], help="methods x datasets x temperatures: tables, plots, lossless")
    b.add_argument("--preset", choices=sorted(PRESETS), help="a named configuration; other options override it")
    b.add_argument("--methods", nargs="+", metavar="METHOD", help="methods to compare with AR (ar always runs)")
    b.add_argument("--datasets", nargs="+", choices=DATASETS, help="prompt sets")
    b.add_argument("--temperatures", nargs="+", type=_temperature, help="e.g. 0 1")
    b.add_argument("--num-prompts", type=_positive_int, help="prompts per dataset")
    b.add_argument("--max-new-tokens", type=_positive_int, help="tokens per prompt")
    b.add_argument("--max-prompt-tokens", type=_positive_int, default=256)
    b.add_argument("--calibration-prompts", type=_positive_int, default=2, help="prompts used by budget=auto")
    b.add_argument("--tune-budgets", type=_ints, default=[4, 8, 16, 32, 64], help="budgets tried by auto")
    b.add_argument("--tune-widths", type=_ints, default=[4, 8, 16], help="widths tried by auto")
    b.add_argument("--stop-at-eos", action="store_true", help="stop a prompt at the end-of-text token")
    b.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up generation")
    b.add_argument("--strict", action=argparse.BooleanOptionalAction, default=True,
                   help="exit with status 1 if any output differs from AR's (default); --no-strict still "
                        "reports the failure but exits 0")
    _out_args(b, None, "results.md, results.json, plots; default runs/bench or the preset's")
    _method_defaults(b)

    s = sub.add_parser("sweep", parents=[common], help="width / budget / beta / top-K sweeps: table + plot")
    s.add_argument("--param", choices=SWEEP_PARAMS, required=True)
    s.add_argument("--values", type=_numbers, help="comma-separated values (default: a standard grid)")
    s.add_argument("--methods", nargs="+", metavar="METHOD", help="builders that have the setting")
    _out_args(s, Path("runs/sweep"), "table, json, plot")
    _prompt_args(s)
    _method_defaults(s)

    t = sub.add_parser("show-tree", parents=[common], help="render one round's tree (PNG) and depth distributions")
    t.add_argument("--method", default="dartree-pruned", help="the method whose tree is drawn")
    t.add_argument("--prompt", help="prompt text (default: the first prompt of --dataset)")
    t.add_argument("--round", type=_positive_int, default=1, help="which round to draw (1-based, default 1)")
    t.add_argument("--depth-methods", nargs="+", metavar="METHOD",
                   default=["ddtree", "dartree-fixed", "dartree-pruned"], help="methods of the depth plot")
    _out_args(t, Path("runs/show-tree"), "tree and depth plots")
    _prompt_args(t)
    _method_defaults(t)

    u = sub.add_parser("tune", parents=[common], help="adaptive budget: measure this machine, pick B and W")
    u.add_argument("--method", default="dartree-pruned", help="a builder with a budget")
    u.add_argument("--budgets", type=_ints, default=[4, 8, 16, 32, 64])
    u.add_argument("--widths", type=_ints, default=[4, 8, 16])
    _out_args(u, Path("runs/tune"), "table, json, plot")
    _prompt_args(u)
    _method_defaults(u)
    return parser


# ---------------------------------------------------------------------------------------------- helpers
def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _defaults(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k) for k in ("budget", "width", "topk", "beta") if getattr(args, k, None) is not None}


def _load(args: argparse.Namespace):
    import torch

    from dartree.eval.bundles import load_bundle

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    with _user_input():              # an unknown --model, unreadable weights: named in one line
        bundle = load_bundle(args.model)
    _log(f"model {bundle.name} loaded in {time.perf_counter() - start:.1f} s")
    return bundle


def _out_dir(args: argparse.Namespace, out: Path) -> None:
    """Check --out before any model loads (item: never lose a run, never fail after the work is done)."""
    from dartree.eval.outdir import check_out_dir

    with _user_input():
        earlier = check_out_dir(out, args.force)
    if earlier:
        _log(f"--force: the earlier run's {len(earlier)} files in {out} are replaced when this run's are written")


def _clear_out_dir(out: Path) -> None:
    """Remove the earlier run's files (--force) just before this run's are written: no stale file stays."""
    from dartree.eval.outdir import clear_earlier_run

    clear_earlier_run(out)
    out.mkdir(parents=True, exist_ok=True)


def _prompt_ids(bundle, text: str, limit: int) -> list[int]:
    from dartree.eval.bundles import encode

    ids = encode(bundle.tokenizer, text)[-limit:]
    if not ids:
        raise UsageError("prompt: the prompt encodes to no tokens; give a non-empty prompt")
    return ids


def _dataset_prompts(args: argparse.Namespace):
    """The prompts of --dataset (checked before the model loads: the dataset has enough of them)."""
    from dartree.eval.datasets import load_prompts

    with _user_input():
        return load_prompts(args.dataset, args.num_prompts)


def _refs(bundle, args: argparse.Namespace, texts: Sequence[str]):
    """AR references of ``texts`` (the positions they need are checked first)."""
    from dartree.eval.checks import check_positions
    from dartree.eval.simulate import reference

    ids = [_prompt_ids(bundle, t, args.max_prompt_tokens) for t in texts]
    with _user_input():
        check_positions(bundle, map(len, ids), args.max_new_tokens, "--max-prompt-tokens")
    return [reference(bundle, x, args.max_new_tokens, args.temperature, args.seed) for x in ids]


def _check_fit(bundle, methods, topk_values: Sequence[int] = ()) -> None:
    from dartree.eval.checks import check_methods_fit

    with _user_input():
        check_methods_fit(bundle, methods, topk_values)


def _round_summary(result) -> str:
    rounds = result.rounds
    if not rounds:
        return "no rounds"
    n = len(rounds)
    stages = result.stage_seconds()
    per = {k: 1000 * v / n for k, v in stages.items() if k != "prefill"}
    total = sum(per.values())
    tokens = result.tokens.shape[1]
    hist: dict[int, int] = {}
    for r in rounds:
        hist[r.accepted_length] = hist.get(r.accepted_length, 0) + 1
    lines = [f"{tokens} tokens in {n} rounds: tau {result.tau:.2f} tokens/round, mean tree size "
             f"{sum(r.tree_size for r in rounds) / n:.1f}, prefill {1000 * result.prefill_s:.1f} ms",
             "per round: " + ", ".join(f"{k} {v:.2f} ms" for k, v in per.items()) + f" = {total:.2f} ms "
             f"({tokens / max(1e-9, sum(stages.values()) - result.prefill_s):.1f} tokens/s)",
             "accepted length histogram: " + ", ".join(f"L={k}: {hist[k]}" for k in sorted(hist))]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- commands
def cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from dartree.decode import generate_ar
    from dartree.eval.bundles import decode, stop_token_id
    from dartree.eval.checks import check_positions, read_prompt_file
    from dartree.eval.methods import make_decoder, parse_method
    from dartree.eval.streaming import stream_generate
    from dartree.verify.sampling import KeyedSampler

    if (args.prompt is None) == (args.prompt_file is None):
        raise UsageError("generate: give exactly one of --prompt and --prompt-file")
    if args.budget == "auto" or args.width == "auto":
        raise UsageError("--budget/--width: 'auto' is for bench and tune; run `dartree tune` and pass the numbers")
    with _user_input():
        method = parse_method(args.method, _defaults(args))
        text = args.prompt if args.prompt is not None else read_prompt_file(args.prompt_file)
    if not text:
        raise UsageError(f"{'--prompt' if args.prompt is not None else '--prompt-file'}: the prompt is empty; "
                         "give at least one character")
    bundle = _load(args)
    _check_fit(bundle, [method])
    ids = torch.tensor([_prompt_ids(bundle, text, 1 << 30)], dtype=torch.int64)
    with _user_input():
        check_positions(bundle, [ids.shape[1]], args.max_new_tokens)
    stop = None if args.no_stop else stop_token_id(bundle)
    stops = None if stop is None else [stop]
    sampler = KeyedSampler(args.seed) if args.temperature > 0 else None
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
        result = generate_ar(bundle.target, ids, args.max_new_tokens, args.temperature, sampler, stops)
        show(result.tokens[0].tolist())
    else:
        decoder = make_decoder(bundle, method, args.backend)
        if args.no_stream:
            result = decoder.generate(ids, args.max_new_tokens, args.temperature, sampler, stops)
            show(result.tokens[0].tolist())
        else:
            result = stream_generate(decoder, ids, args.max_new_tokens, show, args.temperature, sampler, stops)
    seconds = time.perf_counter() - start
    show([], final=True)
    out.write("\n")
    _log(f"--- {method.label} ({bundle.name}), T={args.temperature:g}, stop: {result.stop_reason}, "
         f"{seconds:.2f} s wall")
    _log(_round_summary(result))
    return 0


def _bench_prompts(bundle, config) -> None:
    """Check what bench will decode against the model before it runs: heads, topk, positions."""
    from dartree.eval.bundles import encode
    from dartree.eval.checks import check_positions
    from dartree.eval.datasets import load_prompts

    _check_fit(bundle, config.methods)
    lengths = [min(len(encode(bundle.tokenizer, p.text)), config.max_prompt_tokens)
               for d in config.datasets for p in load_prompts(d, config.num_prompts, prompt_chars=config.prompt_chars)]
    with _user_input():
        check_positions(bundle, lengths, config.max_new_tokens, "--max-prompt-tokens")


def cmd_bench(args: argparse.Namespace) -> int:
    from dartree.eval.bench import BenchConfig, run_bench
    from dartree.eval.datasets import load_prompts
    from dartree.eval.methods import parse_methods
    from dartree.eval.plots import plot_acceptance, plot_tuning
    from dartree.eval.report import bench_markdown, write_bench

    preset = dict(BENCH_DEFAULTS if args.preset is None else PRESETS[args.preset])
    for key in ("methods", "datasets", "temperatures", "num_prompts", "max_new_tokens", "budget", "out"):
        if getattr(args, key) is not None:
            preset[key] = getattr(args, key)
    defaults = _defaults(args)
    if "budget" not in defaults and preset["budget"] is not None:
        defaults["budget"] = preset["budget"]
    with _user_input():
        methods = parse_methods([m for m in preset["methods"] if m != "ar"] or ["ar"], defaults)
        config = BenchConfig(
            methods=tuple(m for m in methods if not m.is_ar), datasets=tuple(dict.fromkeys(preset["datasets"])),
            temperatures=tuple(dict.fromkeys(float(t) for t in preset["temperatures"])),
            num_prompts=preset["num_prompts"], max_new_tokens=preset["max_new_tokens"],
            max_prompt_tokens=args.max_prompt_tokens, seed=args.seed, backend=args.backend,
            warmup=not args.no_warmup, stop_at_eos=args.stop_at_eos, calibration_prompts=args.calibration_prompts,
            tune_budgets=tuple(args.tune_budgets), tune_widths=tuple(args.tune_widths))
        for d in config.datasets:                       # enough prompts (and calibration prompts for auto)?
            load_prompts(d, config.num_prompts, prompt_chars=config.prompt_chars)
        if any(m.auto_fields for m in config.methods):
            load_prompts(config.datasets[0], config.calibration_prompts, offset=config.num_prompts,
                         prompt_chars=config.prompt_chars)
    out = Path(preset["out"])
    _out_dir(args, out)
    if args.threads is None:
        args.threads = preset["threads"]
    bundle = _load(args)
    _bench_prompts(bundle, config)
    argv = ["dartree", *sys.argv[1:]] if args.argv is None else ["dartree", *args.argv]
    start = time.perf_counter()
    result = run_bench(bundle, config, argv=argv, log=_log)
    _clear_out_dir(out)
    paths = write_bench(result, out)
    plot = plot_acceptance(result.summaries, out / "acceptance.png")
    tuning_plots = [plot_tuning(t, out / f"tuning_{t.builder}.png") for t in result.tuning]
    print(bench_markdown(result))
    _log(f"wrote {paths['markdown']}, {paths['json']}, {plot}" + "".join(f", {p}" for p in tuning_plots)
         + f" in {time.perf_counter() - start:.0f} s")
    if not result.lossless:
        bad = sum(not r.matches_ar for r in result.records)
        _log(f"LOSSLESS CHECK FAILED: {bad} of {len(result.records)} outputs differ from AR's (see the table's "
             "lossless column and the report's last line)"
             + ("" if args.strict else "; exit status 0 because of --no-strict"))
        return 1 if args.strict else 0
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from dartree.eval.methods import make_method_builder, parse_methods
    from dartree.eval.plots import plot_sweep
    from dartree.eval.sweep import DEFAULT_VALUES, check_sweep_values, run_sweep, sweep_table

    names = args.methods or (["dartree-pruned"] if args.param in ("width", "beta")
                             else ["ddtree", "dartree-fixed", "dartree-pruned"])
    values = args.values if args.values is not None else list(DEFAULT_VALUES[args.param])
    with _user_input():
        check_sweep_values(args.param, values)
        methods = parse_methods(names, _defaults(args))
        for m in methods:
            if m.is_ar or args.param not in m.fields():
                raise ValueError(f"methods: {m.label!r} has no setting {args.param!r}")
            if m.auto_fields:
                raise ValueError(f"methods: {m.label!r}: 'auto' settings cannot be swept; give numbers")
            for v in values:                            # every point's builder config is valid
                make_method_builder(m.with_settings(**{args.param: v if args.param == "beta" else int(v)}), "ref")
    prompts = _dataset_prompts(args)
    _out_dir(args, args.out)
    bundle = _load(args)
    _check_fit(bundle, methods, [int(v) for v in values] if args.param == "topk" else ())
    refs = _refs(bundle, args, [p.text for p in prompts])
    result = run_sweep(bundle, methods, args.param, values, refs, args.backend, progress=_log)
    _clear_out_dir(args.out)
    table = sweep_table(result)
    (args.out / f"sweep_{args.param}.md").write_text(
        f"# Sweep of {args.param} on {bundle.name}, {args.dataset}, T={args.temperature:g}\n\n{table}\n")
    (args.out / f"sweep_{args.param}.json").write_text(json.dumps(asdict(result), indent=1))
    plot = plot_sweep(args.param, result.series(), args.out / f"sweep_{args.param}.png")
    print(table)
    _log(f"wrote {args.out / f'sweep_{args.param}.md'}, {plot}")
    return 0


def cmd_show_tree(args: argparse.Namespace) -> int:
    from dartree.eval.bundles import decode
    from dartree.eval.methods import parse_method, parse_methods
    from dartree.eval.plots import plot_depth_distribution, plot_tree
    from dartree.eval.trees import depth_counts, recorded_rounds

    with _user_input():
        method = parse_method(args.method, _defaults(args))
        depth_methods = parse_methods(args.depth_methods, _defaults(args))
        for m in (method, *depth_methods):
            if m.is_ar:
                raise ValueError("method: 'ar' builds no tree; pick tree builders")
            if m.auto_fields:
                raise ValueError(f"method: {m.label!r}: give numbers instead of 'auto' to draw trees")
    if args.prompt is not None and not args.prompt:
        raise UsageError("--prompt: the prompt is empty; give at least one character")
    texts = [args.prompt] if args.prompt is not None else [p.text for p in _dataset_prompts(args)]
    _out_dir(args, args.out)
    bundle = _load(args)
    _check_fit(bundle, [method, *depth_methods])
    refs = _refs(bundle, args, texts)
    rounds = recorded_rounds(bundle, method, refs[0], args.backend)
    if args.round > len(rounds):
        raise UsageError(f"--round: the first prompt took {len(rounds)} rounds; pick 1..{len(rounds)}")
    r = rounds[args.round - 1]
    _clear_out_dir(args.out)
    safe = method.label.replace(":", "_").replace(",", "_").replace("=", "")
    tree_png = plot_tree(r.tree, r.accepted, lambda t: decode(bundle.tokenizer, [t]),
                         args.out / f"tree_{safe}_round{args.round}.png",
                         title=f"{method.label}, round {args.round}: {r.tree_size} draft nodes, "
                               f"{r.accepted_length} accepted (green), then the target's bonus token "
                               f"{decode(bundle.tokenizer, [r.bonus]) if r.bonus >= 0 else '(end)'!r}")
    print(r.tree.format(0, lambda t: repr(decode(bundle.tokenizer, [t]))))
    gamma = int(getattr(bundle.drafter, "gamma", 0)) or max(int(x.tree.depths.max()) for x in rounds)
    counts = {}
    for m in depth_methods:
        all_rounds = [x for ref in refs for x in recorded_rounds(bundle, m, ref, args.backend)]
        counts[m.label] = depth_counts(all_rounds, gamma)
    depth_png = plot_depth_distribution(counts, args.out / "depth_distribution.png")
    _log(f"wrote {tree_png}, {depth_png}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from dartree.eval.methods import parse_method
    from dartree.eval.plots import plot_tuning
    from dartree.eval.report import tuning_table
    from dartree.eval.tune import tune

    with _user_input():
        method = parse_method(args.method, _defaults(args))      # unset budget / width are searched
        if method.is_ar or "budget" not in method.fields():
            raise ValueError(f"method: {method.label!r} has no budget to tune")
    prompts = _dataset_prompts(args)
    _out_dir(args, args.out)
    bundle = _load(args)
    _check_fit(bundle, [method])
    refs = _refs(bundle, args, [p.text for p in prompts])
    result = tune(bundle, method, refs, args.backend, args.budgets, args.widths, progress=_log)
    _clear_out_dir(args.out)
    table = tuning_table(result)
    (args.out / f"tune_{method.builder}.md").write_text(f"# Adaptive budget for {method.label} on {bundle.name}\n\n"
                                                        f"{table}\n")
    (args.out / f"tune_{method.builder}.json").write_text(json.dumps(asdict(result), indent=1))
    plot = plot_tuning(result, args.out / f"tune_{method.builder}.png")
    print(table)
    chosen = " ".join(f"--{k} {v}" for k, v in result.settings().items())
    print(f"\nchosen: {chosen}  (expected {result.best.tokens_per_s:.1f} tokens/s, "
          f"{result.best.tokens_per_s / result.ar_tokens_per_s:.2f}x AR)")
    _log(f"wrote {args.out / f'tune_{method.builder}.md'}, {plot}")
    return 0


COMMANDS = {"generate": cmd_generate, "bench": cmd_bench, "sweep": cmd_sweep, "show-tree": cmd_show_tree,
            "tune": cmd_tune}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dartree`` console script; returns the exit status.

    A user error (bad option, file, folder or setting) exits with status 2 and one line on stderr,
    ``dartree: error: ...`` (argparse's own errors add the usage line); any other exception is a bug
    and propagates with its traceback.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else None
    import torch

    try:
        with torch.no_grad():          # inference only: no autograd graph through heads or drafters
            return COMMANDS[args.command](args)
    except UsageError as e:
        print(f"dartree: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print("dartree: interrupted", file=sys.stderr, flush=True)
        raise SystemExit(130) from None


if __name__ == "__main__":
    sys.exit(main())
