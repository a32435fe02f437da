"""No host-device synchronisation inside a fast build, proven on the CPU with the ``meta`` device.

A meta tensor has a shape and a dtype but no data, so every data-dependent host read (``.item()``,
``bool(t)``, ``.tolist()``, ``.cpu()``, ``nonzero`` and other ops whose output shape depends on
data) is one that would synchronise with a CUDA device.  :class:`SyncSpy` (a TorchDispatchMode)
intercepts those ops, records where in the Python code they came from, and answers with a
placeholder so the build can go on.  A build may make exactly one: ``collect`` at the end of
``TreeBuilder.build``, which reads every deferred input check (NaN / inf logits, NaN from a head,
too few finite logits) at once (on purpose, documented in ``dartree.fast.checks``).
``sequential-heap`` syncs once per pop by design
(documented) and serves as the positive control: the spy must see it.

Paths: the Triton wrappers (what CUDA tensors take), recorded without running (``execute=False``,
nothing can run on meta), and the torch twins (``ops.force_backend("torch")``).
"""

from __future__ import annotations

import traceback

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dartree import BUILDERS, DraftBlock, make_builder
from dartree.fast import ops
from dartree.testing import PathHashHead
from tests.strategies import random_logits

aten = torch.ops.aten
# Ops whose result is a host value or whose output shape depends on the data.
SYNC_OPS = {aten._local_scalar_dense.default, aten.is_nonzero.default, aten.equal.default, aten.allclose.default,
            aten.nonzero.default, aten.masked_select.default, aten._unique2.default, aten.unique_dim.default,
            aten.unique_consecutive.default, aten.repeat_interleave.Tensor, aten.argwhere.default}
ALLOWED = {"collect"}  # the one sync of TreeBuilder.build (dartree.fast.checks), on purpose
NO_SYNC_BUILDERS = [name for name in BUILDERS if name != "sequential-heap"]


class SyncSpy(TorchDispatchMode):
    """Record every host-sync op on a non-CPU tensor (with the innermost dartree frame) and fake its result."""

    def __init__(self, truth: bool = True) -> None:
        super().__init__()
        self.truth = truth  # what a faked boolean host read answers
        self.syncs: list[tuple[str, str]] = []  # (op, "file:line in function")

    def _site(self) -> str:
        frames = [f for f in traceback.extract_stack() if "/dartree/" in f.filename and "/tests/" not in f.filename]
        return f"{frames[-1].filename.split('/dartree/')[-1]}:{frames[-1].lineno} in {frames[-1].name}" if frames \
            else "outside dartree"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        on_device = any(t.device.type != "cpu" for t in tensors)
        to_host = (func in (aten._to_copy.default, aten.copy_.default)
                   and torch.device(kwargs.get("device") or args[0].device).type == "cpu" and on_device)
        if on_device and (func in SYNC_OPS or to_host):
            self.syncs.append((str(func), self._site()))
            return _placeholder(func, args, kwargs, self.truth)
        return func(*args, **kwargs)

    def unexpected(self, allowed: set[str] = ALLOWED) -> list[tuple[str, str]]:
        """Syncs made from functions other than ``allowed``."""
        return [s for s in self.syncs if s[1].rsplit(" in ", 1)[-1] not in allowed]


def _placeholder(func, args, kwargs, truth: bool = True):
    """A result of the right kind for an intercepted op (the build only needs to go on)."""
    x = args[0]
    if func in (aten._local_scalar_dense.default,):
        return truth if x.dtype == torch.bool else (0.0 if x.is_floating_point() else 0)
    if func in (aten.is_nonzero.default, aten.equal.default, aten.allclose.default):
        return truth
    if func in (aten._to_copy.default, aten.copy_.default):
        return torch.zeros(x.shape, dtype=kwargs.get("dtype") or x.dtype)
    return torch.zeros((0, x.dim()) if func in (aten.nonzero.default, aten.argwhere.default) else (0,),
                       dtype=torch.int64, device=x.device)


CONFIGS = {"chain": {}, "corrected-chain": {}, "ddtree": {"budget": 30}, "corrected-chain-ddtree": {"budget": 30},
           "dartree-fixed": {"budget": 30}, "dartree-pruned": {"budget": 30, "width": 6},
           "sequential-heap": {"budget": 12}, "sequoia": {"budget": 30}, "corrected-sequoia": {"budget": 30}}


def meta_block(b: int = 3, gamma: int = 5, vocab: int = 200) -> DraftBlock:
    block = DraftBlock(logits=random_logits(2, (b, gamma, vocab), False), root=torch.tensor([1, 2, 3][:b]))
    return DraftBlock(logits=block.logits.to("meta"), root=block.root.to("meta"))


def build_under_spy(name: str, backend: str, truth: bool = True, **cfg) -> SyncSpy:
    builder = make_builder(name, backend="fast", **{"topk": 8, **CONFIGS[name], **cfg})
    head = PathHashHead() if builder.needs_head else None
    spy = SyncSpy(truth)
    with ops.force_backend(backend), spy:
        if backend == "triton":
            from dartree.fast import triton_kernels

            with triton_kernels.record_launches(execute=False) as launches:
                builder.build(meta_block(), head)
            assert launches, "the Triton path launched nothing"
        else:
            builder.build(meta_block(), head)
    return spy


@pytest.mark.parametrize("name", NO_SYNC_BUILDERS)
def test_no_host_sync_on_the_triton_path(name: str) -> None:
    """What a CUDA build runs: Triton wrappers and torch glue; the only sync reads the deferred checks."""
    spy = build_under_spy(name, "triton")
    assert spy.unexpected() == []
    assert [s[1].rsplit(" in ", 1)[-1] for s in spy.syncs] == ["collect"]


@pytest.mark.parametrize("name", NO_SYNC_BUILDERS)
def test_no_host_sync_on_the_torch_twin_path(name: str) -> None:
    """The twins on a non-CPU device (benchmarks run them on CUDA as the "fast (torch)" provider)."""
    spy = build_under_spy(name, "torch")
    assert spy.unexpected() == []


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_the_spy_sees_the_documented_syncs_of_sequential_heap(backend: str) -> None:
    """Positive control: sequential-heap reads popped nodes on the host; the spy must report it."""
    spy = build_under_spy("sequential-heap", backend, truth=False)  # its eager input checks read "no bad value"
    assert any("fast/heap.py" in site for _, site in spy.unexpected()), spy.syncs


def test_the_spy_sees_an_item_call() -> None:
    x = torch.ones(3, device="meta")
    with SyncSpy() as spy:
        x.sum().item()
        bool((x > 0).any())
        x.nonzero()
        x.cpu()
    assert [op for op, _ in spy.syncs] == ["aten._local_scalar_dense.default"] * 2 + ["aten.nonzero.default",
                                                                                     "aten._to_copy.default"]
