"""User errors of the command line: what :func:`dartree.cli.main` prints as one line and exits 2 on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["UsageError", "user_input"]


class UsageError(ValueError):
    """A mistake in the command line or in what it names, printed as one line (exit status 2).  Only errors raised
    here or by a check of the user's input (:func:`user_input`) become one: any other exception is a bug."""


@contextmanager
def user_input() -> Iterator[None]:
    """Inside this block a ``ValueError`` is a check of the user's input failing: re-raise it as a UsageError."""
    try:
        yield
    except UsageError:
        raise
    except ValueError as e:
        raise UsageError(str(e)) from e
