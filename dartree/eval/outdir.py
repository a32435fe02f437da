"""Run folders: where a command writes its results, complete or not at all, one writer at a time
(:func:`open_run`, :class:`RunFolder`, :func:`write_atomic`; the design: docs/internals.md, "Run folders")."""

from __future__ import annotations

import errno
import fnmatch
import glob
import json
import os
import secrets
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

__all__ = ["BENCH_FILES", "TREE_FILES", "named_files", "run_files",
           "open_run", "RunFolder", "write_atomic", "JOURNAL", "STAGING_PREFIX", "signal_handlers"]

BENCH_FILES: tuple[str, ...] = ("results.md", "results.json", "acceptance.png", "tuning_*.png")
TREE_FILES: tuple[str, ...] = ("tree_*.png", "depth_distribution.png")
#: The commit journal of a run folder (present only while a commit is in progress or was killed).
JOURNAL = ".dartree-journal.json"
#: Name prefix of the staging folders inside a run folder.
STAGING_PREFIX = ".dartree-staging-"


def named_files(stem: str) -> tuple[str, ...]:
    """A table, its JSON and its plot: what ``bench --concurrency`` (``concurrency``), ``sweep --param P``
    (``sweep_P``: sweeps of other parameters are another kind) and ``tune`` (``tune_BUILDER``) write."""
    return tuple(f"{glob.escape(stem)}.{ext}" for ext in ("md", "json", "png"))


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pat) for pat in patterns)


def run_files(out: Path, patterns: Sequence[str]) -> list[Path]:
    """The files and symlinks of this kind in ``out``, sorted (empty when ``out`` does not exist)."""
    return sorted(p for p in out.iterdir() if _matches(p.name, patterns) and (p.is_symlink() or not p.is_dir())) \
        if out.is_dir() else []


def _names(paths: Sequence[Path], limit: int = 4) -> str:
    names = [p.name for p in paths[:limit]]
    return ", ".join(names) + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def _is_folder(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def _fsync(path: Path, directory: bool = False) -> None:
    fd = os.open(path, (os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)) if directory else os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes | str) -> Path:
    """Write ``data`` to ``path`` complete or not at all: a temporary file beside it, ``fsync``, then
    ``os.replace`` (a symlink at ``path`` is replaced, not written through).  Returns ``path``."""
    raw = data.encode() if isinstance(data, str) else data
    tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)     # the mode open() gives: 0o666 less the umask
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with suppress(OSError):        # a second failure must not hide the error being raised
            os.unlink(tmp)
        raise
    return path


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold back SIGINT/SIGTERM/SIGHUP so that a commit's renames are not cut short, delivering each when the
    block ends.  A Python handler, not a signal mask: a mask holds a signal back from the calling thread only,
    and the kernel may deliver a ``kill`` to another (tqdm's monitor thread)."""
    pending: list[int] = []
    held = [getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n)]   # those present here
    try:                                         # None: a handler set from C, which Python cannot restore
        with signal_handlers({sig: lambda signum, frame: pending.append(signum) for sig in held
                              if signal.getsignal(sig) is not None}):
            yield
    finally:
        for sig in dict.fromkeys(pending):       # once each, in order of arrival
            signal.raise_signal(sig)


