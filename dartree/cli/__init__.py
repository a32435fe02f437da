"""The ``dartree`` command line: generate, bench, sweep, show-tree, tune (examples:
:data:`dartree.cli.parser.DESCRIPTION`, ``dartree --help``), and how it ends: a user error is one line and
status 2, Ctrl-C 130, SIGTERM / SIGHUP 128 + the signal, each after the run's cleanup."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

from dartree.cli.decode import cmd_bench, cmd_generate
from dartree.cli.helpers import UsageError
from dartree.cli.parser import PRESETS, build_parser, join_negative_values
from dartree.cli.replay import cmd_show_tree, cmd_sweep, cmd_tune
from dartree.eval.outdir import signal_handlers

__all__ = ["main", "build_parser", "load_plugins", "PLUGIN_GROUP", "PRESETS", "UsageError"]

COMMANDS = {"generate": cmd_generate, "bench": cmd_bench, "sweep": cmd_sweep, "show-tree": cmd_show_tree,
            "tune": cmd_tune}


class Terminated(BaseException):
    """SIGTERM or SIGHUP, raised in the main thread like Ctrl-C's ``KeyboardInterrupt``, so that every
    ``with`` block on the way out cleans up."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _after_commit(e: BaseException) -> str:
    """The note for a signal that arrived during a commit (delivered once the folder holds the new run)."""
    out = getattr(e, "dartree_committed", None)
    return "" if out is None else f" after the run's results were written to {out}"


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(signum)


#: modules each command needs before it starts, imported by :func:`_import_stack` (a Ctrl-C during an import
#: can leave a library half-initialized)
STACK = ("torch", "dartree.decode")
COMMAND_STACK = {"generate": STACK, **{name: (*STACK, "dartree.eval.plots") for name in COMMANDS if name != "generate"}}


def _import_stack(command: str) -> None:
    """Import the command's libraries (:data:`COMMAND_STACK`) where Ctrl-C ends the process at once with one
    line (nothing is written yet); only where Ctrl-C has Python's behaviour, else it is left alone."""
    from importlib import import_module

    def exit_now(signum: int, frame: object) -> None:
        print("dartree: interrupted", file=sys.stderr, flush=True)
        os._exit(130)

    current = signal.getsignal(signal.SIGINT)
    held = current is signal.default_int_handler or isinstance(current, _Recorder)
    with signal_handlers({signal.SIGINT: exit_now} if held else {}):
        for name in COMMAND_STACK[command]:
            import_module(name)


class _Recorder:
    """SIGINT handler: raises ``KeyboardInterrupt`` as Python's own does, and counts the interrupts."""

    def __init__(self) -> None:
        self.received = 0

    def __call__(self, signum: int, frame: object) -> None:
        self.received += 1
        raise KeyboardInterrupt


#: the entry-point group an installed package declares its dartree plugin module under
PLUGIN_GROUP = "dartree.plugins"


def load_plugins(modules: Sequence[str]) -> None:
    """Import every ``dartree.plugins`` entry point of the installed packages, then ``modules`` (``--plugin``);
    one that cannot be imported is a :class:`UsageError` naming it."""
    from importlib import import_module
    from importlib.metadata import entry_points

    for point in entry_points(group=PLUGIN_GROUP):
        try:
            point.load()
        except Exception as e:                             # a broken installed plugin: named, not a traceback
            raise UsageError(f"plugin entry point {point.name!r} ({point.value}): {type(e).__name__}: {e}") from None
    for name in modules:
        try:
            import_module(name)
        except Exception as e:
            raise UsageError(f"--plugin: cannot import {name!r}: {type(e).__name__}: {e}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dartree`` console script; returns the exit status (module docstring).  Any
    exception other than a user error is a bug and keeps its traceback; a closed stdout exits 141."""
    # Ctrl-C is recorded, so that one a library turns into another error is still one line (a handler someone
    # else installed, or SIGINT ignored, is kept)
    interrupts = _Recorder()
    with signal_handlers({signal.SIGINT: interrupts} if signal.getsignal(signal.SIGINT) is signal.default_int_handler
                         else {}):
        try:
            return _run(argv)
        except (BrokenPipeError, UsageError, KeyboardInterrupt, Terminated, SystemExit):
            raise
        except BaseException:
            if interrupts.received:                              # Ctrl-C turned into another error inside a library
                print("dartree: interrupted", file=sys.stderr, flush=True)
                raise SystemExit(130) from None
            raise


def _plugin_builder_in(tb) -> str | None:
    """The name of the plugin builder whose :meth:`~dartree.builders.TreeBuilder.build` raised, if a frame of
    ``tb`` runs one."""
    from dartree.builders import BUILDERS, TreeBuilder

    while tb is not None:
        frame = tb.tb_frame
        builder = frame.f_locals.get("self") if frame.f_code is TreeBuilder.build.__code__ else None
        if isinstance(builder, TreeBuilder) and builder.name not in BUILDERS:
            return builder.name
        tb = tb.tb_next
    return None


def _run(argv: Sequence[str] | None) -> int:
    """:func:`main` without the Ctrl-C bookkeeping: parse, import the command's libraries, load plugins, run."""
    try:
        parser = build_parser()
        args = parser.parse_args(join_negative_values(list(sys.argv[1:] if argv is None else argv)))
        args.argv = ["dartree", *(sys.argv[1:] if argv is None else argv)]     # as the results files record it
        _import_stack(args.command)                      # here, not at import: --help stays instant
        import torch

        load_plugins(args.plugin)

        # SIGTERM and SIGHUP raise Terminated where their action is the default (which ends the process without
        # cleanup); no_grad: inference only, no autograd graph through heads or drafters
        terminating = [getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]
        with signal_handlers({sig: _raise_terminated for sig in terminating
                              if signal.getsignal(sig) is signal.SIG_DFL}), torch.no_grad():
            return COMMANDS[args.command](args)
    except BrokenPipeError:
        # the reader went away (`dartree generate ... | head -c 20`): end quietly, as a pipeline expects; stdout
        # is pointed at /dev/null so that the interpreter's final flush does not raise again
        if sys.stdout is sys.__stdout__ and sys.stdout is not None:   # the process's own stdout, not a capture
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(141) from None               # 128 + SIGPIPE, what a shell reports for it
    except UsageError as e:
        print(f"dartree: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    except Exception as e:
        name = _plugin_builder_in(e.__traceback__)
        if name is None:                                   # dartree's own code: a bug, with its traceback
            raise
        print(f"dartree: error: builder {name!r} (a plugin's) raised {type(e).__name__}: {e}", file=sys.stderr,
              flush=True)
        raise SystemExit(2) from None
    except KeyboardInterrupt as e:
        print(f"dartree: interrupted{_after_commit(e)}", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    except Terminated as e:
        print(f"dartree: terminated by {signal.Signals(e.signum).name}{_after_commit(e)}", file=sys.stderr,
              flush=True)
        raise SystemExit(128 + e.signum) from None
