"""``make gpu-check`` runs on the CPU as a dry run (``--device cpu --quick``): every step's code path."""

from __future__ import annotations

import pytest

from dartree.eval import gpu_check


@pytest.mark.slow
def test_dry_run_on_cpu_writes_every_section(tmp_path) -> None:
    out = tmp_path / "report.md"
    steps = [f.__name__[5:] for _, f in gpu_check.STEPS if f is not gpu_check.step_tests]  # pytest: below
    assert gpu_check.main(["--device", "cpu", "--quick", "--out", str(out), "--steps", *steps]) == 0
    report = out.read_text()
    assert "FAILED" not in report
    for title, fn in gpu_check.STEPS:
        assert (f"## {title}" in report) == (fn is not gpu_check.step_tests)
    assert "| chain | [3, 4, 111] | torch | equal |" in report
    assert "identical" in report and "per 1000 tokens" in report
    assert "Lossless check: every method's output equals AR's" in report


def test_the_first_failing_step_stops_the_run_loudly(tmp_path, monkeypatch) -> None:
    def broken(c):
        raise AssertionError("kernel mismatch")

    calls = []
    monkeypatch.setattr(gpu_check, "STEPS", [("First", lambda c: calls.append(1) or "ok"), ("Broken", broken),
                                             ("Never", lambda c: calls.append(3) or "ok")])
    out = tmp_path / "report.md"
    assert gpu_check.main(["--device", "cpu", "--quick", "--out", str(out)]) == 1
    report = out.read_text()
    assert calls == [1] and "## Broken: FAILED" in report and "kernel mismatch" in report and "Never" not in report


def test_cuda_without_a_gpu_is_an_argument_error(monkeypatch) -> None:
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        gpu_check.main(["--device", "cuda"])
