"""The ``dartree`` console script: :func:`dartree.cli.main` with Ctrl-C handled
before it starts and after it ends.

Importing the command line takes a moment (argparse, the parser, the commands): a Ctrl-C then ends the process
with one line and status 130, not a ``KeyboardInterrupt`` traceback.  Once the command has ended (an
interrupt included), further Ctrl-C are ignored while the interpreter exits: a second one arriving in an exit
handler printed a traceback.  Only where SIGINT has Python's own behaviour; a handler someone installed, or
SIGINT ignored by the shell, is left alone.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

__all__ = ["main"]


def _exit_now(signum: int, frame: object) -> None:
    print("dartree: interrupted", file=sys.stderr, flush=True)
    os._exit(130)


def main() -> int:
    held = (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    if held:
        signal.signal(signal.SIGINT, _exit_now)
    from dartree.cli import main as run

    if held:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return run()
    finally:
        if held:                        # the process is ending: exit handlers run without a KeyboardInterrupt
            signal.signal(signal.SIGINT, signal.SIG_IGN)
