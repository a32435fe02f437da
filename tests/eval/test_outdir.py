"""Run folders (dartree.eval.outdir): a run's files appear complete or not at all, an earlier run is
replaced only once the new one is complete, one writer at a time, no symlink followed.  Faults are
simulated at every rename of a commit (Ctrl-C, disk full, a process killed mid-commit)."""

import errno
import json
import os

import pytest

import dartree.eval.outdir as outdir
from dartree.eval.outdir import BENCH_FILES, JOURNAL, STAGING_PREFIX, open_run, write_atomic
from dartree.eval.plots import plot_depth_distribution

EARLIER = {"results.md": "earlier table", "results.json": '{"earlier": true}', "tuning_ddtree.png": "stale plot"}
OTHERS = {"notes.txt": "mine", "sweep_width.md": "a sweep"}


@pytest.fixture
def folder(tmp_path):
    """A folder holding an earlier bench (with a tuning plot the new run does not write) and other kinds' files."""
    out = tmp_path / "run"
    out.mkdir()
    for name, text in {**EARLIER, **OTHERS}.items():
        (out / name).write_text(text)
    return out


def contents(out):
    return {p.name: p.read_text() for p in out.iterdir() if p.is_file()}


def hidden(out):
    return sorted(p.name for p in out.iterdir() if p.name.startswith("."))


def stage_new_run(run):
    run.write("results.md", "new table")
    run.write("results.json", json.dumps({"new": True}))
    run.write("acceptance.png", b"new plot")


def test_a_commit_replaces_the_earlier_run_and_nothing_else(folder):
    with open_run(folder, BENCH_FILES, force=True) as run:
        assert sorted(p.name for p in run.earlier()) == sorted(EARLIER)
        stage_new_run(run)
        assert contents(folder) == {**EARLIER, **OTHERS}          # nothing shows before the commit
        committed = run.commit()
    assert sorted(p.name for p in committed) == ["acceptance.png", "results.json", "results.md"]
    assert contents(folder) == {"results.md": "new table", "results.json": '{"new": true}',
                                "acceptance.png": "new plot", **OTHERS}       # the stale plot is gone
    assert hidden(folder) == []                                               # no journal, staging or lock file


@pytest.mark.parametrize("fault", [KeyboardInterrupt(), OSError(errno.ENOSPC, "No space left on device")],
                         ids=["ctrl-c", "disk-full"])
def test_a_fault_while_the_files_are_written_leaves_the_earlier_run(folder, fault):
    with pytest.raises(type(fault)), open_run(folder, BENCH_FILES, force=True) as run:
        run.write("results.md", "new table")
        run.path("results.json").write_text('{"half": ')        # half-written, then the fault
        raise fault
    assert contents(folder) == {**EARLIER, **OTHERS} and hidden(folder) == []


# A commit of 3 new files over 3 earlier ones makes 7 os.replace calls: the journal, 3 moved aside, 3 moved in.
@pytest.mark.parametrize("at", range(1, 8))
@pytest.mark.parametrize("fault", [KeyboardInterrupt(), OSError(errno.ENOSPC, "No space left on device")],
                         ids=["ctrl-c", "disk-full"])
def test_a_fault_at_any_rename_of_the_commit_leaves_the_earlier_run(folder, monkeypatch, at, fault):
    real, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == at:
            raise fault
        real(src, dst)

    monkeypatch.setattr(outdir.os, "replace", replace)
    with pytest.raises(type(fault)), open_run(folder, BENCH_FILES, force=True) as run:
        stage_new_run(run)
        run.commit()
    assert contents(folder) == {**EARLIER, **OTHERS} and hidden(folder) == []


