"""Every user error of the command line: one line ``dartree: error: ...``, exit status 2, no traceback,
found before the model loads when it can be; run folders are never replaced silently; a bench that is
not lossless fails; a bug keeps its traceback.  ``main`` runs in-process on the session's toy bundle."""

import dataclasses
import json

import pytest

import dartree.eval.bench
import dartree.eval.bundles
from dartree.cli import UsageError, main
from tests.eval.cli_helpers import fails

TOY = ["--model", "tiny-random", "--threads", "1", "--backend", "ref"]
QUICK = ["--num-prompts", "1", "--max-new-tokens", "4", "--max-prompt-tokens", "16"]
BENCH = ["bench", *TOY, *QUICK, "--methods", "chain", "--no-warmup"]


@pytest.fixture
def loads(monkeypatch, bundle):
    """Count model loads; every load returns the session's toy bundle (no model is built per test)."""
    calls = []

    def load(name):
        calls.append(name)
        return bundle

    monkeypatch.setattr(dartree.eval.bundles, "load_bundle", load)
    return calls


@pytest.fixture
def files(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "latin1.py").write_bytes(b"caf\xe9 = 1\n")
    (tmp_path / "empty.py").write_text("")
    (tmp_path / "a_file").write_text("x")
    return tmp_path


@pytest.mark.parametrize("argv, message", [
    (["generate", "--prompt-file", "{tmp}/missing.py"], "--prompt-file: {tmp}/missing.py does not exist"),
    (["generate", "--prompt-file", "{tmp}/folder"], "is a folder; give a text file"),
    (["generate", "--prompt-file", "{tmp}/latin1.py"], "is not UTF-8 text (byte 3"),
    (["generate", "--prompt-file", "{tmp}/empty.py"], "--prompt-file: the prompt is empty"),
    (["generate", "--prompt", ""], "--prompt: the prompt is empty"),
    (["show-tree", "--prompt", "", "--out", "{tmp}/t"], "--prompt: the prompt is empty"),
    (["generate", "--prompt", "x", "--method", "ddtree:budget=8,budget=4"], "budget: set twice"),
    (["generate", "--prompt", "x", "--method", "dartree-pruned:beta=0.5"], "beta: must be"),
    (["generate", "--prompt", "x", "--method", "corrected-sequoia:proposal_temperature=-1"],
     "proposal_temperature: must be a finite number > 0"),
    (["bench", "--num-prompts", "200", "--out", "{tmp}/b"], "dataset 'humaneval' has 164 prompts, asked for 200"),
    (["bench", "--methods", "ddtree:budget=auto", "--num-prompts", "163", "--out", "{tmp}/b"],
     "--calibration-prompts: 'auto' settings are tuned on the prompts of 'humaneval' after its 163 evaluation "
     "prompts; num_prompts: dataset 'humaneval' has 164 prompts, asked for 4 after an offset of 163"),
    (["bench", "--out", "{tmp}/a_file"], "--out: {tmp}/a_file is a file"),
    (["bench", "--out", "{tmp}/a_file/sub"], "--out: cannot write to {tmp}/a_file/sub"),
    (["tune", "--method", "ddtree", "--out", "{tmp}/a_file"], "is a file"),
    (["sweep", "--param", "width", "--values", "0.5", "--out", "{tmp}/s"], "width takes integers >= 1, got 0.5"),
    (["sweep", "--param", "beta", "--values", "0.2", "--out", "{tmp}/s"], "beta is a depth penalty and must be <= 0"),
    (["sweep", "--param", "budget", "--values", "4,8,4", "--out", "{tmp}/s"], "repeated: 4"),
    (["sweep", "--param", "budget", "--values", "0,4", "--out", "{tmp}/s"], "budget takes integers >= 1, got 0"),
    (["show-tree", "--method", "ar", "--out", "{tmp}/t"], "'ar' builds no tree"),
    (["tune", "--method", "ddtree:budget=4", "--out", "{tmp}/u"], "fixes every setting tune searches"),
    (["tune", "--method", "dartree-pruned:width=4", "--budget", "8", "--out", "{tmp}/u"], "fixes every setting"),
])
def test_errors_found_before_the_model_loads(argv, message, files, loads, capsys):
    argv = [a.replace("{tmp}", str(files)) for a in argv]
    line = fails([argv[0], *TOY, *argv[1:]], capsys)
    assert message.replace("{tmp}", str(files)) in line
    assert loads == []


