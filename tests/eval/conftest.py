"""Shared fixtures of the harness tests: one toy bundle (random 2-layer Qwen3 over bytes, oracle drafter
with noise, deterministic test heads), built once per session, and a one-thread torch."""

from __future__ import annotations

import pytest
import torch

from dartree.eval.bundles import Bundle, tiny_random_bundle


@pytest.fixture(autouse=True)
def _tune_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own tuning cache folder: none reads or writes the user's."""
    monkeypatch.setenv("DARTREE_CACHE_DIR", str(tmp_path_factory.mktemp("tune-cache")))


@pytest.fixture(scope="session")
def bundle() -> Bundle:
    torch.set_num_threads(1)
    return tiny_random_bundle(gamma=6)
