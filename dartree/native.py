"""The compiled host loops of the fast backend (``dartree/_native.c``), or None.

Built by ``setup.py`` when a C compiler is present.  :func:`available`: built; :func:`enabled`: runs now
(recorded by ``dartree bench``).  Without it, with ``DARTREE_NATIVE=0``, or when the module was built from
another ``_native.c`` (:func:`stale`, with a warning), CPU builds run the tensorized builders instead
(same trees, slower).  Imports nothing from dartree.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

try:
    from dartree import _native as _module
except ImportError:  # not built (no compiler at install time): the tensorized builders run
    _module = None

__all__ = ["available", "enabled", "disabled", "lib", "stale"]

_SOURCE = Path(__file__).resolve().parent / "_native.c"


def stale(module=_module) -> bool:
    """Whether ``module`` was built from another ``dartree/_native.c`` than the one beside this file (edited
    or pulled without ``pip install -e .``); an installed wheel ships no C source: not stale."""
    if module is None or not _SOURCE.is_file():
        return False
    return getattr(module, "SOURCE", None) != hashlib.sha256(_SOURCE.read_bytes()).hexdigest()[:16]


if stale():  # its loops may no longer be the ones the Python side expects: never run them
    warnings.warn("dartree._native was built from an older dartree/_native.c: the tensorized builders "
                  "run instead (rebuild with `pip install -e .` or `make setup`)", RuntimeWarning, stacklevel=2)
    _module = None

_lib: ModuleType | None = _module if os.environ.get("DARTREE_NATIVE", "1") != "0" else None


def available() -> bool:
    """Whether the compiled module was built and imports."""
    return _module is not None


def enabled() -> bool:
    """Whether the compiled loops run now (built, and not turned off)."""
    return _lib is not None


def lib() -> ModuleType | None:
    """The compiled module when enabled, else None."""
    return _lib


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Run without the compiled loops inside the ``with`` block (tests compare both; not thread-safe)."""
    global _lib
    previous, _lib = _lib, None
    try:
        yield
    finally:
        _lib = previous
