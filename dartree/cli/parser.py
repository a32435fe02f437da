"""The argument parser of ``dartree``: options of every command, their types (which reject a bad value while
parsing), the bench presets."""

from __future__ import annotations

import argparse
import math
import os
import re
from pathlib import Path
from typing import Any

__all__ = ["DESCRIPTION", "DEFAULT_MODEL", "PRESETS", "BENCH_DEFAULTS", "build_parser", "join_negative_values",
           "methods_for"]

DESCRIPTION = """Draft-tree speculative decoding: generate, benchmark, sweep, draw trees, tune the budget.

examples:
  dartree generate --prompt "def fib(n):" --method dartree-pruned:budget=32,width=8
  dartree bench --preset demo          # AR + six methods on the bundled zoo: tables, plots, lossless check
  dartree sweep --param budget --methods ddtree dartree-pruned
  dartree show-tree --method dartree-pruned --round 3
  dartree tune --method dartree-pruned # adaptive budget for this machine (Appendix B of the paper)
  dartree tune --method auto --temperature 1   # the builder, budget and verifier that pay here at T=1

A method is 'ar', 'auto' or BUILDER[:KEY=VALUE,...], e.g. dartree-pruned:budget=32,width=8,head=markov.
--budget/--width/--topk/--beta set those fields for every method that has them and does not set
them itself. --model tiny-random runs any command on a toy model in seconds.
"""
#: dartree.eval.sweep.SWEEP_PARAMS and dartree.eval.methods.BACKEND_CHOICES (not imported: those modules pull in
#: torch and --help must not; tests/test_cli checks they agree)
SWEEP_PARAMS: tuple[str, ...] = ("width", "budget", "beta", "topk")
BACKEND_CHOICES: tuple[str, ...] = ("auto", "ref", "fast")
DEFAULT_MODEL = "pystdlib-tiny"          # dartree.models.zoo.DEFAULT_NAME (not imported: keeps --help fast)

