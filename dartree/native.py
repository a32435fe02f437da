"""The compiled host loops of the fast backend (``dartree/_native.c``), or None.

The CPU fast builders run a few small loops per depth (top-K with log q, best children, the bound, the final
selection, DDTree's heap); ``dartree._native`` runs each as one C call with numpy's results bit for bit.  It
is built by ``setup.py`` when a C compiler is present; without one, or with ``DARTREE_NATIVE=0``, callers
run numpy.  :func:`available`: built; :func:`enabled`: runs now (recorded by ``dartree bench``); a module
built from another ``_native.c`` (:func:`stale`) is not used, with a warning.  Imports nothing from dartree.
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
except ImportError:  # not built (no compiler at install time): the numpy versions run
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
    warnings.warn("dartree._native was built from an older dartree/_native.c: the numpy host loops run "
                  "instead (rebuild with `pip install -e .` or `make setup`)", RuntimeWarning, stacklevel=2)
    _module = None

_lib: ModuleType | None = _module if os.environ.get("DARTREE_NATIVE", "1") != "0" else None


def available() -> bool:
    """Whether the compiled module was built and imports."""
    return _module is not None


def enabled() -> bool:
    """Whether the compiled loops run now (built, and not turned off)."""
    return _lib is not None


def lib() -> ModuleType | None:
    """The compiled module when enabled, else None (callers then run their numpy version)."""
    return _lib


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Run the numpy versions inside the ``with`` block (tests compare both; not thread-safe)."""
    global _lib
    previous, _lib = _lib, None
    try:
        yield
    finally:
        _lib = previous
