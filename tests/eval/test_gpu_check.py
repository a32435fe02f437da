"""The GPU check's pieces on the CPU, in seconds: the report is written whole after every step, a failing,
crashing or overrunning step is recorded (not raised) and the next one runs, and ``make gpu-check PY=...``
runs no venv or pip step.  The steps themselves run on the CPU in ``make gpu-rehearsal`` (never in CI)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dartree.eval import gpu_check
from dartree.eval.gpu_check import Outcome, Skip, Step

ROOT = Path(__file__).resolve().parents[2]


def _steps(*fns) -> list[Step]:
    return [Step(f"s{i}", f"Step {i}", fn, 30, 30) for i, fn in enumerate(fns)]


def test_every_step_runs_and_a_failing_one_is_recorded_not_raised(tmp_path, monkeypatch) -> None:
    calls = []

    def broken(c):
        raise AssertionError("kernel mismatch")

    def needs_cuda(c):
        raise Skip("needs CUDA")

    def mismatch(c):
        c.fail("ddtree differs from HF generate")
        return "| table kept |", {"rows": 1}

    def partial(c):
        c.notes.append("left out near the step's time budget: the 8B curve")
        return "two curves"

    monkeypatch.setattr(gpu_check, "STEPS", _steps(lambda c: calls.append(0) or "ok", broken, needs_cuda, mismatch,
                                                   partial, lambda c: calls.append(5) or ("last", {"x": 5})))
    out = tmp_path / "r"
    assert gpu_check.main(["--device", "cpu", "--quick", "--inline", "--out", str(out)]) == 1
    assert calls == [0, 5]                                     # the steps after the failing one ran
    md = (out / gpu_check.REPORT_MD).read_text()
    assert "## Step 1: failed" in md and "kernel mismatch" in md and "Traceback" in md
    assert "## Step 2: skipped" in md and "skipped: needs CUDA" in md
    assert "## Step 3: failed" in md and "| table kept |" in md and "ddtree differs" in md
    assert "## Step 4: partial" in md and "the 8B curve" in md
    report = json.loads((out / gpu_check.REPORT_JSON).read_text())
    assert [s["status"] for s in report["steps"]] == ["passed", "failed", "skipped", "failed", "partial", "passed"]
    assert report["steps"][5]["data"] == {"x": 5}
    assert sorted(p.name for p in out.iterdir()) == [gpu_check.REPORT_JSON, gpu_check.REPORT_MD]


def test_all_passing_steps_exit_zero_and_steps_selects(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(gpu_check, "STEPS", _steps(lambda c: "a", lambda c: "b"))
    assert gpu_check.main(["--device", "cpu", "--inline", "--out", str(tmp_path), "--steps", "s1"]) == 0
    md = (tmp_path / gpu_check.REPORT_MD).read_text()
    assert "## Step 1: passed" in md and "Step 0" not in md


def test_a_step_past_the_run_budget_is_skipped(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(gpu_check, "STEPS", _steps(lambda c: "a"))
    assert gpu_check.main(["--device", "cpu", "--inline", "--out", str(tmp_path), "--budget-s", "5"]) == 0
    assert "skipped: the run's time budget (5 s) was spent" in (tmp_path / gpu_check.REPORT_MD).read_text()


def _python(code: str):
    return lambda step, options, result, limit: [sys.executable, "-c", code.replace("RESULT", str(result))]


def test_isolated_step_overrunning_its_budget_is_killed_and_recorded() -> None:
    step = _steps(lambda c: "never")[0]
    code = ("import time; open(r'RESULT.partial.md', 'w').write('| first table |'); print('started', flush=True); "
            "time.sleep(30)")
    out = gpu_check.run_isolated(step, [], 1.5, _python(code))
    assert out.status == "timed out" and "started" in out.text and out.seconds < 10
    assert "What it had finished:\n\n| first table |" in out.text


def test_isolated_step_that_crashes_is_recorded_with_its_output() -> None:
    step = _steps(lambda c: "never")[0]
    out = gpu_check.run_isolated(step, [], 20, _python("print('CUDA error: illegal address'); raise SystemExit(134)"))
    assert out.status == "failed" and "status 134" in out.text and "illegal address" in out.text


def test_isolated_step_result_is_read_back() -> None:
    step = _steps(lambda c: "never")[0]
    code = ("import json; json.dump({'status': 'passed', 'text': 'hi', 'seconds': 1.0, 'data': {'n': 2}}, "
            "open(r'RESULT', 'w'))")
    out = gpu_check.run_isolated(step, [], 20, _python(code))
    assert (out.status, out.text, out.data) == ("passed", "hi", {"n": 2})


def test_child_options_drop_steps_and_inline() -> None:
    args = gpu_check._parser().parse_args(["--device", "cpu", "--steps", "env", "speed", "--inline", "--quick"])
    assert gpu_check._child_options(args) == ["--device", "cpu", "--quick"]


@pytest.mark.parametrize(("argv", "names"), [
    (["--device", "tpu"], "--device: must be cuda, cuda:N or cpu"),
    (["--device", "cpu", "--steps", "nope"], "--steps: unknown ['nope']; allowed: env, tests, lossless_zoo"),
    (["--device", "cpu", "--budget-scale", "2"], "unrecognized arguments: --budget-scale"),
    (["--device", "cpu", "--budget-s", "0"], "--budget-s: must be a number of seconds > 0"),
])
def test_bad_arguments_name_the_argument_and_allowed_values(argv, names, capsys) -> None:
    with pytest.raises(SystemExit):
        gpu_check.main(argv)
    assert names in capsys.readouterr().err


def test_cuda_without_a_gpu_is_an_argument_error(monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        gpu_check.main(["--device", "cuda"])


def test_the_seven_steps_fit_the_run_budget() -> None:
    assert [s.name for s in gpu_check.STEPS] == ["env", "tests", "lossless_zoo", "lossless_random", "speed",
                                                 "verify_cost", "graphs"]
    assert all(s.budget(True) <= s.budget(False) for s in gpu_check.STEPS)
    for mode, quick in (("full", False), ("quick", True)):
        assert sum(s.budget(quick) for s in gpu_check.STEPS) <= gpu_check.TOTAL_BUDGET_S[mode] + 30


def _make(*args: str) -> str:
    return subprocess.run(["make", "--no-print-directory", "-n", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout


def test_make_gpu_check_with_py_given_runs_no_venv_or_pip_step() -> None:
    commands = _make("gpu-check", "PY=python3", "GPU_OUT=/tmp/x", "VENV=/nonexistent-venv")
    assert "pip" not in commands and "venv" not in commands
    assert commands.strip() == f"PYTHONPATH={ROOT} python3 -m dartree.eval.gpu_check --out /tmp/x"


def test_make_gpu_check_without_py_sets_up_the_venv_first() -> None:
    assert "-m venv /nonexistent-venv" in _make("gpu-check", "VENV=/nonexistent-venv")


def test_render_lists_every_step_in_the_summary() -> None:
    meta = {"date_utc": "d", "device": "cpu", "mode": "quick", "budget_s": 240, "budget_scale": 1, "command": "c",
            "python": "3.12", "executable": "python3", "elapsed_s": 1}
    md, js = gpu_check.render(meta, [(s, Outcome("passed", "body"), 10) for s in _steps(str, str)])
    assert md.count("| passed |") == 2 and json.loads(js)["steps"][1]["text"] == "body"