@pytest.mark.parametrize("argv, message", [
    (["--seed", "-1"], "argument --seed: expected an integer in [0, 2**63)"),
    (["--seed", str(2**63)], "argument --seed"),
    (["--threads", "100000"], "argument --threads: expected an integer in 1.."),
    (["--values", ""], "argument --values: expected comma-separated finite numbers"),
    (["--values", "1,,2"], "argument --values"),
    (["--values", "nan"], "argument --values"),
    (["--values", "inf"], "argument --values"),
    (["--beta", "0.5"], "argument --beta: expected a finite number <= 0 (a depth penalty), got '0.5'"),
    (["--beta", "nan"], "argument --beta"),
    (["--proposal-temperature", "0"], "argument --proposal-temperature: expected a finite number > 0 (the "
                                      "proposal's temperature over the run's), got '0'"),
    (["--proposal-temperature", "inf"], "argument --proposal-temperature"),
    (["--temperature", "nan"], "argument --temperature: expected 0 (greedy) or a finite number >= 1e-06"),
    (["--temperature", "1e-7"], "argument --temperature: expected 0 (greedy) or a finite number >= 1e-06"),
    (["--temperature", "1e300"], "argument --temperature: expected 0 (greedy) or a finite number >= 1e-06 and "
                                 "<= 10000, got '1e300'"),
    (["--temperature", "-1"], "argument --temperature"),
    (["--out", ""], "argument --out: expected a folder path, got an empty string"),
])
def test_argument_types(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["sweep", "--param", "width", *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["generate", "--prompt", "x", "--method", "dartree-pruned:head=nope"],
     "head: model 'tiny-random' has heads ['gru', 'markov'], got 'nope'"),
    (["generate", "--prompt", "x", "--topk", "300", "--method", "ddtree"], "topk: 300 exceeds the vocabulary"),
    (["generate", "--prompt", "x" * 5000], "prompt: 5000 tokens; model 'tiny-random' holds at most 4096 positions"),
    (["generate", "--prompt", "x", "--max-new-tokens", "5000"], "--max-new-tokens: a prompt of 1 tokens + 5000"),
    (["bench", *QUICK[:2], "--max-new-tokens", "4090", "--out", "{tmp}/b"],
     "a prompt of 256 tokens + 4090 new tokens exceeds the 4096 positions model 'tiny-random' holds; "
     "allowed <= 3840 (or a smaller --max-prompt-tokens)"),
    (["bench", "--methods", "corrected-chain:head=x", "--out", "{tmp}/b"], "got 'x'"),
    (["sweep", "--param", "topk", "--values", "4,500", "--methods", "ddtree", *QUICK, "--out", "{tmp}/s"],
     "values: topk 500 exceeds the vocabulary"),
    (["show-tree", "--round", "99", "--method", "ddtree:budget=3", *QUICK, "--out", "{tmp}/t"],
     "--round: the first prompt took"),
    (["tune", "--method", "dartree-fixed:head=y", *QUICK, "--out", "{tmp}/u"], "got 'y'"),
])
def test_errors_found_once_the_model_is_loaded(argv, message, files, loads, capsys):
    argv = [a.replace("{tmp}", str(files)) for a in argv]
    line = fails([argv[0], *TOY, *argv[1:]], capsys)
    assert message.replace("{tmp}", str(files)) in line and loads == ["tiny-random"]


