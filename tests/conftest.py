"""Test-wide settings: Triton's CPU interpreter and the hypothesis profiles.

TRITON_INTERPRET must be set before any ``@triton.jit`` function is defined, so it is set here,
before the package is imported by any test module.  On a CUDA machine the real kernels run.

Hypothesis profiles: ``ci`` (default; derandomized, fixed seed, few examples, so the suite runs in
minutes) and ``long`` (many examples): ``pytest --hypothesis-profile=long`` or
``DARTREE_HYPOTHESIS_PROFILE=long``.
"""

import os

import torch
from hypothesis import HealthCheck, settings

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=50, derandomize=True, print_blob=True, **_common)
settings.register_profile("long", max_examples=500, **_common)
settings.load_profile(os.environ.get("DARTREE_HYPOTHESIS_PROFILE", "ci"))