@pytest.mark.parametrize("at", range(2, 8))
def test_a_commit_killed_midway_is_rolled_back_by_the_next_run(folder, monkeypatch, at):
    real, calls = os.replace, []

    class Killed(BaseException):
        pass

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == at:
            raise Killed
        real(src, dst)

    monkeypatch.setattr(outdir.os, "replace", replace)
    monkeypatch.setattr(outdir, "_undo", lambda *a: (_ for _ in ()).throw(OSError("the process is gone")))
    with pytest.raises(Killed):
        run = open_run(folder, BENCH_FILES, force=True)
        stage_new_run(run)
        run.commit()
    run.close()                                    # the kernel drops a dead process's lock
    assert JOURNAL in hidden(folder)              # a mix of runs on disk, and the journal that says how to undo it
    monkeypatch.undo()
    with open_run(folder, BENCH_FILES, force=True) as again:
        assert set(again.restored) == {os.path.basename(d) for d in calls[1:at - 1]} & set(EARLIER)
    assert contents(folder) == {**EARLIER, **OTHERS} and hidden(folder) == []


def test_staging_folders_of_dead_runs_are_removed(folder):
    (folder / f"{STAGING_PREFIX}dead" / "new").mkdir(parents=True)
    (folder / f"{STAGING_PREFIX}dead" / "new" / "results.json").write_text('{"half')
    with open_run(folder, BENCH_FILES, force=True):
        pass
    assert contents(folder) == {**EARLIER, **OTHERS} and hidden(folder) == []


def test_a_journal_killed_while_written_leaves_no_temporary_file(folder):
    """write_atomic's temporary journal (a run killed in its fsync) was left in --out for good."""
    (folder / f".{JOURNAL}.8ezqyz7v.tmp").write_text('{"staging": ".dart')
    with open_run(folder, BENCH_FILES, force=True):
        pass
    assert contents(folder) == {**EARLIER, **OTHERS} and hidden(folder) == []


def test_one_writer_per_folder(tmp_path):
    out = tmp_path / "fresh"
    with open_run(out, BENCH_FILES) as first:
        with pytest.raises(ValueError, match=f"--out: another dartree run is writing to {out}"):
            open_run(out, BENCH_FILES)
        with pytest.raises(ValueError, match="another dartree run"):     # whatever the kind
            open_run(out, ("sweep_width.md",))
        first.write("results.md", "x")
        first.commit()
    with open_run(out, BENCH_FILES, force=True):                        # released once the first is done
        pass


def test_an_earlier_run_needs_force(folder):
    with pytest.raises(ValueError, match=r"already holds results of an earlier run \(results.json, results.md, "
                                         r"tuning_ddtree.png\); pass --force"):
        open_run(folder, BENCH_FILES)
    assert contents(folder) == {**EARLIER, **OTHERS} and hidden(folder) == []


def test_a_symlinked_run_file_is_replaced_itself_never_written_through(tmp_path):
    outside = tmp_path / "precious.json"
    outside.write_text("do not touch")
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").symlink_to(outside)
    with pytest.raises(ValueError, match=r"earlier run \(results.json\)"):   # a link of the kind counts as a run file
        open_run(out, BENCH_FILES)
    with open_run(out, BENCH_FILES, force=True) as run:
        stage_new_run(run)
        run.commit()
    assert outside.read_text() == "do not touch"
    assert not (out / "results.json").is_symlink() and json.loads((out / "results.json").read_text()) == {"new": True}


def test_a_folder_with_a_run_file_name_is_refused(tmp_path):
    out = tmp_path / "run"
    (out / "results.json").mkdir(parents=True)
    (out / "results.json" / "inside").write_text("kept")
    with pytest.raises(ValueError, match=f"--out: results.json in {out} is a folder, where this run writes a file"):
        open_run(out, BENCH_FILES, force=True)
    (out / "tuning_x.png").mkdir()          # a pattern's name: refused when this run writes it
    (out / "results.json" / "inside").unlink()
    (out / "results.json").rmdir()
    with pytest.raises(ValueError, match="tuning_x.png in .* is a folder"), open_run(out, BENCH_FILES) as run:
        run.write("tuning_x.png", b"plot")
        run.commit()
    assert (out / "tuning_x.png").is_dir() and hidden(out) == []


