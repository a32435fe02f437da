"""The command line's run folders and user errors: Ctrl-C or a full disk while a run's files are written
leaves the earlier run, a second writer and a folder named like a run file are one-line errors, a
symlinked run file is never written through; every subcommand's user errors are one line, exit 2.

Bench runs reuse one real toy result (``run_bench`` is monkeypatched): only the writing is exercised."""

import errno
import json

import pytest

import dartree.eval.bench
import dartree.eval.bundles
from dartree.cli import main
from dartree.cli.parser import build_parser, join_negative_values
from dartree.eval.bench import BenchConfig, run_bench
from dartree.eval.methods import parse_method
from dartree.eval.outdir import BENCH_FILES, RunFolder, open_run
from tests.eval.cli_helpers import fails

TOY = ["--model", "tiny-random", "--threads", "1", "--backend", "ref"]
QUICK = ["--num-prompts", "1", "--max-new-tokens", "4", "--max-prompt-tokens", "16"]
BENCH = ["bench", *TOY, *QUICK, "--methods", "chain", "--no-warmup", "--force"]
EARLIER = {"results.md": "earlier table", "results.json": '{"earlier": true}', "acceptance.png": "earlier plot"}


@pytest.fixture(scope="module")
def toy_result(bundle):
    config = BenchConfig(methods=(parse_method("chain"),), num_prompts=1, max_new_tokens=4, max_prompt_tokens=16,
                         backend="ref", warmup=False)
    return run_bench(bundle, config, log=lambda _m: None, progress=False)


@pytest.fixture
def loads(monkeypatch, bundle, toy_result):
    """Count model loads (each returns the session's toy bundle); bench returns the toy result at once."""
    calls = []

    def load(name):
        calls.append(name)
        return bundle

    monkeypatch.setattr(dartree.eval.bundles, "load_bundle", load)
    monkeypatch.setattr(dartree.eval.bench, "run_bench", lambda *a, **k: toy_result)
    return calls


