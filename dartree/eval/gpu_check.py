"""``make gpu-check``: everything that needs a GPU, in one command, one report (docs/gpu-check.md: usage).

Each step of :data:`STEPS` (functions in :mod:`dartree.eval.gpu_steps`) runs in its own process with a time
budget; a step that fails, crashes or overruns is recorded and the next one runs.  ``report.md`` and
``report.json`` under ``--out`` are rewritten after every step.  Exit status 1 when a step failed or overran.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from dartree.eval import gpu_steps
from dartree.eval.gpu_steps import Check, Skip, md_table

__all__ = ["main", "STEPS", "Step", "Check", "Outcome", "Skip", "run_inline", "run_isolated",
           "REPORT_MD", "REPORT_JSON", "TOTAL_BUDGET_S", "CPU_BUDGET_SCALE", "render"]

REPORT_MD = "report.md"
REPORT_JSON = "report.json"
#: the whole run's wall-clock budget in seconds (full, quick): the lease gives 15 minutes, start included
TOTAL_BUDGET_S = {"full": 480.0, "quick": 240.0}
#: the budgets are an H200's; on the CPU (the rehearsal) every one is this many times longer
CPU_BUDGET_SCALE = 4.0
#: a step ends "passed", "partial", "skipped", "failed" or "timed out"; these two make the exit status 1
_BAD = ("failed", "timed out")
#: seconds kept back from a step's budget: the process starts (imports torch), writes its result
_GRACE_S = 8.0


@dataclass
class Outcome:
    """What a step produced: its status, its markdown, its numbers, its wall time."""

    status: str
    text: str
    seconds: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    """A step of the check: ``fn(check)`` returns markdown, or ``(markdown, numbers)``."""

    name: str
    title: str
    fn: Callable[[Check], Any]
    budget_s: float          # full run on an H200
    quick_budget_s: float    # --quick

    def budget(self, quick: bool) -> float:
        return self.quick_budget_s if quick else self.budget_s


#: the steps in order (budgets in seconds on an H200: full, quick)
STEPS: list[Step] = [
    Step("env", "Device and versions", gpu_steps.step_env, 20, 20),
    Step("tests", "Tests (kernels, every builder fast == ref, verification), kernel benchmarks",
         gpu_steps.step_tests, 170, 90),
    Step("lossless_zoo", "Lossless greedy on the zoo (fp32) vs HF generate; bf16 argmax divergence",
         gpu_steps.step_lossless_zoo, 40, 25),
    Step("lossless_random", "Lossless greedy on a random-weight ~1B model (fp32 exact, bf16 counted)",
         gpu_steps.step_lossless_random, 60, 35),
    Step("speed", "Speed on the zoo at T=0 and T=1 (the bench's tables)", gpu_steps.step_speed, 100, 45),
    Step("verify_cost", "Verify cost: tree forward of n nodes over one AR step (bf16)",
         gpu_steps.step_verify_cost, 60, 25),
    Step("graphs", "CUDA graphs for the tree forward at fixed sizes", gpu_steps.step_graphs, 35, 20),
]


# ------------------------------------------------------------------------------------------ running
def run_inline(step: Step, check: Check) -> Outcome:
    """Run ``step`` in this process; any exception is recorded (traceback), never raised."""
    start = time.monotonic()
    try:
        out = step.fn(check)
    except Skip as why:
        return Outcome("skipped", f"skipped: {why}", time.monotonic() - start)
    except (Exception, SystemExit):          # SystemExit: a CLI or pytest call refusing its arguments
        text = "\n\n".join(filter(None, ["\n".join(f"- {p}" for p in check.problems),
                                         f"```\n{traceback.format_exc()}```"]))
        return Outcome("failed", text, time.monotonic() - start)
    text, data = (out if isinstance(out, tuple) else (out, {}))
    status = "failed" if check.problems else "partial" if check.notes else "passed"
    extra = [f"**{p}**" for p in check.problems] + [f"_{n}_" for n in check.notes]
    text = "\n\n".join(filter(None, [text, "\n".join(f"- {e}" for e in extra)]))
    return Outcome(status, text, time.monotonic() - start, dict(data))


def run_isolated(step: Step, options: list[str], timeout: float,
                 command: Callable[[str, list[str], Path, float], list[str]] | None = None) -> Outcome:
    """Run ``step`` in a child process (the same options) killed after ``timeout`` seconds.

    The child's output is echoed with a prefix; its last lines go in the report when it crashes or
    overruns.  ``command(step name, options, result file, time limit)`` builds the child's command line (tests
    replace it); the child keeps what it has done in the result file's name + ``.partial.md``.
    """
    start = time.monotonic()
    tail: collections.deque[str] = collections.deque(maxlen=40)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(gpu_steps.ROOT), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        result, limit = Path(tmp) / "result.json", max(1.0, timeout - _GRACE_S)
        cmd = (command(step.name, options, result, limit) if command else
               [sys.executable, "-m", "dartree.eval.gpu_check", *options, "--child", step.name, "--result", str(result),
                "--time-limit", f"{limit:.1f}"])
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                env=env, start_new_session=True)

        def echo() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                tail.append(line.rstrip("\n"))
                print(f"  [{step.name}] {line}", end="", flush=True)

        reader = threading.Thread(target=echo, daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):   # the child and anything it started (pytest, compilers)
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        reader.join(timeout=5)
        seconds = time.monotonic() - start
        last = "\n".join(tail)
        if timed_out:
            done = Path(f"{result}.partial.md")
            kept = f"What it had finished:\n\n{done.read_text()}\n\n" if done.is_file() else ""
            return Outcome("timed out", f"stopped after {timeout:.0f} s (its budget).  {kept}The last lines it "
                                        f"printed:\n\n```\n{last}\n```", seconds)
        if not result.is_file():
            return Outcome("failed", f"the step's process exited with status {proc.returncode} and no result "
                                     f"(a crash); the last lines it printed:\n\n```\n{last}\n```", seconds)
        got = json.loads(result.read_text())
        return Outcome(got["status"], got["text"], seconds, got.get("data", {}))


# ------------------------------------------------------------------------------------------ report
def render(meta: dict[str, Any], done: list[tuple[Step, Outcome, float]]) -> tuple[str, str]:
    """The report as markdown and as json, from what has run so far."""
    head = (f"# GPU check ({meta['date_utc']})\n\n"
            f"`{meta['command']}`: device `{meta['device']}`, {meta['mode']} run, total budget "
            f"{meta['budget_s']:.0f} s (step budgets x{meta['budget_scale']:g}), {meta['elapsed_s']:.0f} s so far; "
            f"python {meta['python']} ({meta['executable']}).\n\n")
    summary = md_table(["step", "status", "seconds", "budget s"],
                       [[step.title, outcome.status, f"{outcome.seconds:.0f}", f"{budget:.0f}"]
                        for step, outcome, budget in done])
    sections = [f"## {step.title}: {outcome.status} ({outcome.seconds:.0f} s)\n\n{outcome.text}"
                for step, outcome, _ in done]
    md = head + summary + "\n\n" + "\n\n".join(sections) + "\n"
    js = json.dumps({"meta": meta, "steps": [{"name": s.name, "title": s.title, "budget_s": b, **asdict(o)}
                                             for s, o, b in done]}, indent=1, default=str)
    return md, js


def _write(out: Path, meta: dict[str, Any], done: list) -> None:
    from dartree.eval.outdir import write_atomic  # the report is whole or the earlier one stays

    md, js = render(meta, done)
    write_atomic(out / REPORT_MD, md)
    write_atomic(out / REPORT_JSON, js + "\n")


# ------------------------------------------------------------------------------------------ command line
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dartree.eval.gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu (the same code paths, tiny)")
    p.add_argument("--quick", action="store_true", help="the quick pass: fewer sizes and prompts (<= 4 min)")
    p.add_argument("--out", type=Path, default=Path("runs/gpu-check"), help="report folder (report.md, report.json)")
    p.add_argument("--steps", nargs="+", metavar="STEP",
                   help=f"run only these steps, of {', '.join(s.name for s in STEPS)}")
    p.add_argument("--budget-s", type=float, default=None,
                   help="the whole run's wall-clock budget in seconds (default 480, quick 240); steps past it "
                        "are skipped, each step's own budget is cut to what is left")
    p.add_argument("--inline", action="store_true", help="run the steps in this process (no budgets enforced)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--time-limit", type=float, help=argparse.SUPPRESS)
    return p


def _check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    names = [step.name for step in STEPS]
    bad = [s for s in args.steps or () if s not in names]
    if bad:
        p.error(f"--steps: unknown {bad}; allowed: {', '.join(names)}")
    if args.budget_s is not None and not args.budget_s > 0:
        p.error(f"--budget-s: must be a number of seconds > 0, got {args.budget_s}")
    kind = args.device.split(":")[0]
    if kind not in ("cuda", "cpu"):
        p.error(f"--device: must be cuda, cuda:N or cpu, got {args.device!r}")
    if kind == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is visible to torch (use --device cpu for a dry run)")


def _child_options(args: argparse.Namespace) -> list[str]:
    """What each step's process is given: the device, quick or not."""
    return ["--device", args.device, *(["--quick"] if args.quick else [])]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = _parser()
    args = p.parse_args(argv)
    _check_args(p, args)
    if args.child:                        # one step, in its own process: the result as json
        step = next(s for s in STEPS if s.name == args.child)
        outcome = run_inline(step, Check(args.device, args.quick, args.time_limit, Path(f"{args.result}.partial.md")))
        args.result.write_text(json.dumps(asdict(outcome), default=str))
        return 0
    mode = "quick" if args.quick else "full"
    scale = 1.0 if args.device.startswith("cuda") else CPU_BUDGET_SCALE
    budget = args.budget_s or TOTAL_BUDGET_S[mode] * scale
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    meta = {"date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": args.device, "mode": mode,
            "budget_s": budget, "budget_scale": scale, "command": "python -m dartree.eval.gpu_check " + " ".join(argv),
            "python": platform.python_version(), "executable": sys.executable, "elapsed_s": 0.0}
    done: list[tuple[Step, Outcome, float]] = []
    _write(args.out, meta, done)
    for step in STEPS:
        if args.steps and step.name not in args.steps:
            continue
        left = budget - (time.monotonic() - start)
        limit = min(step.budget(args.quick) * scale, left - 2.0)
        print(f"[gpu-check] {step.title} (budget {max(0.0, limit):.0f} s) ...", flush=True)
        if limit < 2 * _GRACE_S:
            outcome = Outcome("skipped", f"skipped: the run's time budget ({budget:.0f} s) was spent")
        elif args.inline:
            outcome = run_inline(step, Check(args.device, args.quick))
        else:
            outcome = run_isolated(step, _child_options(args), limit)
        done.append((step, outcome, max(0.0, limit)))
        print(f"[gpu-check] {step.name}: {outcome.status} ({outcome.seconds:.0f} s)", flush=True)
        if outcome.status in _BAD:
            print(outcome.text[-3000:], file=sys.stderr, flush=True)
        meta["elapsed_s"] = time.monotonic() - start
        _write(args.out, meta, done)     # after every step: a run cut short still leaves its report
    bad = [s.name for s, o, _ in done if o.status in _BAD]
    print(f"[gpu-check] {'FAILED: ' + ', '.join(bad) if bad else 'passed'} in {time.monotonic() - start:.0f} s; "
          f"report: {args.out / REPORT_MD}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