def test_only_plain_names_of_the_kind_are_written(tmp_path):
    with open_run(tmp_path / "run", BENCH_FILES) as run:
        for bad in ("../escape.md", "notes.txt", "", "sub/results.md"):
            with pytest.raises(ValueError, match="name: "):
                run.path(bad)
        (run.staged / "notes.txt").write_text("a stray")          # written into the folder by mistake
        with pytest.raises(ValueError, match="not files of this run's kind"):
            run.commit()


def test_write_atomic_leaves_the_old_file_or_the_new_one(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    path.write_text("old")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outdir.os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        write_atomic(path, '{"new": 1}')
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["results.json"]
    monkeypatch.undo()
    link = tmp_path / "link.json"
    link.symlink_to(path)
    write_atomic(link, "through?")
    assert path.read_text() == "old" and link.read_text() == "through?" and not link.is_symlink()


def test_an_interrupted_plot_leaves_no_file(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", interrupted)
    with pytest.raises(KeyboardInterrupt):
        plot_depth_distribution({"m": [1.0, 2.0]}, tmp_path / "depth_distribution.png")
    assert list(tmp_path.iterdir()) == []


def test_a_signal_during_the_commit_is_delivered_once_it_is_done(folder, monkeypatch):
    """Ctrl-C arriving at the first install of a new file: the commit finishes (new run in, staging gone),
    then the KeyboardInterrupt is raised.  Python's own SIGINT handler is installed for the test: a shell that
    ignores SIGINT (a background job, nohup) starts Python with it ignored, and then no Ctrl-C would arrive."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _signal_during_commit(folder, monkeypatch)
    finally:
        signal.signal(signal.SIGINT, previous)


def _signal_during_commit(folder, monkeypatch):
    import signal

    real, sent = os.replace, []

    def rename(src, dst):
        if os.path.dirname(dst) == str(folder) and not sent:
            sent.append(1)
            signal.raise_signal(signal.SIGINT)
        return real(src, dst)

    monkeypatch.setattr(outdir.os, "replace", rename)
    with open_run(folder, BENCH_FILES, force=True) as run:
        stage_new_run(run)
        with pytest.raises(KeyboardInterrupt) as raised:
            run.commit()
        assert run.committed is not None
    assert sent and contents(folder)["results.md"] == "new table" and hidden(folder) == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler     # the handler is restored
    # the CLI's line says the run was written (it said "interrupted" alone, as if the folder were untouched)
    from dartree.cli import _after_commit

    assert raised.value.dartree_committed == str(folder)
    assert _after_commit(raised.value) == f" after the run's results were written to {folder}"
    assert _after_commit(KeyboardInterrupt()) == ""


_KILLED_MID_COMMIT = """
import os, signal, socket, sys, threading
import dartree.eval.outdir as outdir
out = sys.argv[1]
ready, done = threading.Event(), threading.Event()
worker = threading.Thread(target=lambda: (ready.set(), done.wait()), daemon=True)   # a thread like tqdm's monitor
worker.start(); ready.wait()
# the C-level handler writes a byte here from whichever thread it runs on: waiting for it makes the test wait
# until the worker was scheduled and took the signal (on a loaded machine that can be after the commit otherwise)
delivered, wakeup = socket.socketpair()
wakeup.setblocking(False); signal.set_wakeup_fd(wakeup.fileno()); delivered.settimeout(30)
real = os.replace
def rename(src, dst):
    if os.path.dirname(dst) == out:
        signal.pthread_kill(worker.ident, signal.SIGTERM)    # the kernel may pick any thread for a `kill`
        delivered.recv(1)
    return real(src, dst)
outdir.os.replace = rename
with outdir.open_run(outdir.Path(out), outdir.BENCH_FILES, force=True) as run:
    run.write("results.md", "new table")
    run.commit()
print("not reached: SIGTERM's default action ends the process once the commit is done")
"""


@pytest.mark.slow                 # a fresh interpreter (subprocess): the slow lane
def test_sigterm_to_another_thread_mid_commit_ends_the_process_only_after_it(folder):
    """A process-wide SIGTERM that the kernel hands to another thread (whose signal mask a commit cannot
    change) is held back all the same: the process ends with the new run committed, nothing stray left."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _KILLED_MID_COMMIT, str(folder)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -15, proc.stderr                          # killed by SIGTERM ...
    assert "not reached" not in proc.stdout
    assert contents(folder) == {"results.md": "new table", **OTHERS}    # ... after the commit: no mix, no journal
    assert hidden(folder) == []


def test_a_run_that_commits_nothing_removes_the_folders_it_made(tmp_path):
    out = tmp_path / "new" / "a" / "b"
    with open_run(out, BENCH_FILES) as run:
        run.write("results.md", "never committed")
    assert not (tmp_path / "new").exists()
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("mine")
    with open_run(tmp_path / "kept" / "x", BENCH_FILES):
        pass
    assert [p.name for p in (tmp_path / "kept").iterdir()] == ["notes.txt"]   # only what it made, and only if empty
    with open_run(out, BENCH_FILES) as run:
        stage_new_run(run)
        run.commit()
    assert contents(out)["results.md"] == "new table"                      # a committed run keeps them
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="cannot write to"):
        open_run(tmp_path / "file" / "sub", BENCH_FILES)
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    with pytest.raises(ValueError, match="dangling is a symbolic link to nothing, not a folder"):
        open_run(tmp_path / "dangling", BENCH_FILES)


def test_a_failed_run_through_dotdot_or_beaten_to_the_lock_removes_only_what_it_made(tmp_path, monkeypatch):
    """``nd/../r2`` listed ``nd/..`` as made (its removal failed and left ``nd``); a run that listed the
    folders to make before another process made them removed that process's folder when it lost the lock."""
    out = tmp_path / "nd" / ".." / "r2"
    with open_run(out, BENCH_FILES):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    taken = tmp_path / "taken"
    with open_run(taken, BENCH_FILES) as first:         # another run made the folder and holds it
        monkeypatch.setattr(outdir, "_missing_folders", lambda path: [taken.absolute()])  # listed before that
        with pytest.raises(ValueError, match="another dartree run is writing"):
            open_run(taken, BENCH_FILES)
        monkeypatch.undo()
        assert taken.is_dir()
        first.write("results.md", "x")
        first.commit()
    assert contents(taken) == {"results.md": "x"}


def test_two_runs_making_the_same_new_nested_folder_do_not_remove_it_from_each_other(tmp_path, monkeypatch):
    """Run B makes ``a/b`` an instant before run A takes its lock there; B then loses the lock and must not
    remove ``a/b`` (it removed it, empty, while A was about to write: both runs failed, about 1 in 100-300)."""
    out = tmp_path / "a" / "b"
    real_lock = outdir._lock
    holder = {}

    def lock_after_the_other_took_it(path):
        holder["run"] = open_run_first()                # A takes the folder B just made
        return real_lock(path)

    def open_run_first():
        monkeypatch.setattr(outdir, "_lock", real_lock)
        return open_run(out, BENCH_FILES)

    monkeypatch.setattr(outdir, "_lock", lock_after_the_other_took_it)
    with pytest.raises(ValueError, match="another dartree run is writing"):
        open_run(out, BENCH_FILES)                      # B: made a/ and a/b, lost the lock
    first = holder["run"]
    assert out.is_dir()
    first.write("results.md", "x")
    first.commit()
    first.close()
    assert contents(out) == {"results.md": "x"}


def test_written_files_get_the_mode_open_gives(tmp_path):
    path = write_atomic(tmp_path / "results.md", "table")
    with open(tmp_path / "plain", "w"):
        pass
    assert path.stat().st_mode & 0o777 == (tmp_path / "plain").stat().st_mode & 0o777
