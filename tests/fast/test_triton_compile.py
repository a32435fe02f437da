"""Every Triton kernel specialisation the fast path launches compiles for sm_80, sm_89 and sm_90.

The interpreter accepts code that the real compiler rejects, so the launches of the Triton path are
recorded while it runs under the interpreter on test shapes (and, without running anything, on
``meta`` tensors of the largest supported shapes), and each distinct specialisation is compiled ahead
of time with ``triton.compile`` for each target (no GPU needed; ``ptxas`` ships with triton).  A
kernel that does not compile, or a missing compiler, fails here: nothing is skipped.  Every
compilation uses a fresh cache directory.
"""

from __future__ import annotations

import pytest
import torch

from dartree import DraftBlock, make_builder
from dartree.fast import ops, triton_kernels
from dartree.fast.triton_kernels import LIMITS, Launch, record_launches
from dartree.testing import PathHashHead
from dartree.verify.accept import accept_picks
from tests.fast.triton_compile import ARCHS, compile_all, distinct, largest_launches
from tests.strategies import random_logits

KERNELS = {"_topk_candidates_kernel", "_depth_step_kernel", "_top_b_kernel", "_tree_structure_kernel",
           "_greedy_walk_kernel"}
SHARED_NO_OPT_IN = 48 * 1024  # static shared memory per block on every arch without the opt-in launch attribute


def interpreted_launches() -> list[Launch]:
    """The Triton path under the interpreter: one build (candidates, depth steps, top-B), the verification
    ops on its tree, and a vocabulary streamed in two tiles (tiny shapes: the interpreter is slow)."""
    block = DraftBlock(logits=random_logits(4, (1, 2, 13), True), root=torch.tensor([1]))
    with ops.force_backend("triton"), record_launches() as launches:
        tree = make_builder("dartree-pruned", backend="fast", budget=5, width=3, topk=4).build(block, PathHashHead())
        ops.ancestor_mask(tree.parents, tree.num_nodes)  # what verify.inputs runs on CUDA
        accept_picks(tree, torch.zeros_like(tree.tokens))
        triton_kernels.topk_candidates(random_logits(1, (1, 1, 111), False), 6, True, block_v=64)
    return launches


@pytest.fixture(scope="module")
def test_shape_launches() -> list[Launch]:
    return interpreted_launches()


def check(pairs) -> None:
    for launch, compiled in pairs:
        assert compiled.cubin_bytes > 0, (launch, compiled)
        assert compiled.shared <= SHARED_NO_OPT_IN, (launch, compiled)
        if dict(launch.constexprs).get("enable_fp_fusion") is False:  # the exact normaliser: no a*b+c fused
            assert compiled.fma_f32 == 0, (launch, compiled)
    normaliser = [c for launch, c in pairs if dict(launch.constexprs).get("VOCAB_NORM")]
    assert normaliser and all(c.fma_f32 == 0 for c in normaliser)


def test_every_kernel_is_launched_by_the_triton_path(test_shape_launches) -> None:
    assert {launch.kernel for launch in test_shape_launches} == KERNELS


def test_test_shape_specialisations_compile_for_the_newest_arch(test_shape_launches) -> None:
    """The default suite compiles the test shapes for one arch (sm_90); every arch under -m aot_full."""
    launches = distinct(test_shape_launches)
    pairs = compile_all(launches, archs=ARCHS[-1:])  # raises with the compiler's message on the first failure
    assert len(pairs) == len(launches)
    check(pairs)


@pytest.mark.aot_full
def test_test_shape_specialisations_compile_for_every_arch(test_shape_launches) -> None:
    launches = distinct(test_shape_launches)
    pairs = compile_all(launches)
    assert len(pairs) == len(launches) * len(ARCHS)
    check(pairs)


@pytest.mark.aot_full
def test_largest_supported_specialisations_compile_for_every_arch() -> None:
    launches = distinct(largest_launches())
    assert {launch.kernel for launch in launches} == KERNELS
    check(compile_all(launches))


def test_largest_launches_are_derived_from_the_wrappers() -> None:
    """The large shapes are recorded on meta tensors (nothing runs): tiles, k and warps at their limits."""
    by_kernel = {}
    for launch in largest_launches():
        by_kernel.setdefault(launch.kernel, []).append(dict(launch.constexprs) | {"warps": launch.num_warps})
    assert {"VOCAB_NORM": True, "BLOCK_V": 1024, "KP": LIMITS["topk"], "LOG_V": 10, "LOG_K": 9,
            "enable_fp_fusion": False, "warps": 16} in by_kernel["_topk_candidates_kernel"]
    assert max(c["WP"] for c in by_kernel["_depth_step_kernel"]) == LIMITS["width"]
    assert max(c["BP"] for c in by_kernel["_top_b_kernel"]) == LIMITS["budget"]
    assert max(c["NP"] for c in by_kernel["_tree_structure_kernel"]) == LIMITS["nodes"]


@pytest.mark.parametrize(("op", "args"), [
    ("topk_candidates", lambda m: (m(2, 3, 1000), LIMITS["topk"] + 1, True)),
    ("depth_step", lambda m: (m(2, 40), m(2, 40, 64), 0.0, LIMITS["width"] + 1)),
    ("top_b", lambda m: (m(2, 5000), LIMITS["budget"] + 1)),
    ("tree_structure", lambda m: (m(2, LIMITS["nodes"] + 1, dtype=torch.int64), m(2, dtype=torch.int64))),
    ("greedy_walk", lambda m: (*[m(2, LIMITS["nodes"] + 1, dtype=torch.int64)] * 2, m(2, dtype=torch.int64),
                               m(2, LIMITS["nodes"] + 1, dtype=torch.int64))),
])
def test_sizes_beyond_a_kernels_design_are_refused_not_truncated(op, args) -> None:
    def meta(*shape, dtype=torch.float32):
        return torch.empty(*shape, dtype=dtype, device="meta")

    values = args(meta)
    assert not triton_kernels.supports(op, *values)
    with record_launches(execute=False) as launches, pytest.raises(ValueError, match=f"^{op}: sizes beyond"):
        getattr(triton_kernels, op)(*values)
    assert launches == []


def test_supports_the_limits_themselves() -> None:
    meta = torch.empty(2, 3, 262144, device="meta")
    assert triton_kernels.supports("topk_candidates", meta, LIMITS["topk"], True)
    assert triton_kernels.supports("top_b", torch.empty(2, 8192, device="meta"), LIMITS["budget"])
    with pytest.raises(ValueError, match="^op"):
        triton_kernels.supports("sort", meta)


def test_dispatch_sends_sizes_beyond_a_kernels_design_to_the_twin() -> None:
    """On the Triton backend an op whose sizes exceed LIMITS runs on the torch twin (same contract), and no
    kernel is launched: nothing is truncated."""
    from dartree.fast import ops, twins

    scores = torch.randn(2, LIMITS["budget"] + 88)
    with ops.force_backend("triton"), record_launches(execute=False) as launches:
        picked = ops.top_b(scores, LIMITS["budget"] + 1)
    assert launches == []
    assert torch.equal(picked, twins.top_b(scores, LIMITS["budget"] + 1))
