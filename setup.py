"""Build of the one compiled module, ``dartree._native`` (host loops of the fast backend on CPU tensors).

Everything else is in pyproject.toml.  The extension is optional: without a C compiler the install
still succeeds and ``dartree.native`` falls back to the numpy implementations (slower, same results;
``dartree.native.available()`` says which one runs, and ``dartree bench`` records it).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "dartree._native",
            sources=["dartree/_native.c"],
            # IEEE float32/float64 as numpy computes it: no fused multiply-add, no fast-math.
            extra_compile_args=["-O3", "-ffp-contract=off", "-fno-fast-math"],
            optional=True,
        )
    ]
)