#: ``sampled_methods``: the methods when every temperature of the run is above 0 (and --methods is not given);
#: with T=0 in the run too they are added to ``methods`` (:func:`methods_for`).
PRESETS: dict[str, dict[str, Any]] = {
    # `make demo`: a few minutes on 2 CPU cores, greedy, the six methods of the issue plus the tuned budget.
    "demo": {
        "methods": ["chain", "ddtree", "corrected-chain", "dartree-fixed", "dartree-pruned",
                    "dartree-pruned:budget=auto,width=auto,beta=auto"],
        # --temperatures above 0 (and no --methods): the methods that pay there.  corrected-sequoia at the table's
        # budget (the most tokens a round) and at B=3 (the fastest on one CPU thread: a forward of 4 nodes costs
        # less than of 5, 3 or 2; docs/results.md); `auto` searches dartree-pruned too, so the T=0 list's tuned
        # dartree-pruned is left out (a second tuning would double the run)
        "sampled_methods": ["chain", "ddtree", "corrected-chain", "dartree-fixed", "dartree-pruned",
                            "corrected-sequoia", "corrected-sequoia:budget=3", "auto"],
        "datasets": ["humaneval", "stdlib"],
        "temperatures": [0.0],
        # 8 evaluation + 16 calibration prompts a dataset: tau varies several-fold from prompt to prompt on the
        # zoo, and fewer moved the tuner's forecast far from the evaluation (docs/results.md, "Measurements
        # behind design choices in the code"; benchmarks/forecast_proxies.py).
        "num_prompts": 8,
        "calibration_prompts": 16,
        "max_new_tokens": 64,
        "budget": 16,
        "out": "runs/demo",
        # HF `generate` beside dartree's AR: the baseline every HF user has (dartree's AR is faster)
        "peers": ["hf-generate"],
        # One thread: two on a busy 2-core machine oversubscribe OpenMP (docs/results.md, "Measurements
        # behind design choices in the code").
        "threads": 1,
    },
    # The full Table 1 grid of the paper on the zoo: both temperatures, three datasets, every builder.
    "paper": {
        "methods": ["chain", "ddtree", "corrected-chain", "corrected-chain-ddtree", "sequential-heap",
                    "dartree-fixed", "dartree-pruned", "dartree-pruned:budget=auto,width=auto"],
        # added to the methods because the grid has T=1 (they run at T=0 too)
        "sampled_methods": ["corrected-sequoia:budget=4", "auto"],
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
    "sampled_methods": ["chain", "ddtree", "corrected-chain", "dartree-fixed", "dartree-pruned",
                        "corrected-sequoia:budget=4"],
    "datasets": ["humaneval"],
    "temperatures": [0.0],
    "num_prompts": 4,
    "max_new_tokens": 64,
    "budget": None,
    "out": "runs/bench",
    "threads": None,
}


def methods_for(preset: dict[str, Any], temperatures: list[float]) -> list[str]:
    """The preset's methods at these temperatures: ``sampled_methods`` when all are above 0, both lists (in order,
    once each) when some are, ``methods`` at T=0 only."""
    sampled = preset.get("sampled_methods")
    if not sampled or not any(t > 0 for t in temperatures):
        return list(preset["methods"])
    if all(t > 0 for t in temperatures):
        return list(sampled)
    return list(dict.fromkeys([*preset["methods"], *sampled]))


# ---------------------------------------------------------------------------------------------- parsing
def _number(cast, ok, expected: str):
    """An argparse type: ``cast(text)`` if it parses and ``ok`` accepts it, else an error saying what was
    ``expected`` (a float comes back with -0 as 0.0)."""
    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value + 0.0 if cast is float else value

    return parse


_budget = _number(lambda t: t if t == "auto" else int(t), lambda v: v == "auto" or v >= 1, "an integer >= 1 or 'auto'")
_positive_int = _number(int, lambda v: v >= 1, "an integer >= 1")
_count = _number(int, lambda v: v >= 0, "an integer >= 0")
_beta = _number(float, lambda v: -math.inf < v <= 0, "a finite number <= 0 (a depth penalty)")
_proposal_temperature = _number(float, lambda v: 0 < v < math.inf,
                                "a finite number > 0 (the proposal's temperature over the run's)")
_seed = _number(int, lambda v: 0 <= v < 2**63, "an integer in [0, 2**63)")


def _fraction(name: str, note: str = ""):
    return _number(float, lambda v: 0 <= v <= 1, f"a number with 0 <= {name} <= 1{note}")


def _threads(text: str) -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    value = _positive_int(text)
    if value > cpus:      # more only oversubscribe; absurd counts crash OpenMP (100000 segfaults torch 2.13)
        raise argparse.ArgumentTypeError(f"expected an integer in 1..{cpus} (the CPUs this process may use), "
                                         f"got {text!r}")
    return value


def _temperature(text: str) -> float:
    from dartree.verify.sampling import MAX_TEMPERATURE, MIN_TEMPERATURE

    return _number(float, lambda v: v == 0 or MIN_TEMPERATURE <= v <= MAX_TEMPERATURE,
                   f"0 (greedy) or a finite number >= {MIN_TEMPERATURE:g} and <= {MAX_TEMPERATURE:g}")(text)


def _sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling at T>0 (HF generate's warpers, for AR and every method alike)")
    g.add_argument("--top-k", type=_positive_int, default=None, help="keep the k most likely tokens")
    g.add_argument("--top-p", type=_fraction("top-p", " (0: the top token)"), default=None,
                   help="keep the smallest set of mass >= top-p (nucleus)")
    g.add_argument("--min-p", type=_fraction("min-p"), default=None,
                   help="drop tokens below min-p x the top probability")
    # dartree.rounds.VERIFIERS (not imported: keeps --help fast; tests/test_cli checks they agree)
    g.add_argument("--verifier", choices=("match", "rejection", "traversal"), default=None,
                   help="how trees are verified at T>0: 'traversal' (sampled trees, Traversal Verification: leaf to "
                        "root, lossless in distribution; the default, bench included, which then tests the tokens "
                        "against the target's law), 'rejection' (the same trees, recursive rejection sampling: "
                        "lossless in distribution) or 'match' (target-sample matching: with the seed, equal token for "
                        "token to AR drawn keyed, which bench checks; generate --method ar draws keyed only under "
                        "match); a method's own verifier=... wins")


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


def _folder(text: str) -> Path:
    if not text.strip():        # Path("") is the current folder: an empty --out is a slip, not a choice
        raise argparse.ArgumentTypeError("expected a folder path, got an empty string (use . for this folder)")
    return Path(text)


def _device(text: str) -> str:
    if not re.fullmatch(r"cpu|cuda(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    return text


def _common() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("model and runtime")
    g.add_argument("--model", default=None,
                   help=f"bundled zoo model, or 'tiny-random' (a toy for trying commands) (default {DEFAULT_MODEL}); "
                        "not with --target/--drafter")
    g.add_argument("--target", type=_folder, default=None, metavar="DIR",
                   help="a local HF causal-LM directory (config.json + safetensors) to use instead of --model; "
                        "needs --drafter (see docs/checkpoints.md)")
    g.add_argument("--drafter", type=_folder, default=None, metavar="DIR",
                   help="a local DFlash / Domino / DSpark drafter directory for --target; its head (if any) is "
                        "the method's head=gru|markov")
    g.add_argument("--tokenizer", type=_folder, default=None, metavar="PATH",
                   help="tokenizer.json file or tokenizer directory for --target (default: the --target directory)")
    g.add_argument("--device", type=_device, default="cpu",
                   help="where the models run: cpu (default), cuda or cuda:N (fp32; the fast builders use the "
                        "Triton kernels on CUDA)")
    g.add_argument("--backend", choices=BACKEND_CHOICES, default="auto",
                   help="tree builders: fast when registered (auto), or force ref / fast")
    g.add_argument("--threads", type=_threads, default=None, help="torch CPU threads (default: torch's)")
    g.add_argument("--seed", type=_seed, default=0, help="seed of the T > 0 draws (keyed for match, a generator's for "
                   "traversal and rejection, and for AR unless the run matches), in [0, 2**63) (default 0)")
    g.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="import MODULE first (repeatable): it registers builders (dartree.builders.register_builder) "
                        "that --method / --methods then name; installed packages' 'dartree.plugins' entry points "
                        "load always")
    return p


def _out_args(p: argparse.ArgumentParser, default: Path | None, what: str) -> None:
    p.add_argument("--out", type=_folder, default=default,
                   help=f"output folder ({what}); must hold no earlier run of this command; one run writes a "
                        "folder at a time" + (f" (default {default})" if default is not None else ""))
    p.add_argument("--force", action="store_true",
                   help="replace the results of an earlier run in --out (in one step, once this run's files "
                        "are all written)")


def _method_defaults(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tree settings applied to every method that has them (unless the method sets its own)")
    g.add_argument("--budget", type=_budget, default=None, help="draft nodes per tree, or 'auto' (tuned here)")
    g.add_argument("--width", type=_budget, default=None, help="dartree-pruned supertree width, or 'auto'")
    g.add_argument("--topk", type=_positive_int, default=None, help="candidates per depth")
    g.add_argument("--beta", type=_beta, default=None, help="dartree-pruned depth penalty (<= 0)")
    g.add_argument("--proposal-temperature", type=_proposal_temperature, default=None, metavar="RATIO",
                   help="(corrected-)sequoia at T > 0: draw the tree's tokens at the run's temperature times RATIO "
                        "(> 0; default 1)")


def _prompt_args(p: argparse.ArgumentParser) -> None:
    from dartree.eval.datasets import DATASETS

    g = p.add_argument_group("prompts")
    g.add_argument("--dataset", choices=DATASETS, default="humaneval", help="prompt set")
    g.add_argument("--num-prompts", type=_positive_int, default=2, help="prompts (default 2)")
    g.add_argument("--max-new-tokens", type=_positive_int, default=64, help="tokens per prompt (default 64)")
    g.add_argument("--temperature", type=_temperature, default=0.0, help="0 = greedy (default)")
    g.add_argument("--max-prompt-tokens", type=_positive_int, default=256, help="prompts keep their last N tokens")


#: Options whose value may start with '-' (a negative number or a list of them: ``--values -0.1,-0.2``).
NEGATIVE_VALUE_OPTIONS: tuple[str, ...] = ("--values", "--beta", "--temperature")
_NUMBERS = re.compile(r"-\.?\d[\w.+-]*(,[\w.+-]*)*")


def join_negative_values(argv: list[str]) -> list[str]:
    """``--values -0.1,-0.2`` -> ``--values=-0.1,-0.2``: argparse takes a value starting with '-' for an option
    unless it is a single plain number, so the documented form of negative sweep values would not parse."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--":
            return out + argv[i:]
        if argv[i] in NEGATIVE_VALUE_OPTIONS and i + 1 < len(argv) and _NUMBERS.fullmatch(argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``dartree`` (exposed for tests and docs)."""
    from dartree.eval.datasets import DATASETS

    common = _common()
    parser = argparse.ArgumentParser(prog="dartree", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    g = sub.add_parser("generate", parents=[common], help="prompt in, streamed text out, round statistics")
    g.add_argument("--prompt", help="the prompt text")
    g.add_argument("--prompt-file", type=Path, help="read the prompt from a file")
    g.add_argument("--method", default="dartree-pruned",
                   help="ar, auto (the method `dartree tune --method auto` or a bench cached for this machine) or "
                        "BUILDER[:KEY=VALUE,...] (default dartree-pruned)")
    g.add_argument("--max-new-tokens", type=_positive_int, default=128)
    g.add_argument("--temperature", type=_temperature, default=0.0)
    g.add_argument("--no-stream", action="store_true", help="print the text once at the end")
    g.add_argument("--no-stop", action="store_true", help="do not stop at the end-of-text token")
    _method_defaults(g)
    _sampling_args(g)

    b = sub.add_parser("bench", parents=[common], help="methods x datasets x temperatures: tables, plots, lossless")
    b.add_argument("--preset", choices=sorted(PRESETS), help="a named configuration; other options override it")
    b.add_argument("--methods", nargs="+", metavar="METHOD", help="methods to compare with AR (ar always runs)")
    b.add_argument("--datasets", nargs="+", choices=DATASETS, help="prompt sets")
    b.add_argument("--temperatures", nargs="+", type=_temperature, help="e.g. 0 1")
    b.add_argument("--num-prompts", type=_positive_int, help="prompts per dataset")
    b.add_argument("--max-new-tokens", type=_positive_int, help="tokens per prompt")
    b.add_argument("--max-prompt-tokens", type=_positive_int, default=256)
    b.add_argument("--calibration-prompts", type=_positive_int,
                   help="prompts of every dataset (after the evaluation prompts) on which budget=auto is tuned, "
                        "at each temperature (default: the preset's, else 4)")
    b.add_argument("--tune-budgets", type=_ints, default=[3, 4, 8, 16, 32, 64], help="budgets tried by auto")
    # dartree.eval.tune.DEFAULT_WIDTHS (not imported: keeps --help fast; tests/test_cli checks they agree)
    b.add_argument("--tune-widths", type=_ints, default=[4, 8, 12, 16], help="widths tried by auto")
    b.add_argument("--law-draws", type=_count, default=8,
                   help="extra one-round decodes per prompt whose first verified token the distribution check of "
                        "rejection rows tests too (untimed; 0: only the run's own tokens; default 8)")
    b.add_argument("--stop-at-eos", action="store_true", help="stop a prompt at the end-of-text token")
    b.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up generation")
    b.add_argument("--strict", action=argparse.BooleanOptionalAction, default=True,
                   help="exit with status 1 if any output differs from AR's (default); --no-strict still "
                        "reports the failure but exits 0")
    b.add_argument("--peers", nargs="*", metavar="PEER", default=None,
                   help="also time the peers' own loops on the same prompts, side by side: hf-generate, "
                        "hf-prompt-lookup (at T>0 they sample with HF's sampler and the run's warpers: timed, not "
                        "compared), dflash (T=0 only; z-lab's package: pip install --no-deps dflash==0.1.0); "
                        "--peers alone: all three")
    b.add_argument("--concurrency", nargs="+", type=_positive_int, metavar="C",
                   help="serve the prompts with C requests in flight instead (e.g. 1 2 4 8): aggregate tokens/s "
                        "and speedup over batched AR at each C; first dataset and temperature only")
    _out_args(b, None, "results.md, results.json, plots; default runs/bench or the preset's")
    _method_defaults(b)
    _sampling_args(b)

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

    u = sub.add_parser("tune", parents=[common], help="adaptive budget: measure this machine, pick B and W "
                                                      "(--method auto: the builder and verifier too)")
    u.add_argument("--method", default="dartree-pruned",
                   help="a builder with a budget, or 'auto' (builders x budgets x verifiers, measured here)")
    u.add_argument("--budgets", type=_ints, default=[3, 4, 8, 16, 32, 64])    # as --tune-budgets
    u.add_argument("--widths", type=_ints, default=[4, 8, 12, 16])         # as --tune-widths
    _out_args(u, Path("runs/tune"), "table, json, plot")
    _prompt_args(u)
    _method_defaults(u)
    _sampling_args(u)
    return parser
