import json

import pytest

from dartree.cli import build_parser, main

TOY = ["--model", "tiny-random", "--threads", "1", "--backend", "ref"]


@pytest.mark.parametrize("argv, message", [
    ([], "required: COMMAND"),
    (["bench", "--methods", "beam"], "method: unknown method 'beam'"),
    (["bench", "--datasets", "wiki"], "invalid choice: 'wiki'"),
    (["bench", "--num-prompts", "0"], "expected an integer >= 1"),
    (["bench", "--budget", "-3"], "expected an integer >= 1 or 'auto'"),
    (["bench", "--temperatures", "-1"], "expected 0 (greedy) or a finite number >= 1e-06"),
    (["bench", "--temperatures", "1e-9"], "expected 0 (greedy) or a finite number >= 1e-06 and <= 10000, "
                                                "got '1e-9'"),
    (["bench", "--preset", "huge"], "invalid choice: 'huge'"),
    (["generate"], "exactly one of --prompt and --prompt-file"),
    (["generate", "--prompt", "x", "--budget", "auto"], "budget=auto: no tuning of dartree-pruned is cached"),
    (["generate", "--prompt", "x", "--method", "chain:width=3"], "width: not a setting of 'chain'"),
    (["sweep", "--param", "width", "--methods", "ddtree"], "has no setting 'width'"),
    (["sweep", "--param", "depth"], "invalid choice: 'depth'"),
    (["show-tree", "--method", "ar"], "'ar' builds no tree"),
    (["tune", "--method", "chain"], "has no budget to tune"),
    (["tune", "--budgets", "4,x"], "comma-separated"),
])
def test_argument_errors_exit_2_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_every_command_has_help():
    parser = build_parser()
    for command in ("generate", "bench", "sweep", "show-tree", "tune"):
        with pytest.raises(SystemExit) as e:
            parser.parse_args([command, "--help"])
        assert e.value.code == 0


