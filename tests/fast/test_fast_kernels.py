"""Each Triton kernel equals its torch twin (integers exactly, floats allclose), and twins equal the
reference they replace.  Without CUDA the kernels run in Triton's CPU interpreter (tests/conftest.py
sets TRITON_INTERPRET=1), which is ~1000x slower: shapes here are tiny on purpose.
"""

from __future__ import annotations

import os

import pytest
import torch

from dartree import BUILDERS, DraftBlock, DraftTree, make_builder
from dartree.fast import host, ops, twins
from dartree.fast.keys import lexsort, order32, pack, word_plan
from dartree.scoring import candidates
from dartree.structure import tree_structure
from dartree.testing import PathHashHead
from dartree.verify.accept import accept_picks
from tests.strategies import random_logits

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def on_triton(fn, *args, **kwargs):
    with ops.force_backend("triton"):
        return getattr(ops, fn)(*args, **kwargs)


def assert_equal(a, b) -> None:
    for x, y in zip(a, b, strict=True):
        if x.is_floating_point():
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)
        else:
            assert x.dtype == y.dtype and torch.equal(x.cpu(), y.cpu())


# ----------------------------------------------------------------------------------------- keys
def test_order32_is_the_float_order() -> None:
    x = torch.tensor([float("-inf"), -3.5, -1e-30, -0.0, 0.0, 1e-30, 2.0, float("inf")])
    k = order32(x)
    assert torch.equal(k[1:] >= k[:-1], torch.ones(7, dtype=torch.bool))
    assert k[3] == k[4]  # -0.0 ties with +0.0, as under float comparison
    assert (torch.diff(k)[[0, 1, 2, 4, 5, 6]] > 0).all()


def test_pack_orders_by_score_then_smaller_tie() -> None:
    scores = torch.tensor([1.0, 1.0, 2.0, -0.0, 0.0])
    key = pack(scores, torch.tensor([5, 3, 9, 1, 0]))
    assert torch.argsort(key, descending=True).tolist() == [2, 1, 0, 4, 3]


def test_word_plan_and_lexsort_give_prefix_first_lex_order() -> None:
    plan = word_plan([2**31] * 3)  # one digit per word: three words
    assert plan.num_words == 3
    paths = [(1,), (1, 2), (0, 5, 1), (0, 5), (1, 0), ()]
    words = torch.zeros(1, len(paths), 3, dtype=torch.int64)
    for i, p in enumerate(paths):
        for d, r in enumerate(p, start=1):
            words[0, i, plan.word[d]] += (r + 1) * plan.place[d]
    assert [paths[i] for i in lexsort(words)[0].tolist()] == sorted(paths)


# ---------------------------------------------------------------------------------- candidates
@pytest.mark.parametrize("vocab_normalize", [True, False])
@pytest.mark.parametrize(("shape", "topk", "block_v", "ties"),
                         [((1, 2, 111), 1, 64, True), ((1, 2, 111), 6, 64, False), ((2, 1, 13), 13, None, True)])
def test_topk_candidates_kernel_equals_twin(shape, topk, block_v, ties, vocab_normalize) -> None:
    logits = random_logits(sum(shape) + topk, shape, ties).to(DEVICE)
    twin = twins.topk_candidates(logits, topk, vocab_normalize)
    with ops.force_backend("triton"):
        from dartree.fast import triton_kernels

        kernel = triton_kernels.topk_candidates(logits, topk, vocab_normalize, block_v=block_v)
    assert_equal(twin, kernel)
    assert torch.equal(twin.logits, kernel.logits)  # gathered, not computed: exact
    ref = candidates(DraftBlock(logits=logits, root=torch.zeros(shape[0], dtype=torch.int64, device=DEVICE)), topk,
                     "vocab" if vocab_normalize else "candidates")
    assert torch.equal(twin.tokens, ref.tokens) and torch.equal(twin.logits, ref.logits)
    assert torch.equal(twin.rest_lse, ref.rest_lse)
    assert torch.equal(kernel.rest_lse.cpu(), ref.rest_lse.cpu())  # the normaliser's exact definition, op by op