@pytest.fixture
def earlier(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    for name, text in EARLIER.items():
        (out / name).write_text(text)
    (out / "notes.txt").write_text("mine")
    return out


def files(out):
    return {p.name: p.read_text(errors="replace") for p in out.iterdir() if p.is_file()}


def test_a_forced_bench_replaces_the_earlier_run_in_one_step(earlier, loads):
    assert main([*BENCH, "--out", str(earlier)]) == 0
    assert json.loads((earlier / "results.json").read_text())["lossless"] is True
    assert {p.name for p in earlier.iterdir()} == {*EARLIER, "notes.txt"}        # nothing hidden left behind


@pytest.mark.parametrize("where", ["results.md", "results.json", "acceptance.png"])
def test_ctrl_c_while_the_files_are_written_leaves_the_earlier_run(earlier, loads, monkeypatch, capsys, where):
    import dartree.eval.plots

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    if where == "acceptance.png":
        monkeypatch.setattr(dartree.eval.plots, "plot_acceptance", interrupted)
    else:
        real = RunFolder.write
        monkeypatch.setattr(RunFolder, "write",
                            lambda run, name, data: interrupted() if name == where else real(run, name, data))
    with pytest.raises(SystemExit) as e:
        main([*BENCH, "--out", str(earlier)])
    assert e.value.code == 130 and "interrupted" in capsys.readouterr().err
    assert files(earlier) == {**EARLIER, "notes.txt": "mine"} and [p.name for p in earlier.iterdir()
                                                                    if p.name.startswith(".")] == []
    line = fails([*BENCH[:-1], "--out", str(earlier)], capsys)                 # the earlier run is still whole
    assert "already holds results of an earlier run" in line


def test_a_full_disk_while_results_json_is_written_is_one_line_and_replaces_nothing(earlier, loads, monkeypatch,
                                                                                   capsys):
    real = RunFolder.write

    def full(run, name, data):
        if name == "results.json":
            path = run.path(name)
            path.write_text(data[: len(data) // 2])          # half of it reached the disk
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(run, name, data)

    monkeypatch.setattr(RunFolder, "write", full)
    line = fails([*BENCH, "--out", str(earlier)], capsys)
    assert f"--out: cannot write the results to {earlier}" in line and "No space left on device" in line
    assert f"nothing in {earlier} was replaced" in line
    assert files(earlier) == {**EARLIER, "notes.txt": "mine"}
    assert json.loads((earlier / "results.json").read_text()) == {"earlier": True}


def test_a_second_writer_is_refused_before_any_model_loads(tmp_path, loads, capsys):
    out = tmp_path / "busy"
    with open_run(out, BENCH_FILES):
        line = fails([*BENCH, "--out", str(out)], capsys)
        assert line == f"dartree: error: --out: another dartree run is writing to {out}; wait for it to finish or " \
                       "pick another --out"
        line = fails(["sweep", *TOY, *QUICK, "--param", "budget", "--values", "2", "--methods", "ddtree",
                      "--out", str(out)], capsys)
        assert "another dartree run is writing" in line
    assert loads == []


def test_a_symlinked_results_json_is_not_written_through(tmp_path, loads):
    outside = tmp_path / "elsewhere.json"
    outside.write_text("someone else's file")
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").symlink_to(outside)
    assert main([*BENCH, "--out", str(out)]) == 0
    assert outside.read_text() == "someone else's file"
    assert not (out / "results.json").is_symlink() and json.loads((out / "results.json").read_text())["lossless"]


def test_a_folder_named_results_json_is_one_line(tmp_path, loads, capsys):
    (tmp_path / "run" / "results.json").mkdir(parents=True)
    line = fails([*BENCH, "--out", str(tmp_path / "run")], capsys)
    assert f"--out: results.json in {tmp_path / 'run'} is a folder, where this run writes a file" in line
    assert loads == []


def test_negative_values_parse_in_the_documented_form():
    parser = build_parser()
    args = parser.parse_args(join_negative_values(["sweep", "--param", "beta", "--values", "-0.1,-0.2"]))
    assert args.values == [-0.1, -0.2]
    assert parser.parse_args(join_negative_values(["generate", "--beta", "-1e-3"])).beta == -1e-3
    assert join_negative_values(["generate", "--", "--values", "-1"]) == ["generate", "--", "--values", "-1"]


@pytest.mark.parametrize("argv, message", [
    (["tune", *QUICK, "--method", "dartree-pruned", "--widths", "20000", "--out", "{tmp}/u"],
     "--widths: width: 20000 exceeds the limit 16384"),
    (["tune", *QUICK, "--method", "dartree-pruned", "--budgets", "4,20000", "--out", "{tmp}/u"],
     "--budgets: budget: 20000 exceeds the limit"),
    (["bench", *QUICK, "--methods", "dartree-pruned:budget=auto,width=auto", "--tune-widths", "20000",
      "--out", "{tmp}/b"], "--tune-widths: width: 20000 exceeds the limit"),
    (["bench", *QUICK, "--concurrency", "2", "--methods", "ddtree:budget=auto", "--tune-budgets", "20000",
      "--out", "{tmp}/b"], "--tune-budgets: budget: 20000 exceeds the limit"),
    (["generate", "--target", "{tmp}", "--drafter", "{tmp}", "--prompt", "x"],
     "--model tiny-random and --target/--drafter: give one of them"),
])
def test_errors_found_before_the_model_loads(tmp_path, loads, capsys, argv, message):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    line = fails([argv[0], *TOY, *argv[1:]], capsys)
    assert message.replace("{tmp}", str(tmp_path)) in line and loads == []


@pytest.mark.parametrize("argv, message", [
    (["--max-new-tokens", "5000"], "--max-new-tokens: a prompt of 16 tokens + 5000 new tokens exceeds the 4096"),
    (["--topk", "300", "--methods", "ddtree"], "topk: 300 exceeds the vocabulary of model 'tiny-random' (V=257)"),
    (["--methods", "corrected-chain:head=nope"], "head: model 'tiny-random' has heads ['gru', 'markov'], got 'nope'"),
])
def test_bench_concurrency_errors_are_one_line(tmp_path, loads, capsys, argv, message):
    line = fails(["bench", *TOY, *QUICK, "--methods", "chain", "--no-warmup", "--concurrency", "2", *argv,
                  "--out", str(tmp_path / "c")], capsys)
    assert message in line and loads == ["tiny-random"]
    assert not (tmp_path / "c" / "concurrency.md").exists()


def test_a_target_whose_weights_disagree_with_its_config_is_one_line(tmp_path, capsys):
    import shutil

    from dartree.models.zoo import ZOO_DIR

    zoo = ZOO_DIR / "pystdlib-tiny"
    shutil.copytree(zoo / "target", tmp_path / "target")
    shutil.copy(zoo / "tokenizer.json", tmp_path / "target" / "tokenizer.json")
    config = json.loads((tmp_path / "target" / "config.json").read_text())
    config["intermediate_size"] *= 2
    (tmp_path / "target" / "config.json").write_text(json.dumps(config))
    line = fails(["generate", "--threads", "1", "--prompt", "x", "--target", str(tmp_path / "target"),
                  "--drafter", str(zoo / "drafter")], capsys)
    assert f"target: {tmp_path / 'target'} could not be loaded as a causal LM: RuntimeError" in line


def test_sigterm_during_a_run_is_one_line_and_leaves_no_folder(tmp_path, loads, monkeypatch, capsys):
    """SIGTERM (a job scheduler, `kill`) is handled like Ctrl-C: cleanup runs, exit 128 + 15, one line;
    the --out folder the run created is gone again."""
    import os
    import signal
    import time

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)                           # the handler raises in the main thread long before this ends
        raise AssertionError("SIGTERM was not turned into an exception")

    monkeypatch.setattr(dartree.eval.bench, "run_bench", terminated)
    out = tmp_path / "new" / "run"
    with pytest.raises(SystemExit) as e:
        main([*BENCH, "--out", str(out)])
    assert e.value.code == 128 + signal.SIGTERM
    assert capsys.readouterr().err.strip().splitlines()[-1] == "dartree: terminated by SIGTERM"
    assert not (tmp_path / "new").exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL            # main() put the default back


def test_a_failure_before_the_run_block_releases_the_folder(earlier, loads, monkeypatch):
    """An error between opening --out and the command's `with` (here: stderr closed while --force is
    logged) removes the staging folder and releases the lock: the next run in the folder proceeds."""
    import dartree.cli.helpers

    real = dartree.cli.helpers.log

    def closed_stderr(message):
        if message.startswith("--force:"):
            raise BrokenPipeError(32, "Broken pipe")
        real(message)

    monkeypatch.setattr(dartree.cli.helpers, "log", closed_stderr)
    with pytest.raises(SystemExit) as ended:          # a closed pipe ends quietly: status 141, no traceback
        main([*BENCH, "--out", str(earlier)])
    assert ended.value.code == 141
    assert files(earlier) == {**EARLIER, "notes.txt": "mine"} and not any(
        p.name.startswith(".") for p in earlier.iterdir())
    monkeypatch.setattr(dartree.cli.helpers, "log", real)
    assert main([*BENCH, "--out", str(earlier)]) == 0                      # not "another dartree run is writing"


def test_the_tuning_is_cached_only_after_the_results_are_committed(tmp_path, loads, monkeypatch):
    import dartree.cli.decode

    seen = []
    monkeypatch.setattr(dartree.cli.decode, "_cache_tuning",
                        lambda bundle, config, result: seen.append(sorted(p.name for p in out.iterdir())))
    out = tmp_path / "run"
    assert main([*BENCH, "--out", str(out)]) == 0
    assert seen == [["acceptance.png", "results.json", "results.md"]]      # a cache that fails cannot lose them