def test_generate_streams_text_and_prints_round_stats(capsys):
    assert main(["generate", *TOY, "--prompt", "def f(x):", "--method", "ddtree:budget=4", "--max-new-tokens",
                 "12", "--no-stop"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("def f(x):") and "12 tokens in" in err and "tau" in err and "verify" in err


@pytest.mark.parametrize("flag, verifier", [([], "traversal"), (["--verifier", "match"], "match"),
                                            (["--verifier", "rejection"], "rejection")])
def test_generate_at_t_above_0_verifies_by_traversal_unless_told(capsys, flag, verifier):
    """The default verifier at T>0 (dartree.rounds.DEFAULT_VERIFIER) and --verifier, named in the summary line."""
    assert main(["generate", *TOY, "--prompt", "def f(x):", "--method", "ddtree:budget=4", "--max-new-tokens",
                 "8", "--no-stop", "--temperature", "1", *flag]) == 0
    err = capsys.readouterr().err
    assert f"T=1, verifier: {verifier}, stop:" in err


def _ar_samplers(monkeypatch) -> list[str]:
    """The class names of the samplers ``generate_ar`` is called with, in order."""
    import dartree.decode

    seen, real = [], dartree.decode.generate_ar

    def spy(*args, **kwargs):
        seen.append(type(args[4]).__name__)
        return real(*args, **kwargs)

    monkeypatch.setattr(dartree.decode, "generate_ar", spy)
    return seen


@pytest.mark.parametrize("flag, sampler", [([], "GeneratorSampler"), (["--verifier", "traversal"], "GeneratorSampler"),
                                           (["--verifier", "rejection"], "GeneratorSampler"),
                                           (["--verifier", "match"], "KeyedSampler")])
def test_generate_ar_at_t_above_0_draws_as_the_runs_verifier(capsys, monkeypatch, flag, sampler):
    """AR verifies nothing: it draws with the generator sampler (the draw bench times AR with) unless the run
    matches, where it draws keyed so that it equals a ``match`` tree decode with the same seed."""
    seen = _ar_samplers(monkeypatch)
    assert main(["generate", *TOY, "--prompt", "def f(x):", "--method", "ar", "--max-new-tokens", "3", "--no-stop",
                 "--temperature", "1", *flag]) == 0
    assert seen == [sampler]


def test_generate_ar_at_t_above_0_is_seeded_by_seed_and_equals_match_only_under_match(capsys):
    """Default verifier: AR's draws are the generator's seeded by --seed (the same seed, the same text; another
    seed, other text); with --verifier match AR and a match tree decode with the same seed agree token for token."""
    def text(method, seed, *flag):
        assert main(["generate", *TOY, "--prompt", "def f(x):", "--method", method, "--max-new-tokens", "8",
                     "--no-stop", "--temperature", "1", "--seed", str(seed), *flag]) == 0
        return capsys.readouterr().out

    drawn = text("ar", 3)
    assert drawn == text("ar", 3) != text("ar", 4)
    keyed = text("ar", 3, "--verifier", "match")
    assert keyed == text("ddtree:budget=4", 3, "--verifier", "match") != drawn


@pytest.mark.parametrize("method, sampler", [("ddtree:budget=auto", "GeneratorSampler"),
                                             ("ddtree:budget=auto,verifier=match", "KeyedSampler")])
def test_generate_a_method_resolved_to_ar_draws_as_its_verifier(capsys, monkeypatch, method, sampler):
    """A method the tuning cache resolves to AR keeps its own ``verifier=`` for AR's draws."""
    import dartree.eval.tune_cache as tc
    from dartree.eval.methods import AR, MethodSpec

    seen = _ar_samplers(monkeypatch)
    monkeypatch.setattr(tc, "check_cached", lambda *a: None)
    monkeypatch.setattr(tc, "resolve_unset", lambda bundle, m, *a: (MethodSpec(AR, label=m.label), "auto -> ar"))
    assert main(["generate", *TOY, "--prompt", "def f(x):", "--method", method, "--max-new-tokens", "3", "--no-stop",
                 "--temperature", "1"]) == 0
    assert seen == [sampler]


def test_bench_writes_tables_json_and_plot(tmp_path, capsys):
    out = tmp_path / "bench"
    assert main(["bench", *TOY, "--methods", "chain", "dartree-pruned:budget=4,width=2", "--num-prompts", "1",
                 "--max-new-tokens", "8", "--max-prompt-tokens", "32", "--no-warmup", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "## Speedup over AR and tau, T=0" in printed and "## Time per round (ms), T=0" in printed
    assert {p.name for p in out.iterdir()} == {"results.md", "results.json", "acceptance.png"}
    data = json.loads((out / "results.json").read_text())
    assert [s["method"] for s in data["summaries"]] == ["ar", "chain", "dartree-pruned:budget=4,width=2"]
    assert data["meta"]["command"].startswith("dartree bench --model tiny-random")


def test_bench_verifies_by_traversal_when_told(tmp_path, capsys):
    """--verifier traversal reaches the bench at T>0: its rows are law-checked on the run, not token for token."""
    out = tmp_path / "bench"
    assert main(["bench", *TOY, "--methods", "corrected-sequoia:budget=4", "--temperatures", "1", "--verifier",
                 "traversal", "--num-prompts", "1", "--max-new-tokens", "8", "--max-prompt-tokens", "32",
                 "--no-warmup", "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    assert [s["verifier"] for s in data["summaries"] if s["method"] != "ar"] == ["traversal"]
    text = (out / "results.md").read_text()
    assert "verified on sampled trees (rejection or traversal" in text and "T=1 in law" in text


def test_sweep_show_tree_and_tune_write_their_files(tmp_path, capsys):
    common = [*TOY, "--num-prompts", "1", "--max-new-tokens", "8", "--max-prompt-tokens", "32"]
    assert main(["sweep", *common, "--param", "width", "--values", "1,3", "--budget", "4", "--out",
                 str(tmp_path / "s")]) == 0
    assert {p.name for p in (tmp_path / "s").iterdir()} == {"sweep_width.md", "sweep_width.json", "sweep_width.png"}
    assert main(["show-tree", *common, "--method", "dartree-pruned:budget=5", "--depth-methods", "ddtree:budget=5",
                 "--out", str(tmp_path / "t")]) == 0
    assert {p.name for p in (tmp_path / "t").iterdir()} == {"tree_dartree-pruned_budget5_round1.png",
                                                           "depth_distribution.png"}
    assert main(["tune", *common, "--method", "ddtree", "--budgets", "2,4", "--out", str(tmp_path / "u")]) == 0
    out = capsys.readouterr().out               # the toy's timings decide between a tree and AR
    assert "chosen: --budget" in out or "chosen: plain AR" in out
    from dartree.eval.tune_cache import CACHE_FILE, cache_dir

    assert (cache_dir() / CACHE_FILE).is_file()     # the choice is cached for `generate`
    assert (tmp_path / "u" / "tune_ddtree.png").stat().st_size > 1000


def test_demo_preset_compares_the_six_methods_and_the_tuned_budget_at_greedy():
    from dartree.cli import PRESETS

    demo = PRESETS["demo"]
    assert [m.split(":")[0] for m in demo["methods"]] == ["chain", "ddtree", "corrected-chain", "dartree-fixed",
                                                         "dartree-pruned", "dartree-pruned"]
    assert "budget=auto" in demo["methods"][-1] and demo["temperatures"] == [0.0] and demo["threads"] == 1
    assert demo["peers"] == ["hf-generate"]                 # HF's own AR beside dartree's


def test_presets_at_t_above_0_run_the_methods_that_pay_there():
    """--temperatures above 0 alone: the sampled list (corrected-sequoia at B=16 and B=4, and auto); T=0 keeps the
    demo's six methods in their order; a mixed grid runs both lists once each; every listed method parses."""
    from dartree.cli import PRESETS
    from dartree.cli.parser import BENCH_DEFAULTS, methods_for
    from dartree.eval.methods import parse_methods

    demo = PRESETS["demo"]
    assert methods_for(demo, [0.0]) == demo["methods"]
    sampled = methods_for(demo, [1.0])
    assert "corrected-sequoia:budget=3" in sampled and "auto" in sampled and sampled == demo["sampled_methods"]
    assert "corrected-sequoia" in sampled                   # at the table's budget, as every other tree
    mixed = methods_for(PRESETS["paper"], [0.0, 1.0])
    assert mixed[: len(PRESETS["paper"]["methods"])] == PRESETS["paper"]["methods"] and "auto" in mixed
    for preset in (*PRESETS.values(), BENCH_DEFAULTS):
        parse_methods(methods_for(preset, [0.0, 1.0]))
        assert {"corrected-sequoia:budget=3", "corrected-sequoia:budget=4"} & set(methods_for(preset, [0.7]))


def test_local_checkpoint_directories_decode_like_the_bundled_model(tmp_path, capsys):
    """--target/--drafter load local directories (here: the zoo's own files) and give the zoo's output."""
    import shutil

    from dartree.models.zoo import ZOO_DIR

    zoo = ZOO_DIR / "pystdlib-tiny"
    shutil.copytree(zoo / "target", tmp_path / "target")
    shutil.copy(zoo / "tokenizer.json", tmp_path / "target" / "tokenizer.json")
    run = ["generate", "--prompt", "def add(a, b):", "--method", "ddtree:budget=8", "--max-new-tokens", "8",
           "--threads", "1"]
    assert main([*run, "--target", str(tmp_path / "target"), "--drafter", str(zoo / "drafter")]) == 0
    local = capsys.readouterr().out
    assert main(run) == 0
    assert local == capsys.readouterr().out and local.strip()


@pytest.mark.parametrize("extra, message", [
    (["--target", "."], "--target and --drafter: give both"),
    (["--tokenizer", "tok.json"], "--tokenizer: only used with --target"),
    (["--target", "nowhere", "--drafter", "nowhere"], "target: nowhere is not a checkpoint directory"),
    (["--device", "tpu"], "argument --device: expected cpu, cuda or cuda:N, got 'tpu'"),
])
def test_local_checkpoint_errors_are_one_line(extra, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--prompt", "x", *extra])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_device_cuda_without_a_gpu_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--model", "tiny-random", "--prompt", "x", "--device", "cuda"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--device: cuda is not available here" in err and "Traceback" not in err


def test_the_tuning_grid_defaults_are_the_tuners():
    """``--tune-budgets`` / ``--tune-widths`` (and ``tune``'s ``--budgets`` / ``--widths``) default to the
    tuner's grids (the parser keeps a copy so that ``--help`` imports no torch), and the grid holds
    ``dartree-pruned``'s default width."""
    from dartree.builders import PrunedConfig
    from dartree.eval.bench import BenchConfig
    from dartree.eval.tune import DEFAULT_BUDGETS, DEFAULT_WIDTHS

    args = build_parser().parse_args(["bench"])
    assert tuple(args.tune_budgets) == DEFAULT_BUDGETS and tuple(args.tune_widths) == DEFAULT_WIDTHS
    args = build_parser().parse_args(["tune"])
    assert tuple(args.budgets) == DEFAULT_BUDGETS and tuple(args.widths) == DEFAULT_WIDTHS
    config = BenchConfig(methods=("ddtree",))
    assert config.tune_budgets == DEFAULT_BUDGETS and config.tune_widths == DEFAULT_WIDTHS
    assert PrunedConfig().width in DEFAULT_WIDTHS


def test_sampling_flags_parse_and_agree_with_the_library():
    """--verifier's choices are dartree.rounds.VERIFIERS (not imported by the parser: --help stays fast);
    --top-k / --top-p / --min-p reach generate and bench; bad values are one line naming the flag."""
    from dartree.rounds import VERIFIERS

    for command in ("generate", "bench"):
        action = next(a for a in build_parser()._subparsers._group_actions[0].choices[command]._actions
                      if "--verifier" in a.option_strings)
        assert tuple(action.choices) == VERIFIERS
        args = build_parser().parse_args([command, "--verifier", "rejection", "--top-k", "5", "--top-p", "0.9",
                                          "--min-p", "0.05"])
        assert (args.verifier, args.top_k, args.top_p, args.min_p) == ("rejection", 5, 0.9, 0.05)
    for flag, value in (("--top-p", "-0.1"), ("--top-p", "1.5"), ("--top-k", "0"), ("--min-p", "-0.1"),
                        ("--verifier", "rejected")):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["bench", flag, value])


@pytest.mark.slow                 # a fresh interpreter (subprocess): the slow lane
def test_help_imports_no_torch_and_the_parsers_copies_agree():
    """--help builds the parser without torch (0.09 s instead of 4.5 s); the constants it keeps instead of
    importing are the library's."""
    import subprocess
    import sys

    from dartree.cli import parser as cli_parser
    from dartree.eval.methods import BACKEND_CHOICES
    from dartree.eval.sweep import SWEEP_PARAMS

    assert cli_parser.SWEEP_PARAMS == SWEEP_PARAMS and cli_parser.BACKEND_CHOICES == BACKEND_CHOICES
    code = ("import sys, dartree\nfrom dartree.cli import build_parser\nbuild_parser()\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\nprint(len(dartree.__all__))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) >= 10


@pytest.mark.slow                 # a fresh interpreter (subprocess): the slow lane
def test_a_closed_pipe_ends_quietly_and_a_non_utf8_prompt_is_one_line(tmp_path):
    import subprocess
    import sys

    cmd = (f"{sys.executable} -m dartree.cli generate --model tiny-random --prompt 'def f(x):' "
           f"--max-new-tokens 200 --no-stop --method chain | head -c 1")
    out = subprocess.run(["bash", "-c", cmd + "; exit ${PIPESTATUS[0]}"], capture_output=True, text=True,
                         check=False, cwd=tmp_path)
    assert out.returncode in (0, 141) and "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr
    with pytest.raises(SystemExit) as e:
        main(["generate", "--model", "tiny-random", "--prompt", "caf\udce9"])
    assert e.value.code == 2


def _run_cli_with(tmp_path, setup: str, argv: list[str]):
    """Run ``dartree.cli.main(argv)`` in a fresh interpreter after ``setup`` (Python's own SIGINT handler
    installed, whatever the shell running the tests does with SIGINT)."""
    import subprocess
    import sys

    code = ("import signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\nimport dartree.cli as cli\n"
            f"{setup}\nsys.exit(cli.main({argv!r}))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=tmp_path)


@pytest.mark.slow                 # a fresh interpreter (subprocess): the slow lane
def test_ctrl_c_inside_a_librarys_import_is_one_line_and_the_command_does_not_run(tmp_path):
    """Ctrl-C while the command's libraries load: some swallow it (an extension's ``ImportError:
    initialization failed`` caught by a library that carries on), some fail later (a half-initialized
    numpy recursing); either way the process ends at once with one line."""
    (tmp_path / "swallows.py").write_text(
        "import signal\ntry:\n    signal.raise_signal(signal.SIGINT)\nexcept KeyboardInterrupt:\n    pass\n")
    setup = ("sys.path.insert(0, '.')\ncli.COMMAND_STACK['generate'] = ('swallows',)\n"
             "cli.COMMANDS['generate'] = lambda args: print('the command ran') or 0")
    out = _run_cli_with(tmp_path, setup, ["generate", "--model", "tiny-random", "--prompt", "x"])
    assert out.returncode == 130, out.stderr
    assert out.stderr.strip() == "dartree: interrupted" and "the command ran" not in out.stdout


@pytest.mark.slow                 # a fresh interpreter (subprocess): the slow lane
def test_ctrl_c_that_a_library_turns_into_another_error_is_still_one_line(tmp_path):
    setup = ("import signal\ndef cmd(args):\n    try:\n        signal.raise_signal(signal.SIGINT)\n"
             "    except KeyboardInterrupt:\n        raise ImportError('initialization failed') from None\n"
             "cli.COMMANDS['generate'] = cmd")
    out = _run_cli_with(tmp_path, setup, ["generate", "--model", "tiny-random", "--prompt", "x"])
    assert out.returncode == 130 and out.stderr.strip() == "dartree: interrupted", out.stderr
    # the same error without a Ctrl-C is a bug, and keeps its traceback
    out = _run_cli_with(tmp_path, "def cmd(args):\n    raise ImportError('initialization failed')\n"
                        "cli.COMMANDS['generate'] = cmd", ["generate", "--model", "tiny-random", "--prompt", "x"])
    assert out.returncode == 1 and "Traceback" in out.stderr and "ImportError: initialization failed" in out.stderr


def _run_console_with(tmp_path, setup: str, argv: list[str]):
    """Run the ``dartree`` console script's ``main`` in a fresh interpreter after ``setup``."""
    import subprocess
    import sys

    code = (f"import os, signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n{setup}\n"
            f"sys.argv = ['dartree', *{argv!r}]\nfrom dartree.console import main\nsys.exit(main())")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=tmp_path)


@pytest.mark.slow                 # a fresh interpreter (subprocess): the slow lane
def test_ctrl_c_while_the_command_line_loads_and_a_second_one_at_exit_are_one_line(tmp_path):
    """Ctrl-C while ``dartree.cli`` is imported (before ``main`` has its handlers: a ``KeyboardInterrupt``
    traceback, exit 1), and a second Ctrl-C in an exit handler after the first ended the command (a traceback
    from the handler): each is one line and status 130."""
    during_import = ("import builtins\nreal = builtins.__import__\n"
                     "def hooked(name, *args, **kwargs):\n"
                     "    if name == 'dartree.cli.parser':\n        os.kill(os.getpid(), signal.SIGINT)\n"
                     "    return real(name, *args, **kwargs)\nbuiltins.__import__ = hooked")
    out = _run_console_with(tmp_path, during_import, ["generate", "--help"])
    assert (out.returncode, out.stderr.strip()) == (130, "dartree: interrupted"), out.stderr
    at_exit = ("import atexit, time\n"
               "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.05)))\n"
               "import dartree.cli as cli\n"
               "def cmd(args):\n    os.kill(os.getpid(), signal.SIGINT)\n    time.sleep(1)\n"
               "cli.COMMANDS['generate'] = cmd")
    out = _run_console_with(tmp_path, at_exit, ["generate", "--model", "tiny-random", "--prompt", "x"])
    assert (out.returncode, out.stderr.strip()) == (130, "dartree: interrupted"), out.stderr