@pytest.mark.parametrize("case", ["far", "masked", "two-tiles"])
def test_topk_candidates_kernel_normaliser_is_exact(case: str) -> None:
    """rest_lse of the kernel == the reference's bit for bit: terms below 2**-126, -inf logits, and a
    vocabulary streamed in several tiles (the fixed-point sum does not depend on the order)."""
    logits = random_logits(5, (1, 2, 300), False) * 4
    if case == "far":  # the 4 candidates 300 above every other token: every rest term underflows
        logits[..., :4] += 300.0
    if case == "masked":
        logits[..., ::3] = float("-inf")
    logits = logits.to(DEVICE)
    from dartree.fast import triton_kernels

    with ops.force_backend("triton"):
        kernel = triton_kernels.topk_candidates(logits, 4, True, block_v=64 if case == "two-tiles" else None)
    ref = candidates(DraftBlock(logits=logits, root=torch.zeros(1, dtype=torch.int64, device=DEVICE)), 4, "vocab")
    assert torch.equal(kernel.tokens.cpu(), ref.tokens.cpu())
    assert torch.equal(kernel.rest_lse.cpu(), ref.rest_lse.cpu())
    if case == "far":
        assert bool((kernel.rest_lse == float("-inf")).all())


def test_topk_candidates_twin_equals_scoring_on_larger_vocab() -> None:
    logits = random_logits(7, (3, 4, 5000), True)
    twin = twins.topk_candidates(logits, 64, True)
    ref = candidates(DraftBlock(logits=logits, root=torch.zeros(3, dtype=torch.int64)), 64, "vocab")
    assert torch.equal(twin.tokens, ref.tokens) and torch.equal(twin.rest_lse, ref.rest_lse)


# ---------------------------------------------------------------------------------- selection
@pytest.mark.parametrize(("m", "topk", "width", "shared"), [(1, 5, 3, False), (3, 4, 12, True), (4, 3, 5, False)])
def test_depth_step_kernel_equals_twin(m: int, topk: int, width: int, shared: bool) -> None:
    g = torch.Generator().manual_seed(m * 10 + topk)
    parents = -torch.randint(0, 3, (3, m), generator=g).float().to(DEVICE)
    log_q = -torch.randint(0, 3, (3, 1 if shared else m, topk), generator=g).float().to(DEVICE)  # many ties
    twin = twins.depth_step(parents, log_q, -0.2, width)
    kernel = on_triton("depth_step", parents, log_q, -0.2, width)
    assert_equal(twin, kernel)
    assert torch.equal(twin.scores, kernel.scores)  # (parent + log_q) + beta: the same two float additions
    # Brute force: sort every child by (score desc, flat index asc), keep width, list them by flat index.
    scores = ((parents[:, :, None] + log_q) + -0.2).expand(3, m, topk).reshape(3, -1).cpu().tolist()
    for r in range(3):
        best = sorted(range(m * topk), key=lambda f, r=r: (-scores[r][f], f))[:width]
        assert sorted(best) == (twin.parents[r] * topk + twin.ranks[r]).tolist()


@pytest.mark.parametrize(("n", "budget"), [(1, 1), (9, 4), (20, 20)])
def test_top_b_kernel_equals_twin(n: int, budget: int) -> None:
    scores = -torch.randint(0, 4, (3, n), generator=torch.Generator().manual_seed(n)).float().to(DEVICE)
    scores[0, 0] = -0.0
    twin = twins.top_b(scores, budget)
    assert torch.equal(twin.cpu(), on_triton("top_b", scores, budget).cpu())
    flat = scores.cpu().tolist()
    for r in range(3):
        assert twin[r].tolist() == sorted(range(n), key=lambda i, r=r: (-flat[r][i], i))[:budget]


# --------------------------------------------------------------------------------- structure
def small_trees() -> list[DraftTree]:
    block = DraftBlock(logits=random_logits(3, (3, 4, 20), True), root=torch.tensor([1, 2, 3]))
    return [
        make_builder("ddtree", budget=11, topk=3).build(block),
        make_builder("dartree-pruned", budget=9, width=3, topk=4).build(block, PathHashHead()),
        make_builder("chain").build(block.rows(slice(0, 2))),
    ]


def ragged(tree: DraftTree) -> DraftTree:
    """The same tree with row 0 cut to its first 3 nodes (a prefix-closed selection): padding."""
    keep = tree.valid().clone()
    keep[0, 3:] = False
    return tree.select(keep)


