"""The law suite's tiny world: a 6-token target, an overconfident drafter, the suite's false-alarm rate and the
deliberately biased verifier every powered test is shown to catch.

**False alarms.**  Every chi-square test in ``tests/law`` uses ``ALPHA = 1e-5``; there are fewer than
``TESTS = 100`` of them, so the chance that a correct decoder fails any one is below ``1e-3`` (Bonferroni).
Seeds are fixed: a passing test stays passing, run after run.

**The biased verifier.**  :func:`biased` patches the acceptance probability of the rejection verifier's real code
path (``dartree.verify.rejection._accept_probability``, which both ``verify_rejection`` and ``accept_step``
look up at call time) to ``min(1, 1.05 p / q)``: a verifier that accepts 5% too often.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import numpy as np
import torch

import dartree
from dartree.builders import builder_spec
from dartree.testing import PathHashHead
from dartree.testing.drafter import SharpDrafter
from dartree.verify import rejection
from dartree.verify.warp import Warp
from tests.verify.helpers import tiny_lm

FAMILY_ALPHA = 1e-3          # the chance that a correct decoder fails any chi-square test of the suite
TESTS = 100                  # an upper bound on the suite's chi-square tests
ALPHA = FAMILY_ALPHA / TESTS  # each test's false-alarm rate (Bonferroni)

V = 6                        # the tiny target's vocabulary
GAMMA = 3
PROMPT = torch.tensor([1, 2, 3])
SHARPNESS = 4.0              # the drafter's logits: the target's, times 4
BIAS = 1.05

# the target-side warps of the suite: T in {0.7, 1}, each filter (top-k, top-p, min-p) or none
WARPS = {
    "T1": Warp(1.0), "T0.7": Warp(0.7),
    "T1-topk3": Warp(1.0, top_k=3), "T0.7-topk3": Warp(0.7, top_k=3),
    "T1-topp0.9": Warp(1.0, top_p=0.9), "T0.7-topp0.9": Warp(0.7, top_p=0.9),
    "T1-minp0.05": Warp(1.0, min_p=0.05), "T0.7-minp0.05": Warp(0.7, min_p=0.05),
}


@functools.cache
def target() -> torch.nn.Module:
    """A 2-layer random Llama over 6 tokens, fp32, its LM head scaled so that the next-token laws are peaked
    (the most likely token ~0.6-0.9) with a tail: where a wrong acceptance rule moves the most mass."""
    model = tiny_lm("llama", "sdpa", vocab=V, max_positions=64)
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)
    return model


def builder_and_head(name: str, backend: str = "ref"):
    """The suite's configuration of a registered builder (small: budget 8, top-4 candidates, width 3) and
    dartree's test head where it needs one."""
    fields = {f.name for f in dataclasses.fields(builder_spec(name).config_cls)}
    config = {k: v for k, v in {"topk": 4, "budget": 8, "width": 3}.items() if k in fields}
    builder = dartree.make_builder(name, backend=backend, **config)
    return builder, (PathHashHead() if builder.needs_head else None)


def decoder(name: str, backend: str = "ref", model=None, **drafter_options):
    model = target() if model is None else model
    builder, head = builder_and_head(name, backend)
    drafter = SharpDrafter(model, drafter_options.pop("gamma", GAMMA), drafter_options.pop("sharpness", SHARPNESS))
    return dartree.SpeculativeDecoder(model, drafter, builder, head)


def options(warp: Warp) -> dict:
    """``generate``'s keyword arguments for ``warp``."""
    return {"temperature": warp.temperature, "top_k": warp.top_k, "top_p": warp.top_p, "min_p": warp.min_p}


def biased_accept(r: np.ndarray, s: np.ndarray, x: int) -> float:
    return 1.0 if s[x] <= 0 else min(1.0, BIAS * r[x] / s[x])


@contextlib.contextmanager
def biased():
    """The rejection verifier accepting 5% too often, in its real code path, for the ``with`` block."""
    before = rejection._accept_probability
    rejection._accept_probability = biased_accept
    try:
        yield
    finally:
        rejection._accept_probability = before