def test_a_run_folder_is_never_replaced_silently(tmp_path, loads, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.md").write_text("earlier run")
    (out / "tuning_ddtree.png").write_bytes(b"stale plot of the earlier run")
    (out / "notes.txt").write_text("mine")                         # other kinds of files are never touched
    (out / "sweep_width.md").write_text("a sweep")
    line = fails([*BENCH, "--out", str(out)], capsys)
    assert "already holds results of an earlier run (results.md, tuning_ddtree.png); pass --force" in line
    assert loads == [] and (out / "results.md").read_text() == "earlier run"

    assert main([*BENCH, "--out", str(out), "--force"]) == 0
    assert {p.name for p in out.iterdir()} == {"results.md", "results.json", "acceptance.png",   # stale plot gone
                                               "notes.txt", "sweep_width.md"}
    assert json.loads((out / "results.json").read_text())["lossless"] is True
    assert (out / "notes.txt").read_text() == "mine" and (out / "sweep_width.md").read_text() == "a sweep"


def test_sweeps_of_different_parameters_share_a_folder_and_a_repeat_needs_force(tmp_path, loads, capsys):
    (tmp_path / "sweep_topk.md").write_text("an earlier sweep of topk")
    sweep = ["sweep", *TOY, *QUICK, "--methods", "ddtree", "--out", str(tmp_path)]
    assert main([*sweep, "--param", "budget", "--values", "2"]) == 0
    assert (tmp_path / "sweep_topk.md").read_text() == "an earlier sweep of topk"
    line = fails([*sweep, "--param", "budget", "--values", "3"], capsys)
    assert "sweep_budget.json, sweep_budget.md, sweep_budget.png); pass --force" in line
    assert "| 2 |" in (tmp_path / "sweep_budget.md").read_text()


def test_bench_is_strict_by_default(tmp_path, loads, monkeypatch, capsys):
    real = dartree.eval.bench.run_bench

    def differs_from_ar(*args, **kwargs):       # the method's first record differs from AR at token 2
        result = real(*args, **kwargs)
        records = list(result.records)
        i = next(i for i, r in enumerate(records) if r.method != "ar")
        records[i] = dataclasses.replace(records[i], matches_ar=False, first_difference=2)
        return dataclasses.replace(result, records=tuple(records))

    monkeypatch.setattr(dartree.eval.bench, "run_bench", differs_from_ar)
    assert main([*BENCH, "--out", str(tmp_path / "strict")]) == 1
    captured = capsys.readouterr()
    assert "LOSSLESS CHECK FAILED: 1 of 2 outputs differ" in captured.err
    assert "Lossless check FAILED on 1 runs: chain/humaneval/T=0/HumanEval/0 (from token 2)" in captured.out
    assert main([*BENCH, "--out", str(tmp_path / "lenient"), "--no-strict"]) == 0
    assert "exit status 0 because of --no-strict" in capsys.readouterr().err


def test_a_bug_keeps_its_traceback(tmp_path, loads, monkeypatch):
    def bug(*args, **kwargs):
        raise ValueError("an internal check failed")

    monkeypatch.setattr(dartree.eval.bench, "run_bench", bug)
    with pytest.raises(ValueError, match="an internal check failed") as e:
        main([*BENCH, "--out", str(tmp_path / "b")])
    assert not isinstance(e.value, UsageError)


@pytest.mark.slow                 # a fresh interpreter imports torch: seconds
def test_the_command_exits_2_with_one_line(tmp_path):
    """The real process (python -m dartree.cli): status 2, one stderr line, nothing on stdout."""
    import subprocess
    import sys
    from pathlib import Path

    proc = subprocess.run([sys.executable, "-m", "dartree.cli", "generate", "--prompt-file", str(tmp_path / "no.py")],
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"dartree: error: --prompt-file: {tmp_path / 'no.py'} does not exist"]