def reference_structure(tree: DraftTree, prefix: list[int]) -> tuple[torch.Tensor, ...]:
    """Mask, positions and links derived independently, in Python, from each row's root-to-node paths."""
    b, n = tree.tokens.shape
    mask = torch.zeros(b, n, n, dtype=torch.bool)
    positions = torch.tensor([[prefix[r]] * n for r in range(b)])
    first, nxt = torch.full((b, n), -1), torch.full((b, n), -1)
    for r in range(b):
        last: dict[int, int] = {}
        for i, path in enumerate(tree.node_paths(r)):
            mask[r, i, [0] + path] = True
            positions[r, i] = prefix[r] + len(path)
            if i:
                parent = path[-2] if len(path) > 1 else 0
                if parent in last:
                    nxt[r, last[parent]] = i
                else:
                    first[r, parent] = i
                last[parent] = i
    return mask, positions, first, nxt


def reference_walk(tree: DraftTree, picks: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The greedy walk in Python: from the root, the child whose token is the parent's pick."""
    b, n = tree.tokens.shape
    accepted = torch.full((b, n), -1)
    length, bonus = torch.zeros(b, dtype=torch.int64), torch.zeros(b, dtype=torch.int64)
    for r in range(b):
        kids = {(int(tree.parents[r, i]), int(tree.tokens[r, i])): i for i in range(1, int(tree.num_nodes[r]))}
        path = [0]
        while (path[-1], int(picks[r, path[-1]])) in kids:
            path.append(kids[(path[-1], int(picks[r, path[-1]]))])
        accepted[r, : len(path)] = torch.tensor(path)
        length[r], bonus[r] = len(path) - 1, picks[r, path[-1]]
    return accepted, length, bonus


@pytest.mark.parametrize("index", range(3))
def test_tree_structure_kernel_twin_and_host_mask_equal_the_reference(index: int) -> None:
    tree = small_trees()[index]
    for t in (tree, ragged(tree)):
        prefix = [5, 0, 7][: t.batch_size]
        ref = reference_structure(t, prefix)
        assert_equal(tree_structure(t.parents, t.num_nodes, torch.tensor(prefix)), ref)
        assert torch.equal(t.ancestor_mask(), ref[0])
        t = t.to(DEVICE)
        prefix_t = torch.tensor(prefix, device=DEVICE)
        twin = twins.tree_structure(t.parents, t.num_nodes, prefix_t)
        assert_equal(twin, ref)
        assert_equal(on_triton("tree_structure", t.parents, t.num_nodes, prefix_t), ref)
        for backend in ops.KERNEL_BACKENDS if DEVICE == "cpu" else ("torch", "triton"):
            if backend == "host" and t.parents.device.type != "cpu":
                continue
            with ops.force_backend(backend):  # what verify.inputs runs: the mask alone
                assert torch.equal(ops.ancestor_mask(t.parents, t.num_nodes).cpu(), ref[0]), backend


@pytest.mark.parametrize("index", range(3))
def test_greedy_walk_kernel_twin_and_host_equal_the_reference(index: int) -> None:
    tree = small_trees()[index]
    for t in (tree, ragged(tree)):
        g = torch.Generator().manual_seed(index)
        # Picks that follow some child at most nodes (deep walks), random elsewhere.
        picks = torch.randint(0, 20, t.tokens.shape, generator=g)
        first = reference_structure(t, [0] * t.batch_size)[2]
        follow = (first >= 0) & (torch.rand(t.tokens.shape, generator=g) < 0.8)
        picks = torch.where(follow, torch.gather(t.tokens, 1, first.clamp(min=0)), picks)
        ref = reference_walk(t, picks)
        assert_equal(host.greedy_walk(t.tokens, t.parents, t.num_nodes, picks), ref)
        out = accept_picks(t, picks)
        assert_equal((out.accepted, out.accepted_length, out.bonus), ref)
        t, picks = t.to(DEVICE), picks.to(DEVICE)
        assert_equal(twins.greedy_walk(t.tokens, t.parents, t.num_nodes, picks), ref)
        assert_equal(on_triton("greedy_walk", t.tokens, t.parents, t.num_nodes, picks), ref)


# ------------------------------------------------------------------------------------ builders
@pytest.mark.parametrize(("name", "cfg"), [("dartree-pruned", {"budget": 5, "width": 3, "topk": 4}),
                                           ("ddtree", {"budget": 6, "topk": 3, "normalize": "candidates"})])
def test_fast_builder_on_the_triton_path_equals_ref(name: str, cfg: dict) -> None:
    """Every kernel of a build on the Triton path; normalize="candidates" keeps scores exact."""
    block = DraftBlock(logits=random_logits(4, (3, 2, 13), True).to(DEVICE), root=torch.tensor([1, 2, 3]).to(DEVICE))
    head = PathHashHead() if name == "dartree-pruned" else None
    ref = make_builder(name, backend="ref", **cfg).build(block, head)
    with ops.force_backend("triton"):
        fast = make_builder(name, backend="fast", **cfg).build(block, head)
    for field in ("tokens", "parents", "depths", "scores", "ranks", "num_nodes"):
        assert torch.equal(getattr(ref, field), getattr(fast, field)), field


def test_dispatch_picks_host_on_cpu_the_twin_elsewhere_and_can_be_forced() -> None:
    x = torch.zeros(1, 2)
    assert ops.backend(x) == "host"
    assert ops.backend(torch.zeros(1, 2, device="meta")) == "torch"
    with ops.force_backend("triton"):
        assert ops.backend(x) == "triton"
    with ops.force_backend("torch"):
        assert ops.backend(x) == "torch"
    assert ops.backend(x) == "host"
    with pytest.raises(ValueError, match="name"):
        with ops.force_backend("cuda"):
            pass


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_selection_ops_reject_bad_sizes_alike(backend: str) -> None:
    scores = torch.zeros(2, 3, device=DEVICE)
    with ops.force_backend(backend):
        with pytest.raises(ValueError, match="^width"):
            ops.depth_step(scores, torch.zeros(2, 3, 2, device=DEVICE), 0.0, 7)
        with pytest.raises(ValueError, match="^log_q"):
            ops.depth_step(scores, torch.zeros(2, 2, 2, device=DEVICE), 0.0, 1)
        with pytest.raises(ValueError, match="^budget"):
            ops.top_b(scores, 4)


#: every builder, with the budget (and width) it takes
BUILDER_CONFIGS: dict[str, dict] = {
    "chain": {}, "corrected-chain": {}, "ddtree": {"budget": 32}, "corrected-chain-ddtree": {"budget": 32},
    "sequential-heap": {"budget": 16}, "dartree-fixed": {"budget": 32}, "dartree-pruned": {"budget": 32, "width": 8},
    "sequoia": {"budget": 32}, "corrected-sequoia": {"budget": 32},
}


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_every_fast_builder_on_the_device_equals_ref(device: str) -> None:
    """Every builder's fast backend on ``device`` == ref (built on the CPU), every field exact
    (normalize="candidates"): through the Triton kernels and the torch twins, and the host loops on the CPU.
    The GPU check's tests step runs it on CUDA, where the blocks go up to Qwen3's vocabulary."""
    assert set(BUILDER_CONFIGS) == set(BUILDERS)
    kernels = ("torch", "triton") if device != "cpu" else ("host", "torch")
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":   # CPU tensors reach Triton only interpreted
        kernels += ("triton",)
    shapes = [(3, 4, 111, True), (2, 6, 1000, False)]
    if device == "cuda":
        shapes += [(3, 8, 32000, False), (4, 16, 4096, True), (1, 16, 151936, False)]
    for b, gamma, vocab, ties in shapes:
        block = DraftBlock(logits=random_logits(vocab, (b, gamma, vocab), ties),
                           root=torch.randint(0, vocab, (b,), generator=torch.Generator().manual_seed(vocab)))
        on_device = DraftBlock(logits=block.logits.to(device), root=block.root.to(device))
        for name, cfg in BUILDER_CONFIGS.items():
            cfg = {"topk": 8, "normalize": "candidates", **cfg}
            head = PathHashHead() if make_builder(name).needs_head else None
            ref = make_builder(name, backend="ref", **cfg).build(block, head)
            for k in kernels:
                with ops.force_backend(k):
                    fast = make_builder(name, backend="fast", **cfg).build(on_device, head).to("cpu")
                bad = [f for f in ("tokens", "parents", "depths", "scores", "ranks", "num_nodes")
                       if not torch.equal(getattr(ref, f), getattr(fast, f))]
                assert not bad, f"{name} [{b}, {gamma}, {vocab}] fast/{k} on {device} != ref in {bad}"
