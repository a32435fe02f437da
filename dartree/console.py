"""The ``dartree`` console script: :func:`dartree.cli.main`, with a Ctrl-C during its import ending the process
with one line (status 130), and further Ctrl-C ignored once the command has ended (where SIGINT has Python's
own behaviour)."""

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
