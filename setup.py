"""Build of the one compiled module, ``dartree._native`` (host loops of the fast backend on CPU tensors).

Everything else is in pyproject.toml.  The extension is optional: without a C compiler the install
still succeeds and CPU builds run the tensorized builders (slower, same trees;
``dartree.native.available()`` says which one runs, and ``dartree bench`` records it).
"""

import hashlib
from pathlib import Path

from setuptools import Extension, setup

SOURCE = "dartree/_native.c"
# The module carries the hash of the source it was built from: dartree.native refuses a stale build.
DIGEST = hashlib.sha256(Path(__file__).resolve().parent.joinpath(SOURCE).read_bytes()).hexdigest()[:16]

setup(
    ext_modules=[
        Extension(
            "dartree._native",
            sources=[SOURCE],
            define_macros=[("DARTREE_NATIVE_SOURCE", f'"{DIGEST}"')],
            # IEEE float32/float64 as numpy computes it: no fused multiply-add, no fast-math.
            extra_compile_args=["-O3", "-ffp-contract=off", "-fno-fast-math"],
            optional=True,
        )
    ]
)
