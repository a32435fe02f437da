"""Triton kernels of the fast backend; each wrapper mirrors its torch twin in :mod:`dartree.fast.twins`.

Import only through :mod:`dartree.fast.ops` (lazily: ``TRITON_INTERPRET=1`` must be set before the
``@triton.jit`` functions are defined).  Wrappers check shapes and the design limits (:data:`LIMITS`: they
raise rather than truncate), allocate outputs and launch through :func:`_launch` (observable by
:func:`record_launches`).  Limits and specialisation: docs/kernels.md, "Compiling for GPUs".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from dartree.fast.results import CandidateSet, DepthStep, GreedyWalk, TreeStructure, check_depth_step
from dartree.scoring import rest_shift

__all__ = ["LIMITS", "OPS", "Launch", "TensorArg", "supports", "record_launches", "topk_candidates", "depth_step",
           "top_b", "tree_structure", "greedy_walk"]

OPS: tuple[str, ...] = ("topk_candidates", "depth_step", "top_b", "tree_structure", "greedy_walk")
# Largest sizes each kernel is designed for (docs/kernels.md); int32 bounds the streamed sizes.
LIMITS: dict[str, int] = {"topk": 512, "width": 512, "budget": 512, "nodes": 4096, "flat": 2**31 - 1}
TILE = 1024  # elements of a streamed tile (vocabulary, children, supertree nodes)
# -9223372036854775807 in the kernels is the "no entry" key: below every packed key (the smallest real
# one is order32(-inf) << 32).


def _pow2(x: int) -> int:
    """The next power of two, at least 2 (the bitonic network needs one pair)."""
    return triton.next_power_of_2(max(int(x), 2))


def _log2(x: int) -> int:
    return int(x).bit_length() - 1


def _warps(network: int) -> int:
    """Warps for a program that sorts ``network`` keys: about 2 keys per thread, 4..16 warps (few keys per
    thread keep the unrolled network small: ptxas spends minutes on 8 int64 keys per thread, seconds on 2)."""
    return max(4, min(16, network // 64))


# ----------------------------------------------------------------------------------- launches
@dataclass(frozen=True)
class TensorArg:
    """What a kernel is specialised on for a tensor argument: its dtype (alignment is not used)."""

    dtype: torch.dtype

    def data_ptr(self) -> int:  # read by Triton's specialisation (alignment), which is disabled here
        return 0


@dataclass(frozen=True)
class Launch:
    """One kernel launch: the kernel's name, grid, runtime arguments (tensors as :class:`TensorArg`),
    constexprs and ``num_warps``; everything ``triton.compile`` needs besides the target."""

    kernel: str
    grid: tuple[int, ...]
    args: tuple[object, ...]
    constexprs: tuple[tuple[str, int], ...]
    num_warps: int

    def key(self) -> tuple:
        """The compiled variant this launch needs: kernel, argument types, constexprs, warps."""
        types = tuple(a.dtype if isinstance(a, TensorArg) else type(a).__name__ for a in self.args)
        return self.kernel, types, self.constexprs, self.num_warps


_recorders: list[tuple[list[Launch], bool]] = []


@contextlib.contextmanager
def record_launches(execute: bool = True) -> Iterator[list[Launch]]:
    """Collect every kernel launch made inside the block; ``execute=False`` records without running
    (so that wrappers can be called on ``meta`` tensors of any size to learn their launches)."""
    launches: list[Launch] = []
    _recorders.append((launches, execute))
    try:
        yield launches
    finally:
        _recorders.remove((launches, execute))


def _launch(kernel, grid: tuple[int, ...], args: tuple, num_warps: int, **constexprs: int) -> None:
    run = True
    for launches, execute in _recorders:
        spec = tuple(TensorArg(a.dtype) if isinstance(a, Tensor) else a for a in args)
        launches.append(Launch(kernel.__name__, grid, spec, tuple(sorted(constexprs.items())), num_warps))
        run = run and execute
    if run:
        kernel[grid](*args, num_warps=num_warps, **constexprs)


def supports(op: str, *args) -> bool:
    """Whether the kernel of ``op`` is designed for these arguments (the op's own signature); the wrappers
    raise where it is not, and :mod:`dartree.fast.ops` sends such calls to the torch twin."""
    if op == "topk_candidates":
        logits, topk = args[0], args[1]
        return topk <= LIMITS["topk"] and logits.shape[-1] <= LIMITS["flat"]
    if op == "depth_step":
        parent_scores, log_q, width = args[0], args[1], args[3]
        return width <= LIMITS["width"] and parent_scores.shape[1] * log_q.shape[-1] <= LIMITS["flat"]
    if op == "top_b":
        scores, budget = args[0], args[1]
        return budget <= LIMITS["budget"] and scores.shape[1] <= LIMITS["flat"]
    if op in ("tree_structure", "greedy_walk"):
        return args[0].shape[1] <= LIMITS["nodes"]
    raise ValueError(f"op: must be one of {OPS}, got {op!r}")


def _check(op: str, *args) -> None:
    if not supports(op, *args):
        raise ValueError(f"{op}: sizes beyond the Triton kernel's design (LIMITS = {LIMITS}); use the torch twin")


# ------------------------------------------------------------------------------------ keys

@triton.jit
def _pack(x, tie):
    """int64 key, larger = better: float order of x (-0.0 folded into +0.0), then smaller tie."""
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    order = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (order.to(tl.int64) << 32) | (0xFFFFFFFF - tie.to(tl.int64))


@triton.jit
def _unpack_tie(key):
    return 0xFFFFFFFF - (key & 0xFFFFFFFF)


# Bitonic top-k / sort of a 1-D power-of-two tensor (after triton.language.standard.sort_impl, written
# as few functions: the CPU interpreter pays for every nested jit call).  The tensor is viewed as a
# hypercube [2] * n; the partner of each element in a compare-and-swap along one axis is the sum over
# that axis less the element itself (int64 wraps, exactly): one native reduction, where sort_impl's
# xor reduction runs as Python in the interpreter and a max/min pair doubles the shuffles ptxas sees.
# Compiler rules kept here: no named constexpr rebound inside a static loop ("constexpr cannot be
# reassigned"), and no Python min/max on constexprs (the compiler maps them to tl.minimum/maximum).
@triton.jit
def _merge_runs(h, flip, OUTER: tl.constexpr, RUN: tl.constexpr):
    """Bitonic merge of the runs of 2**RUN keys of a hypercube ``h`` of OUTER + RUN dims (the run is
    the inner RUN dims); ``flip`` (broadcast like h) is 1 where a run sorts descending."""
    for s in tl.static_range(RUN):  # compare-and-swap along axis OUTER + s
        partner = tl.sum(h, OUTER + s, keep_dims=True) - h  # the pair's sum less oneself (wraps exactly)
        is_right = tl.reshape(tl.arange(0, 2), [1] * (OUTER + s) + [2] + [1] * (RUN - 1 - s))
        h = tl.where((h > partner) != (flip ^ is_right).to(tl.int1), partner, h)
    return h


@triton.jit
def _top(x, LOG_N: tl.constexpr, LOG_K: tl.constexpr, DESCENDING: tl.constexpr):
    """The 2**LOG_K largest entries of a 1-D tensor of 2**LOG_N (1 <= LOG_K <= LOG_N), sorted."""
    h = tl.reshape(x, [2] * LOG_N)
    for i in tl.static_range(1, LOG_K + 1):  # sort runs of 2**i, in alternating directions
        if i < LOG_N:
            h = _merge_runs(h, tl.reshape(tl.arange(0, 2), [1] * (LOG_N - i - 1) + [2] + [1] * i), LOG_N - i, i)
        else:  # the last merge sorts in the requested direction
            h = _merge_runs(h, DESCENDING, 0, i)
    for i in tl.static_range(LOG_K + 1, LOG_N + 1):  # bitonic top-k: keep the larger of two runs, re-sort
        h = tl.max(h, axis=LOG_N - i)
        if i < LOG_N:
            h = _merge_runs(h, tl.reshape(tl.arange(0, 2), [1] * (LOG_N - i - 1) + [2] + [1] * LOG_K), LOG_N - i,
                            LOG_K)
        else:
            h = _merge_runs(h, DESCENDING, 0, LOG_K)
    return tl.reshape(h, [2**LOG_K])


@triton.jit
def _merge(best, key, LOG_N: tl.constexpr, LOG_K: tl.constexpr):
    """The 2**LOG_K largest of ``best`` (2**LOG_K keys, descending) and ``key`` (2**LOG_N keys,
    LOG_N >= LOG_K >= 1), descending.

    The tile's top-k sorted ascending against ``best`` descending: the element-wise max is the top-k
    of the union and a bitonic sequence, so one bitonic merge (LOG_K steps) sorts it.
    """
    h = tl.reshape(tl.maximum(best, _top(key, LOG_N, LOG_K, 0)), [2] * LOG_K)
    return tl.reshape(_merge_runs(h, 1, 0, LOG_K), [2**LOG_K])


# ----------------------------------------------------------------------------------- candidates
@triton.jit(do_not_specialize=["V", "K"], do_not_specialize_on_alignment=["logits_ptr", "tokens_ptr", "values_ptr",
                                                                           "rest_ptr", "logq_ptr"])
def _topk_candidates_kernel(logits_ptr, tokens_ptr, values_ptr, rest_ptr, logq_ptr, V, K, scale, inv_scale,
                            VOCAB_NORM: tl.constexpr, BLOCK_V: tl.constexpr, KP: tl.constexpr,
                            LOG_V: tl.constexpr, LOG_K: tl.constexpr):
    pos = tl.program_id(0).to(tl.int64)  # one (row, depth) position
    base = logits_ptr + pos * V
    offs = tl.arange(0, BLOCK_V)
    best = tl.full([KP], -9223372036854775807, tl.int64)
    for start in range(0, V, BLOCK_V):
        idx = start + offs
        x = tl.load(base + idx, mask=idx < V, other=0.0).to(tl.float32)
        best = _merge(best, tl.where(idx < V, _pack(x, idx), -9223372036854775807), LOG_V, LOG_K)
    k = tl.arange(0, KP)
    keep = k < K
    kth = tl.max(tl.where(k == K - 1, best, -9223372036854775807), axis=0)
    tokens = _unpack_tie(best)
    z = tl.load(base + tokens, mask=keep, other=0.0).to(tl.float32)
    out = pos * K + k
    tl.store(tokens_ptr + out, tokens, mask=keep)
    tl.store(values_ptr + out, z, mask=keep)

    rest = tl.full([], -float("inf"), tl.float32)
    if VOCAB_NORM:  # dartree.scoring.rest_logsumexp, op by op: the same bits as the reference
        top = tl.max(tl.where(k == 0, z, -float("inf")), axis=0)  # the best candidate's logit
        acc = tl.zeros([BLOCK_V], tl.int64)
        for start in range(0, V, BLOCK_V):
            idx = start + offs
            x = tl.load(base + idx, mask=idx < V, other=0.0).to(tl.float32)
            out_c = (idx < V) & (_pack(x, idx) < kth)  # the tokens outside the candidates
            y = tl.maximum((x - top) * 1.4426950408889634, -127.0)  # exp2_f32_: clamp, floor, polynomial
            n = tl.floor(y)
            f = y - n
            p = f * 0.00021865784947294742 + 0.0012391331838443875  # never fused: enable_fp_fusion=False
            p = p * f + 0.009684186428785324
            p = p * f + 0.055480629205703735
            p = p * f + 0.24023045599460602
            p = p * f + 0.6931469440460205
            p = p * f + 1.0
            term = tl.where(out_c, p * ((n.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True), 0.0)
            fixed = (term.to(tl.float64) * scale + 6755399441055744.0) - 6755399441055744.0  # round to integer
            acc += fixed.to(tl.int64)
        total = tl.sum(acc, axis=0)  # exact
        safe = tl.maximum(total, 1).to(tl.float64)  # log(0) is never taken (and never warns)
        rest = tl.where(total > 0, (top.to(tl.float64) + tl.log(safe * inv_scale)).to(tl.float32), -float("inf"))
    tl.store(rest_ptr + pos, rest)

    zm = tl.max(tl.where(keep, z, -float("inf")), axis=0)
    lse = zm + tl.log(tl.sum(tl.where(keep, tl.exp(z - zm), 0.0), axis=0))
    hi = tl.maximum(lse, rest)
    lo = tl.minimum(lse, rest)
    total_lse = hi + tl.log(1.0 + tl.exp(lo - hi))
    tl.store(logq_ptr + out, z - total_lse, mask=keep)


def topk_candidates(logits: Tensor, topk: int, vocab_normalize: bool, block_v: int | None = None) -> CandidateSet:
    """Triton twin of :func:`dartree.fast.twins.topk_candidates` (``block_v``: vocabulary tile)."""
    if logits.dim() != 3 or not 1 <= topk <= logits.shape[-1]:
        raise ValueError(f"logits/topk: need [b, gamma, V] and 1 <= topk <= V, got {tuple(logits.shape)}, {topk}")
    _check("topk_candidates", logits, topk)
    x = logits.contiguous()
    b, gamma, vocab = x.shape
    kp = _pow2(topk)
    block = max(kp, _pow2(block_v) if block_v else min(TILE, _pow2(vocab)))
    dev = x.device
    tokens = torch.empty(b, gamma, topk, dtype=torch.int64, device=dev)
    values = torch.empty(b, gamma, topk, dtype=torch.float32, device=dev)
    rest = torch.empty(b, gamma, dtype=torch.float32, device=dev)
    log_q = torch.empty(b, gamma, topk, dtype=torch.float32, device=dev)
    shift = rest_shift(vocab)  # the fixed-point sum of the normaliser: powers of two, exact as float32 arguments
    _launch(_topk_candidates_kernel, (b * gamma,), (x, tokens, values, rest, log_q, vocab, topk, 2.0**shift,
                                                     2.0**-shift), _warps(2 * block),
            VOCAB_NORM=bool(vocab_normalize and topk < vocab), BLOCK_V=block, KP=kp, LOG_V=_log2(block),
            LOG_K=_log2(kp), enable_fp_fusion=False)
    return CandidateSet(tokens=tokens, logits=values, rest_lse=rest, log_q=log_q)


# ----------------------------------------------------------------------------------- selection
@triton.jit(do_not_specialize=["m", "K", "lq_sb", "lq_sm", "W"],
            do_not_specialize_on_alignment=["parent_ptr", "logq_ptr", "parents_out", "ranks_out", "scores_out"])
def _depth_step_kernel(parent_ptr, logq_ptr, parents_out, ranks_out, scores_out, m, K, lq_sb, lq_sm, beta,
                       W, BLOCK: tl.constexpr, WP: tl.constexpr, LOG_BLOCK: tl.constexpr, LOG_W: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    total = m * K  # children, flat index parent * K + rank: the tie key (branches are in lex order)
    offs = tl.arange(0, BLOCK)
    best = tl.full([WP], -9223372036854775807, tl.int64)
    for start in range(0, total, BLOCK):
        f = start + offs
        valid = f < total
        p = f // K
        r = f - p * K
        ps = tl.load(parent_ptr + row * m + p, mask=valid, other=0.0)
        lq = tl.load(logq_ptr + row * lq_sb + p * lq_sm + r, mask=valid, other=0.0)
        key = tl.where(valid, _pack((ps + lq) + beta, f), -9223372036854775807)
        best = _merge(best, key, LOG_BLOCK, LOG_W)
    w = tl.arange(0, WP)
    out = w < W
    # the W kept flat indices in ascending order (= rank-path order); entries past W sort last
    lex = -_top(tl.where(out, -_unpack_tie(best), -9223372036854775807), LOG_W, LOG_W, 1)
    lp = lex // K
    lr = lex - lp * K
    ps2 = tl.load(parent_ptr + row * m + lp, mask=out, other=0.0)
    lq2 = tl.load(logq_ptr + row * lq_sb + lp * lq_sm + lr, mask=out, other=0.0)
    tl.store(parents_out + row * W + w, lp, mask=out)
    tl.store(ranks_out + row * W + w, lr, mask=out)
    tl.store(scores_out + row * W + w, (ps2 + lq2) + beta, mask=out)


def depth_step(parent_scores: Tensor, log_q: Tensor, beta: float, width: int) -> DepthStep:
    """Triton twin of :func:`dartree.fast.twins.depth_step`."""
    b, m, topk = check_depth_step(parent_scores, log_q, width)
    _check("depth_step", parent_scores, log_q, beta, width)
    ps = parent_scores.float().contiguous()
    lq = log_q.float().contiguous()
    dev = ps.device
    parents = torch.empty(b, width, dtype=torch.int64, device=dev)
    ranks = torch.empty(b, width, dtype=torch.int64, device=dev)
    scores = torch.empty(b, width, dtype=torch.float32, device=dev)
    stride_m = 0 if lq.shape[1] == 1 else topk
    wp = _pow2(width)
    block = max(wp, min(TILE, _pow2(m * topk)))
    _launch(_depth_step_kernel, (b,), (ps, lq, parents, ranks, scores, m, topk, lq.shape[1] * topk, stride_m,
                                       float(beta), width), _warps(2 * block),
            BLOCK=block, WP=wp, LOG_BLOCK=_log2(block), LOG_W=_log2(wp))
    return DepthStep(parents=parents, ranks=ranks, scores=scores)


@triton.jit(do_not_specialize=["N", "B"], do_not_specialize_on_alignment=["scores_ptr", "out_ptr"])
def _top_b_kernel(scores_ptr, out_ptr, N, B, BLOCK: tl.constexpr, BP: tl.constexpr, LOG_BLOCK: tl.constexpr,
                  LOG_B: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    best = tl.full([BP], -9223372036854775807, tl.int64)
    for start in range(0, N, BLOCK):
        f = start + offs
        s = tl.load(scores_ptr + row * N + f, mask=f < N, other=0.0)
        best = _merge(best, tl.where(f < N, _pack(s, f), -9223372036854775807), LOG_BLOCK, LOG_B)
    j = tl.arange(0, BP)
    tl.store(out_ptr + row * B + j, _unpack_tie(best), mask=j < B)


def top_b(scores: Tensor, budget: int) -> Tensor:
    """Triton twin of :func:`dartree.fast.twins.top_b`."""
    b, n = scores.shape
    if not 1 <= budget <= n:
        raise ValueError(f"budget: {budget} outside 1..{n}")
    _check("top_b", scores, budget)
    s = scores.float().contiguous()
    out = torch.empty(b, budget, dtype=torch.int64, device=s.device)
    bp = _pow2(budget)
    block = max(bp, min(TILE, _pow2(n)))
    _launch(_top_b_kernel, (b,), (s, out, n, budget), _warps(2 * block), BLOCK=block, BP=bp,
            LOG_BLOCK=_log2(block), LOG_B=_log2(bp))
    return out


# ----------------------------------------------------------------------------------- structure
@triton.jit(do_not_specialize=["n"], do_not_specialize_on_alignment=["parents_ptr", "num_ptr", "prefix_ptr", "mask_ptr",
                                                                     "pos_ptr", "first_ptr", "next_ptr"])
def _tree_structure_kernel(parents_ptr, num_ptr, prefix_ptr, mask_ptr, pos_ptr, first_ptr, next_ptr, n,
                           BI: tl.constexpr, NP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * BI + tl.arange(0, BI)
    j = tl.arange(0, NP)
    count = tl.load(num_ptr + row)
    vi = i < count
    vj = j < count
    pj = tl.load(parents_ptr + row * n + j, mask=vj, other=-1)
    pi = tl.load(parents_ptr + row * n + i, mask=vi, other=-1)
    cur = tl.where(vi, i, -1).to(tl.int64)
    anc = tl.zeros([BI, NP], tl.int32)
    while tl.max(cur, axis=0) >= 0:  # walk every node of the block up to the root at once
        anc = anc | (j[None, :] == cur[:, None]).to(tl.int32)
        up = tl.load(parents_ptr + row * n + tl.maximum(cur, 0), mask=cur > 0, other=-1)
        cur = tl.where(cur > 0, up, -1)
    depth = tl.maximum(tl.sum(anc, axis=1) - 1, 0)
    out_i = i < n
    tl.store(mask_ptr + row * n * n + i[:, None] * n + j[None, :], anc.to(tl.int8),
             mask=out_i[:, None] & (j[None, :] < n))
    tl.store(pos_ptr + row * n + i, tl.load(prefix_ptr + row) + depth, mask=out_i)
    is_child = vj & (j > 0)
    kids = is_child[None, :] & (pj[None, :] == i[:, None])
    first = tl.min(tl.where(kids, j[None, :], NP), axis=1)
    tl.store(first_ptr + row * n + i, tl.where(vi & (first < NP), first, -1).to(tl.int64), mask=out_i)
    sibs = is_child[None, :] & (pj[None, :] == pi[:, None]) & (j[None, :] > i[:, None]) & (vi & (i > 0))[:, None]
    nxt = tl.min(tl.where(sibs, j[None, :], NP), axis=1)
    tl.store(next_ptr + row * n + i, tl.where(nxt < NP, nxt, -1).to(tl.int64), mask=out_i)


def tree_structure(parents: Tensor, num_nodes: Tensor, prefix_len: int | Tensor = 0) -> TreeStructure:
    """Triton twin of :func:`dartree.fast.twins.tree_structure` (up to 16 nodes per program)."""
    b, n = parents.shape
    if num_nodes.shape != (b,):
        raise ValueError(f"num_nodes: expected [{b}], got {tuple(num_nodes.shape)}")
    _check("tree_structure", parents, num_nodes)
    dev = parents.device
    par = parents.to(torch.int64).contiguous()
    num = num_nodes.to(torch.int64).contiguous()
    prefix = torch.as_tensor(prefix_len, dtype=torch.int64, device=dev).expand(b).contiguous()
    mask = torch.empty(b, n, n, dtype=torch.int8, device=dev)
    positions = torch.empty(b, n, dtype=torch.int64, device=dev)
    first = torch.empty(b, n, dtype=torch.int64, device=dev)
    nxt = torch.empty(b, n, dtype=torch.int64, device=dev)
    bi = min(16, _pow2(n), max(2, 8192 // _pow2(n)))  # anc: [bi, NP] int32 in registers
    _launch(_tree_structure_kernel, (b, triton.cdiv(n, bi)), (par, num, prefix, mask, positions, first, nxt, n), 4,
            BI=bi, NP=_pow2(n))
    return TreeStructure(mask=mask.bool(), positions=positions, first_child=first, next_sibling=nxt)


@triton.jit(do_not_specialize=["n"], do_not_specialize_on_alignment=["tokens_ptr", "parents_ptr", "num_ptr",
                                                                     "picks_ptr", "accepted_ptr", "length_ptr",
                                                                     "bonus_ptr"])
def _greedy_walk_kernel(tokens_ptr, parents_ptr, num_ptr, picks_ptr, accepted_ptr, length_ptr, bonus_ptr, n,
                        NP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, NP)
    count = tl.load(num_ptr + row)
    vj = (j < count) & (j > 0)
    pj = tl.load(parents_ptr + row * n + j, mask=vj, other=-1)
    tj = tl.load(tokens_ptr + row * n + j, mask=vj, other=-1)
    tl.store(accepted_ptr + row * n, tl.full([], 0, tl.int64))
    cur = tl.full([], 0, tl.int32)
    length = tl.full([], 0, tl.int32)
    pick = tl.load(picks_ptr + row * n)
    nxt = tl.min(tl.where(vj & (pj == cur) & (tj == pick), j, NP), axis=0)
    while nxt < NP:  # follow the unique child whose token is the parent's pick
        length += 1
        tl.store(accepted_ptr + row * n + length, nxt.to(tl.int64))
        cur = nxt.to(tl.int32)
        pick = tl.load(picks_ptr + row * n + cur)
        nxt = tl.min(tl.where(vj & (pj == cur) & (tj == pick), j, NP), axis=0)
    tl.store(accepted_ptr + row * n + j, tl.full([NP], -1, tl.int64), mask=(j > length) & (j < n))
    tl.store(length_ptr + row, length.to(tl.int64))
    tl.store(bonus_ptr + row, pick)


def greedy_walk(tokens: Tensor, parents: Tensor, num_nodes: Tensor, picks: Tensor) -> GreedyWalk:
    """Triton twin of :func:`dartree.fast.twins.greedy_walk`."""
    b, n = tokens.shape
    for name, t in (("parents", parents), ("picks", picks)):
        if t.shape != (b, n):
            raise ValueError(f"{name}: expected [{b}, {n}] like tokens, got {tuple(t.shape)}")
    _check("greedy_walk", tokens, parents, num_nodes, picks)
    dev = tokens.device
    accepted = torch.empty(b, n, dtype=torch.int64, device=dev)
    length = torch.empty(b, dtype=torch.int64, device=dev)
    bonus = torch.empty(b, dtype=torch.int64, device=dev)
    _launch(_greedy_walk_kernel, (b,), (tokens.to(torch.int64).contiguous(), parents.to(torch.int64).contiguous(),
                                        num_nodes.to(torch.int64).contiguous(), picks.to(torch.int64).contiguous(),
                                        accepted, length, bonus, n), 4, NP=_pow2(n))
    return GreedyWalk(accepted=accepted, accepted_length=length, bonus=bonus)

