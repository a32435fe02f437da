"""The hot operations of the fast backend, dispatched in ONE place (docs/kernels.md).

:func:`backend` picks per tensor: CPU -> ``"host"``, CUDA -> ``"triton"``, anything else (``meta``) ->
``"torch"``; :func:`force_backend` overrides it (tests run twins and kernels on CPU tensors).  The ops run
the Triton kernel (:mod:`dartree.fast.triton_kernels`, imported lazily so that ``TRITON_INTERPRET`` can be
set first) within its limits, else the torch twin (:mod:`dartree.fast.twins`); on the host, the ancestor
mask and the greedy walk, once a round each, run in numpy (a torch op costs microseconds of dispatch however
small its tensor).  :func:`builders` makes the choice for whole builds: the compiled host builders on CPU
tensors when ``dartree._native`` is built, the tensorized builders otherwise.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from types import ModuleType

from torch import Tensor

from dartree import native, structure
from dartree.fast import host, twins
from dartree.fast.results import CandidateSet, DepthStep, GreedyWalk, TreeStructure

__all__ = ["KERNEL_BACKENDS", "backend", "force_backend", "forced_backend", "builders", "topk_candidates",
           "depth_step", "top_b", "tree_structure", "ancestor_mask", "greedy_walk"]

KERNEL_BACKENDS: tuple[str, ...] = ("host", "torch", "triton")
_forced: str | None = None
_builder_modules: dict[str, ModuleType] = {}


def backend(x: Tensor) -> str:
    """``"host"`` for CPU tensors, ``"triton"`` for CUDA ones, ``"torch"`` for every other device, unless
    :func:`force_backend` is active (``"host"`` can only be forced on CPU tensors)."""
    if _forced is not None:
        return _forced
    if x.device.type == "cpu":
        return "host"
    return "triton" if x.is_cuda else "torch"


def forced_backend() -> str | None:
    """The backend :func:`force_backend` imposes now, or ``None`` (chosen by device and size)."""
    return _forced


@contextlib.contextmanager
def force_backend(name: str) -> Iterator[None]:
    """Run every op on ``name`` (one of :data:`KERNEL_BACKENDS`) inside the ``with`` block."""
    global _forced
    if name not in KERNEL_BACKENDS:
        raise ValueError(f"name: must be one of {KERNEL_BACKENDS}, got {name!r}")
    previous, _forced = _forced, name
    try:
        yield
    finally:
        _forced = previous


def _call(op: str, *args):
    """``op`` of the Triton kernels when the first argument's backend is ``"triton"`` and they are designed for
    these sizes (``triton_kernels.LIMITS``), else of the torch twins (never a truncated kernel)."""
    module = twins
    if backend(args[0]) == "triton":
        kernels = importlib.import_module("dartree.fast.triton_kernels")
        if kernels.supports(op, *args):
            module = kernels
    return getattr(module, op)(*args)


def _host(x: Tensor) -> bool:
    """Whether ``x``'s backend is ``"host"`` (only ever a CPU tensor)."""
    if backend(x) != "host":
        return False
    if x.device.type != "cpu":
        raise ValueError(f"backend: 'host' runs on CPU tensors only, got a tensor on {x.device}")
    return True


def builders(x: Tensor) -> ModuleType:
    """The builder module for a block whose logits are ``x``: the compiled host builders on the ``"host"``
    backend when ``dartree._native`` is enabled, the tensorized builders (whose ops dispatch again) otherwise."""
    name = "host_builders" if _host(x) and native.enabled() else "tensor_builders"
    module = _builder_modules.get(name)
    if module is None:  # imported once: import_module costs microseconds on every call
        module = _builder_modules[name] = importlib.import_module(f"dartree.fast.{name}")
    return module


def topk_candidates(logits: Tensor, topk: int, vocab_normalize: bool) -> CandidateSet:
    """Top-K candidates per position with log q (:func:`dartree.fast.twins.topk_candidates`).
    Shape: logits float ``[b, gamma, V]``; ``1 <= topk <= V`` -> :class:`CandidateSet` ``[b, gamma, K]``."""
    return _call("topk_candidates", logits, topk, vocab_normalize)


def depth_step(parent_scores: Tensor, log_q: Tensor, beta: float, width: int) -> DepthStep:
    """Top-``width`` children of ``m`` lex-ordered branches (:func:`dartree.fast.twins.depth_step`).
    Shape: parent_scores ``[b, m]``, log_q ``[b, m | 1, K]`` -> :class:`DepthStep` ``[b, width]``."""
    return _call("depth_step", parent_scores, log_q, beta, width)


def top_b(scores: Tensor, budget: int) -> Tensor:
    """Positions of the best ``budget`` scores, best first, ties by position.
    Shape: scores float32 ``[b, N]`` -> int64 ``[b, budget]``."""
    return _call("top_b", scores, budget)


def tree_structure(parents: Tensor, num_nodes: Tensor, prefix_len: int | Tensor = 0) -> TreeStructure:
    """Ancestor mask, positions and links of a padded tree.
    Shape: parents ``[b, n]``, num_nodes ``[b]`` -> :class:`TreeStructure`."""
    return _call("tree_structure", parents, num_nodes, prefix_len)


def ancestor_mask(parents: Tensor, num_nodes: Tensor) -> Tensor:
    """The ancestor-or-self mask of a padded tree: the Triton tree-structure kernel on CUDA, else
    :func:`dartree.structure.ancestor_mask`.  Shape: parents ``[b, n]``, num_nodes ``[b]`` -> bool ``[b, n, n]``."""
    if backend(parents) == "triton":
        return tree_structure(parents, num_nodes).mask
    return structure.ancestor_mask(parents, num_nodes)


def greedy_walk(tokens: Tensor, parents: Tensor, num_nodes: Tensor, picks: Tensor) -> GreedyWalk:
    """Greedy verification walk of a padded tree given the target's pick at each node.
    Shape: tokens, parents, picks ``[b, n]``, num_nodes ``[b]`` -> :class:`GreedyWalk`."""
    if _host(tokens):
        return host.greedy_walk(tokens, parents, num_nodes, picks)
    return _call("greedy_walk", tokens, parents, num_nodes, picks)