@contextmanager
def signal_handlers(handlers: dict[int, Any]) -> Iterator[None]:
    """Install ``handlers`` (signal -> handler) for the block and restore the earlier ones after it; outside
    the main thread, where Python cannot set handlers, nothing is installed."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# ------------------------------------------------------------------------------------------- journal
def _read_journal(out: Path) -> dict[str, Any] | None:
    path = out / JOURNAL
    if not os.path.lexists(path):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            journal = json.loads(f.read())
        names = [journal["staging"], *journal["earlier"], *journal["new"]]
        if not journal["staging"].startswith(STAGING_PREFIX) or any(
                not isinstance(n, str) or n in ("", ".", "..") or os.sep in n or n != Path(n).name for n in names):
            raise ValueError("a name that is not a plain file name")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"--out: {path} (the journal of an interrupted commit) is unreadable ({e}); check the "
                         f"folder's files and remove it") from None
    return journal


def _undo(out: Path, journal: dict[str, Any]) -> list[str]:
    """Undo the renames of a commit (c and d), whatever step it reached; returns the earlier files restored.
    Idempotent: each rename is decided by where the file is now."""
    staging = out / journal["staging"]
    new, earlier = staging / "new", staging / "earlier"
    if not staging.is_dir():       # nothing was moved out of a staging folder that is gone
        return []
    for name in journal["new"]:    # installed (gone from staging): take it back
        if not os.path.lexists(new / name) and os.path.lexists(out / name):
            os.replace(out / name, new / name)
    restored = []
    for name in journal["earlier"]:
        if os.path.lexists(earlier / name):
            os.replace(earlier / name, out / name)
            restored.append(name)
    _fsync(out, directory=True)
    return restored


def _recover(out: Path) -> list[str]:
    """Roll back a commit that was killed, remove staging folders of dead runs; returns files restored."""
    restored: list[str] = []
    journal = _read_journal(out)
    if journal is not None:
        restored = _undo(out, journal)
        os.unlink(out / JOURNAL)
    for p in out.iterdir():     # we hold the lock: every staging folder here belongs to a run that died
        if p.name.startswith(STAGING_PREFIX) and _is_folder(p):
            shutil.rmtree(p, ignore_errors=True)
        elif p.name.startswith(f".{JOURNAL}.") and p.name.endswith(".tmp") and not _is_folder(p):
            with suppress(OSError):     # write_atomic's temporary journal, of a run killed while writing it
                os.unlink(p)
    return restored


# ---------------------------------------------------------------------------------------- run folder
class RunFolder:
    """An open, locked run folder: write files with :meth:`write` (or at :meth:`path`), then :meth:`commit`.
    As a context manager, leaving the block without a commit removes what was staged; leaving it unlocks."""

    def __init__(self, out: Path, patterns: Sequence[str], lock_fd: int, restored: Sequence[str],
                 created: Sequence[Path] = ()):
        self.out = out
        self._created = tuple(created)        # folders open_run made (deepest first): removed if nothing is committed
        self.patterns = tuple(patterns)
        self.restored = tuple(restored)       # files of an earlier run restored by recovery (step 2)
        self._lock_fd: int | None = lock_fd
        self._staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out))
        self._keep_staging = False       # an undo that failed needs the earlier run kept in staging
        (self._staging / "new").mkdir()
        self.committed: tuple[Path, ...] | None = None

    @property
    def staged(self) -> Path:
        """The folder this run's files are written into until the commit."""
        return self._staging / "new"

    def earlier(self) -> list[Path]:
        """The files of this kind in ``out`` now (an earlier run's; replaced by the commit)."""
        return run_files(self.out, self.patterns)

    def path(self, name: str) -> Path:
        """Where file ``name`` of this run is written until the commit (e.g. for a plotting function)."""
        if not isinstance(name, str) or name != Path(name).name or name in ("", ".", ".."):
            raise ValueError(f"name: expected a plain file name, got {name!r}")
        if not _matches(name, self.patterns):
            raise ValueError(f"name: {name!r} is not a file of this run's kind {self.patterns}")
        self._check_open()
        return self.staged / name

    def _check_open(self) -> None:
        if self.committed is not None or self._lock_fd is None:
            raise ValueError(f"run folder {self.out}: already committed or closed")

    def write(self, name: str, data: bytes | str) -> Path:
        """Stage file ``name`` with ``data`` (text is UTF-8); returns the path it will have after the commit."""
        path = self.path(name)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        return self.out / name

    def commit(self) -> tuple[Path, ...]:
        """Replace the earlier run of this kind with the staged files (step 5 of docs/internals.md, "Run folders")."""
        self._check_open()
        new_dir = self.staged
        names = sorted(p.name for p in new_dir.iterdir())
        if not names:
            raise ValueError(f"run folder {self.out}: nothing was written to commit")
        strays = [n for n in names if not _matches(n, self.patterns) or _is_folder(new_dir / n)]
        if strays:    # a file of no kind would never be replaced or refused by a later run
            raise ValueError(f"run folder {self.out}: staged {strays} are not files of this run's kind {self.patterns}")
        blocked = [self.out / n for n in names if _is_folder(self.out / n)]
        if blocked:
            raise ValueError(f"--out: {_names(blocked)} in {self.out} is a folder, where this run writes a file; "
                             "move it away or pick another --out")
        earlier = [p.name for p in self.earlier()]
        for n in names:
            _fsync(new_dir / n)
        _fsync(new_dir, directory=True)
        (self._staging / "earlier").mkdir()
        journal = {"staging": self._staging.name, "earlier": earlier, "new": names}
        try:
            with _signals_held():
                write_atomic(self.out / JOURNAL, json.dumps(journal))
                try:
                    for n in earlier:
                        os.replace(self.out / n, self._staging / "earlier" / n)
                    for n in names:
                        os.replace(new_dir / n, self.out / n)
                    _fsync(self.out, directory=True)
                except BaseException:
                    try:
                        _undo(self.out, journal)
                        os.unlink(self.out / JOURNAL)
                    except OSError:     # journal and staging stay: the next run in this folder finishes the undo
                        self._keep_staging = True
                    raise
                os.unlink(self.out / JOURNAL)          # the commit point
                # still inside: a signal held back is delivered only once the run is committed and cleaned up
                self.committed = tuple(self.out / n for n in names)
                shutil.rmtree(self._staging, ignore_errors=True)
        except BaseException as e:   # a signal held back during the commit is delivered once it is done
            if self.committed is not None:
                e.dartree_committed = str(self.out)   # the CLI says the results were written all the same
            raise
        return self.committed

    def close(self) -> None:
        """Remove what was staged and not committed; release the lock (idempotent; signals held meanwhile)."""
        if self._lock_fd is None:
            return
        with _signals_held():
            if self.committed is None and not self._keep_staging:
                shutil.rmtree(self._staging, ignore_errors=True)
            fd, self._lock_fd = self._lock_fd, None
            os.close(fd)                # closing the descriptor releases the flock
            if self.committed is None:
                _remove_empty(self._created)

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _missing_folders(out: Path) -> list[Path]:
    """``out`` and those of its parents that do not exist yet, deepest first (``..`` kept as written)."""
    missing = []
    for p in (out, *out.parents):
        if os.path.lexists(p):
            break
        missing.append(p)
    return missing


