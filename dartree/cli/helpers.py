"""What the commands share: user errors (one line, exit status 2), loading the model, the output folder, prompts
and references, checks."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["UsageError", "user_input", "log", "file_stem", "setting_defaults", "warps_of", "bench_preset", "load",
           "prepare_out", "written", "write_named", "prompt_ids", "dataset_prompts", "references", "check_fit",
           "check_grid", "round_summary"]


class UsageError(ValueError):
    """A mistake in the command line or in what it names, printed as one line (exit status 2).  Only errors raised
    here or by a check of the user's input (:func:`user_input`) become one: any other exception is a bug."""


@contextmanager
def user_input() -> Iterator[None]:
    """Inside this block a ``ValueError`` is a check of the user's input failing: re-raise it as a UsageError."""
    try:
        yield
    except UsageError:
        raise
    except ValueError as e:
        raise UsageError(str(e)) from e


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def file_stem(label: str) -> str:
    """A method's label as part of a file name."""
    return label.replace(":", "_").replace(",", "_").replace("=", "")


def setting_defaults(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k) for k in ("budget", "width", "topk", "beta", "proposal_temperature")
            if getattr(args, k, None) is not None}


def warps_of(args: argparse.Namespace) -> dict[str, Any]:
    """The target-side warpers of the command line."""
    return {"top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p}


def bench_preset(args: argparse.Namespace, keys: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``bench``'s preset (or defaults) with the options of ``keys`` given on the command line, and the
    setting defaults (the preset's budget unless --budget); sets --threads to the preset's when unset."""
    from dartree.cli.parser import BENCH_DEFAULTS, PRESETS

    preset = dict(BENCH_DEFAULTS if args.preset is None else PRESETS[args.preset])
    preset.update({key: getattr(args, key) for key in keys if getattr(args, key) is not None})
    defaults = setting_defaults(args)
    if "budget" not in defaults and preset["budget"] is not None:
        defaults["budget"] = preset["budget"]
    if args.threads is None:
        args.threads = preset["threads"]
    return preset, defaults


def load(args: argparse.Namespace):
    import torch

    from dartree.cli.parser import DEFAULT_MODEL
    from dartree.eval.bundles import load_bundle, local_bundle

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    device, target, drafter = args.device, args.target, args.drafter
    if device.startswith("cuda"):
        index = int(device.split(":")[1]) if ":" in device else 0
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise UsageError(f"--device: {device} is not available here (torch sees {torch.cuda.device_count()} "
                             "CUDA devices); use --device cpu")
    if (target is None) != (drafter is None):
        raise UsageError("--target and --drafter: give both (a local target and its drafter) or neither")
    if target is None and args.tokenizer is not None:
        raise UsageError("--tokenizer: only used with --target and --drafter")
    if target is not None and args.model is not None:
        raise UsageError(f"--model {args.model} and --target/--drafter: give one of them (a bundled model, or local "
                         "checkpoint directories)")
    with user_input():              # an unknown --model, unreadable weights: named in one line
        if target is None:
            bundle = load_bundle(args.model or DEFAULT_MODEL)
        else:
            try:
                bundle = local_bundle(target, drafter, args.tokenizer)
            except (OSError, RuntimeError) as e:   # unreadable files; weights that disagree with their config
                reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise UsageError(f"--target {target} / --drafter {drafter}: cannot load the checkpoints: "
                                 f"{reason}") from e
    if device != "cpu":
        bundle.to(device)
    log(f"model {bundle.name} loaded in {time.perf_counter() - start:.1f} s" + ("" if device == "cpu" else
                                                                               f" (on {device})"))
    return bundle


def prepare_out(args: argparse.Namespace, out: Path, kind: Sequence[str]):
    """Open --out before any model loads (:func:`dartree.eval.outdir.open_run`); returns the
    :class:`~dartree.eval.outdir.RunFolder` (a context manager) the command writes through."""
    from dartree.eval.outdir import open_run

    with user_input():
        run = open_run(out, kind, args.force)
    try:          # the caller's `with` has not begun: anything raised here (Ctrl-C, a closed stderr) closes it
        if run.restored:
            log(f"{out}: an interrupted commit was rolled back; the earlier run's {', '.join(run.restored)} restored")
        earlier = run.earlier()
        if earlier:
            log(f"--force: {len(earlier)} files of an earlier run in {out} are replaced once this run's are complete")
    except BaseException:
        run.close()
        raise
    return run


@contextmanager
def written(run) -> Iterator[None]:
    """Write the run's files inside this block; on leaving it they replace the earlier run together
    (:meth:`~dartree.eval.outdir.RunFolder.commit`).  A write error (disk full) is one line: nothing was
    replaced."""
    try:
        yield
        with user_input():
            run.commit()
    except OSError as e:
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        raise UsageError(f"--out: cannot write the results to {run.out}: {where}{e.strerror or e}; nothing in "
                         f"{run.out} was replaced") from e


def write_named(run, stem: str, markdown: str, data: Any, plot) -> None:
    """Stage the files of :func:`dartree.eval.outdir.named_files`: ``markdown``, ``data`` as JSON and the plot
    ``plot(path)`` draws."""
    run.write(f"{stem}.md", markdown)
    run.write(f"{stem}.json", json.dumps(data, indent=1))
    plot(run.path(f"{stem}.png"))


def prompt_ids(bundle, text: str, limit: int) -> list[int]:
    from dartree.eval.bundles import encode

    ids = encode(bundle.tokenizer, text)[-limit:]
    if not ids:
        raise UsageError("prompt: the prompt encodes to no tokens; give a non-empty prompt")
    return ids


def dataset_prompts(args: argparse.Namespace):
    """The prompts of --dataset (checked before the model loads: the dataset has enough of them)."""
    from dartree.eval.datasets import load_prompts

    with user_input():
        return load_prompts(args.dataset, args.num_prompts)


def references(bundle, args: argparse.Namespace, texts: Sequence[str], warps: dict | None = None):
    """AR references of ``texts`` (the positions they need are checked first; at T>0 drawn under ``warps``)."""
    from dartree.eval.checks import check_positions
    from dartree.eval.simulate import reference

    ids = [prompt_ids(bundle, t, args.max_prompt_tokens) for t in texts]
    with user_input():
        check_positions(bundle, map(len, ids), args.max_new_tokens, "--max-prompt-tokens")
    at = {k: v for k, v in (warps or {}).items() if v is not None} if args.temperature > 0 else {}
    return [reference(bundle, x, args.max_new_tokens, args.temperature, args.seed, warps=at) for x in ids]


def check_grid(method, budgets: Sequence[int], widths: Sequence[int], budget_option: str, width_option: str,
               fields: Sequence[str] | None = None) -> None:
    """Every setting a tuner would try for ``method`` (its ``fields``, default its ``auto`` ones) is a valid
    builder config: checked before any model loads, named by the option that gave it."""
    from itertools import product

    from dartree.eval.methods import make_method_builder
    from dartree.eval.tune import DEFAULT_BETAS

    grid = {"budget": budgets, "width": widths, "beta": DEFAULT_BETAS}
    if method.is_auto:              # every builder auto searches, at every budget
        from dartree.eval.tune import AUTO_BUILDERS

        for name in AUTO_BUILDERS:
            check_grid(method.member(name, {"budget": "auto"}), budgets, widths, budget_option, width_option,
                       ("budget",))
        return
    auto = tuple(method.auto_fields if fields is None else fields)
    for values in product(*(grid[k] for k in auto)):
        try:
            make_method_builder(method.with_settings(**dict(zip(auto, values, strict=True))), "ref")
        except ValueError as e:
            field = str(e).split(":")[0]
            option = {"budget": budget_option, "width": width_option}.get(field, f"{budget_option}/{width_option}")
            raise UsageError(f"{option}: {e}") from e


def check_fit(bundle, methods, topk_values: Sequence[int] = ()) -> None:
    from dartree.eval.checks import check_methods_fit

    with user_input():
        check_methods_fit(bundle, methods, topk_values)


def round_summary(result) -> str:
    rounds = result.rounds
    if not rounds:
        return "no rounds"
    n = len(rounds)
    stages = result.stage_seconds()
    per = {k: 1000 * v / n for k, v in stages.items() if k != "prefill"}
    total = sum(per.values())
    tokens = result.tokens.shape[1]
    hist = Counter(r.accepted_length for r in rounds)
    lines = [f"{tokens} tokens in {n} rounds: tau {result.tau:.2f} tokens/round, mean tree size "
             f"{sum(r.tree_size for r in rounds) / n:.1f}, prefill {1000 * result.prefill_s:.1f} ms",
             "per round: " + ", ".join(f"{k} {v:.2f} ms" for k, v in per.items()) + f" = {total:.2f} ms "
             f"({tokens / max(1e-9, sum(stages.values()) - result.prefill_s):.1f} tokens/s)",
             "accepted length histogram: " + ", ".join(f"L={k}: {hist[k]}" for k in sorted(hist))]
    return "\n".join(lines)
