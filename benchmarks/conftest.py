"""Benchmarks run single-threaded (``torch.set_num_threads(1)``, restored afterwards): the operations
of a build are small, and intra-op threads on a shared 2-core machine only add contention noise.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