def _make_folders(out: Path, created: list[Path]) -> None:
    """Create ``out`` and its missing parents, and put in ``created`` (deepest first) each folder this call
    made, as it makes it: not a ``..`` entry, nor a folder another process made meanwhile."""
    for p in reversed(_missing_folders(out.absolute())):
        try:
            os.mkdir(p)
        except FileExistsError:
            continue
        created.insert(0, p)
    if not out.is_dir():
        os.mkdir(out)               # raises the reason (a file in the way, ...)


def _remove_empty(folders: Sequence[Path]) -> None:
    """Remove each of ``folders`` (deepest first) that is still empty: what a run that committed nothing made."""
    for p in folders:
        try:
            p.rmdir()
        except OSError:             # not empty (someone wrote there since), or gone: leave it and its parents
            return


def _lock(out: Path) -> int:
    import fcntl

    fd = os.open(out, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise ValueError(f"--out: another dartree run is writing to {out}; wait for it to finish or pick "
                             "another --out") from None
        raise
    return fd


def open_run(out: Path, patterns: Sequence[str], force: bool = False) -> RunFolder:
    """Open ``out`` for a run of the kind ``patterns`` (steps 1-3 of docs/internals.md, "Run folders"), creating
    it when missing; ``ValueError`` naming the folder when it cannot be used (earlier results need ``force``)."""
    out = Path(out)
    if os.path.lexists(out) and not out.is_dir():
        what = "a symbolic link to nothing" if out.is_symlink() and not out.exists() else "a file"
        raise ValueError(f"--out: {out} is {what}, not a folder; pick a folder")
    fd = None
    created: list[Path] = []
    try:
        _make_folders(out, created)
        try:
            fd = _lock(out)
        except ValueError:
            # another run holds the folder: it may be writing into a folder this run made a moment before it
            # (two runs creating the same new nested --out): remove nothing, or that run loses its folder too
            created.clear()
            raise
        restored = _recover(out)
        earlier = run_files(out, patterns)
        folders = [p for p in out.iterdir() if _is_folder(p) and p.name in patterns]   # fixed names only
        if folders:
            raise ValueError(f"--out: {_names(folders)} in {out} is a folder, where this run writes a file; move it "
                             "away or pick another --out")
        if earlier and not force:
            raise ValueError(f"--out: {out} already holds results of an earlier run ({_names(earlier)}); pass "
                             f"--force to replace them, or pick another --out")
        return RunFolder(out, patterns, fd, restored, created)
    except BaseException as e:
        if fd is not None:
            os.close(fd)
        _remove_empty(created)
        if isinstance(e, OSError):
            raise ValueError(f"--out: cannot write to {out}: {e.strerror or e}; pick a writable folder") from None
        raise

