"""Kernel comparisons on the device: each op through the Triton kernel and the torch twin (and the host
version on CPU tensors), and whole builds ref (on the CPU) / fast (torch twins) / fast (Triton kernels).

    DARTREE_BENCH_DEVICE=cuda python3 -m pytest benchmarks/test_bench_device.py --benchmark-only

The GPU check's ``tests`` step runs this file (``dartree.eval.gpu_check``).  ``DARTREE_BENCH_DEVICE``:
``cuda`` (default when CUDA is visible) or ``cpu``; ``DARTREE_BENCH_QUICK=1``: fewer rounds.  On the CPU
the sizes are tiny and the Triton provider runs only under ``TRITON_INTERPRET=1`` (its times mean nothing
there: the interpreter is ~1000x slower) and only with ``DARTREE_BENCH_DEVICE`` set; in CI
(``--benchmark-disable``) each other case runs once.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch

from dartree import DraftBlock, make_builder
from dartree.fast import ops
from dartree.testing import PathHashHead

DEVICE = torch.device(os.environ.get("DARTREE_BENCH_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu"))
CUDA = DEVICE.type == "cuda"
QUICK = os.environ.get("DARTREE_BENCH_QUICK", "0") == "1"
VOCAB = 151936 if CUDA else 1000
GAMMA, TOPK = 16, (64 if CUDA else 8)
BUDGET = 64 if CUDA else 16
ROUNDS = (5 if QUICK else 15) if CUDA else (1 if QUICK else 3)   # CPU: a rehearsal of the code paths
# on the CPU the kernels run interpreted only when asked for (the GPU check's rehearsal sets DARTREE_BENCH_DEVICE),
# not in CI's pass over benchmarks/ (tests/conftest.py sets TRITON_INTERPRET=1 there: seconds a kernel)
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1" and bool(os.environ.get("DARTREE_BENCH_DEVICE"))
KERNELS = ("host", "torch") + (("triton",) if INTERPRET else ())
if CUDA:
    KERNELS = ("torch", "triton")


def _sync() -> None:
    if CUDA:
        torch.cuda.synchronize(DEVICE)


def _run(benchmark, fn, *args, rounds: int = ROUNDS):
    def call():
        out = fn(*args)
        _sync()
        return out

    return benchmark.pedantic(call, rounds=rounds, iterations=1, warmup_rounds=1)


@functools.cache
def _block(device: str) -> DraftBlock:
    g = torch.Generator().manual_seed(0)
    return DraftBlock(logits=(torch.randn(1, GAMMA, VOCAB, generator=g) * 2).to(device),
                      root=torch.zeros(1, dtype=torch.int64).to(device))


def _on(kernels: str) -> str:
    return "cpu" if kernels == "host" else str(DEVICE)


@functools.cache
def _tree(device: str):
    return make_builder("ddtree", backend="fast", budget=BUDGET, topk=TOPK).build(_block("cpu")).to(device)


@pytest.mark.parametrize("provider", KERNELS)
def test_topk_candidates(benchmark, provider: str) -> None:
    benchmark.group = f"topk_candidates [1, {GAMMA}, {VOCAB}] K={TOPK}"
    logits = _block(_on(provider)).logits
    with ops.force_backend(provider):
        out = _run(benchmark, ops.topk_candidates, logits, TOPK, True)
    assert out.tokens.shape[-1] == TOPK


@pytest.mark.parametrize("provider", KERNELS)
def test_top_b(benchmark, provider: str) -> None:
    n = GAMMA * TOPK
    benchmark.group = f"top_b N={n} B={BUDGET}"
    scores = -torch.rand(1, n, generator=torch.Generator().manual_seed(1)).to(_on(provider))
    with ops.force_backend(provider):
        out = _run(benchmark, ops.top_b, scores, BUDGET)
    assert out.shape == (1, BUDGET)


@pytest.mark.parametrize("provider", KERNELS)
def test_tree_structure(benchmark, provider: str) -> None:
    tree = _tree(_on(provider))
    benchmark.group = f"tree_structure n={tree.max_nodes}"
    with ops.force_backend(provider):
        out = _run(benchmark, ops.tree_structure, tree.parents, tree.num_nodes, 100)
    assert out.mask.shape[-1] == tree.max_nodes


@pytest.mark.parametrize("provider", KERNELS)
def test_greedy_walk(benchmark, provider: str) -> None:
    tree = _tree(_on(provider))
    benchmark.group = f"greedy_walk n={tree.max_nodes}"
    picks = torch.roll(tree.tokens, -1, dims=1)
    with ops.force_backend(provider):
        out = _run(benchmark, ops.greedy_walk, tree.tokens, tree.parents, tree.num_nodes, picks)
    assert out is not None


BUILDS = {"chain": {}, "ddtree": {"budget": BUDGET}, "dartree-pruned": {"budget": BUDGET, "width": 12}}


@pytest.mark.parametrize("provider", ("ref",) + tuple(k for k in KERNELS if k != "host"))
@pytest.mark.parametrize("name", tuple(BUILDS))
def test_build(benchmark, name: str, provider: str) -> None:
    cfg = {"topk": TOPK, **BUILDS[name]}
    benchmark.group = f"build {name} V={VOCAB}" + "".join(f" {k[0].upper()}={v}" for k, v in BUILDS[name].items())
    builder = make_builder(name, backend="ref" if provider == "ref" else "fast", **cfg)
    head = PathHashHead() if builder.needs_head else None
    block = _block("cpu" if provider == "ref" else str(DEVICE))
    if provider == "ref":               # the reference loops in Python: seconds a build at V=151936
        tree = _run(benchmark, builder.build, block, head, rounds=min(ROUNDS, 3))
    else:
        with ops.force_backend(provider):
            tree = _run(benchmark, builder.build, block, head)
    assert int(tree.num_nodes.max()) <= 1 + cfg.get("budget", GAMMA)
