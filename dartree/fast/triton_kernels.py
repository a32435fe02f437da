"""Triton kernels of the fast backend; each wrapper mirrors its torch twin in :mod:`dartree.fast.twins`.

Import this module only through :mod:`dartree.fast.ops` (lazily): ``TRITON_INTERPRET=1`` must be in
the environment before the ``@triton.jit`` functions below are defined for the CPU interpreter to
be used.  Wrappers check shapes, allocate outputs, launch; one program handles one row (or one
position) and keeps it in registers, which suits the sizes of draft trees (a few thousand nodes).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from dartree.fast.results import CandidateSet, DepthStep, GreedyWalk, TreeStructure

__all__ = ["topk_candidates", "depth_step", "top_b", "tree_structure", "greedy_walk"]

# -9223372036854775807 below is the "no entry" key: smaller than every packed key (the smallest real
# one is order32(-inf) << 32).


def _pow2(x: int) -> int:
    """The next power of two, at least 2 (the bitonic network needs one pair)."""
    return triton.next_power_of_2(max(int(x), 2))


def _log2(x: int) -> int:
    return int(x).bit_length() - 1


@triton.jit
def _pack(x, tie):
    """int64 key, larger = better: float order of x (-0.0 folded into +0.0), then smaller tie."""
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    order = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (order.to(tl.int64) << 32) | (0xFFFFFFFF - tie.to(tl.int64))


@triton.jit
def _unpack_tie(key):
    return 0xFFFFFFFF - (key & 0xFFFFFFFF)


# Bitonic top-k / sort of a 1-D power-of-two tensor, descending (after triton.language.standard.sort_impl,
# written as one function: the CPU interpreter pays for every nested jit call).  The partner of each
# element in a compare-and-swap is found with max/min over the pair axis instead of an xor reduction:
# the same network, and min/max reductions are native in the interpreter.
@triton.jit
def _top(x, LOG_N: tl.constexpr, LOG_K: tl.constexpr):
    """The 2**LOG_K largest entries of a 1-D tensor of 2**LOG_N (LOG_N >= 1), largest first."""
    if LOG_K == 0:
        out = tl.max(x, 0, keep_dims=True)
    else:
        h = tl.reshape(x, [2] * LOG_N)
        for i in tl.static_range(1, LOG_N + 1):
            n_dims: tl.constexpr = LOG_N if i <= LOG_K else LOG_N - (i - LOG_K)
            stage: tl.constexpr = i if i <= LOG_K else LOG_K
            if i > LOG_K:  # keep the larger half (bitonic top-k)
                h = tl.max(h, axis=n_dims - LOG_K)
            if i < LOG_N:
                flip = tl.reshape(tl.arange(0, 2), [1] * (n_dims - stage - 1) + [2] + [1] * stage)
            else:
                flip = 1  # the last merge sorts descending
            for s in tl.static_range(stage):
                j: tl.constexpr = stage - 1 - s
                hi = tl.max(h, n_dims - 1 - j, keep_dims=True)
                lo = tl.min(h, n_dims - 1 - j, keep_dims=True)
                partner = tl.where(h == hi, lo, hi)
                is_right = tl.reshape(tl.arange(0, 2), [1] * (n_dims - j - 1) + [2] + [1] * j)
                h = tl.where((h > partner) != (flip ^ is_right).to(tl.int1), partner, h)
        out = tl.reshape(h, [2**LOG_K])
    return out


# ----------------------------------------------------------------------------------- candidates
@triton.jit
def _topk_candidates_kernel(logits_ptr, tokens_ptr, values_ptr, rest_ptr, logq_ptr, V, K,
                            VOCAB_NORM: tl.constexpr, BLOCK_V: tl.constexpr, KP: tl.constexpr,
                            LOG_V: tl.constexpr, LOG_K: tl.constexpr):
    pos = tl.program_id(0).to(tl.int64)  # one (row, depth) position
    base = logits_ptr + pos * V
    offs = tl.arange(0, BLOCK_V)
    best = tl.full([KP], -9223372036854775807, tl.int64)
    for start in range(0, V, BLOCK_V):
        idx = start + offs
        x = tl.load(base + idx, mask=idx < V, other=0.0).to(tl.float32)
        key = tl.where(idx < V, _pack(x, idx), -9223372036854775807)
        chunk = _top(key, LOG_V, LOG_K)
        best = _top(tl.reshape(tl.join(best, chunk), [2 * KP]), LOG_K + 1, LOG_K)
    k = tl.arange(0, KP)
    keep = k < K
    kth = tl.max(tl.where(k == K - 1, best, -9223372036854775807), axis=0)
    tokens = _unpack_tie(best)
    z = tl.load(base + tokens, mask=keep, other=0.0).to(tl.float32)
    out = pos * K + k
    tl.store(tokens_ptr + out, tokens, mask=keep)
    tl.store(values_ptr + out, z, mask=keep)

    rest = tl.full([], -float("inf"), tl.float32)
    if VOCAB_NORM:  # online log-sum-exp of the tokens outside the candidates (key below the K-th)
        mx = tl.full([BLOCK_V], -float("inf"), tl.float32)
        acc = tl.zeros([BLOCK_V], tl.float32)
        for start in range(0, V, BLOCK_V):
            idx = start + offs
            x = tl.load(base + idx, mask=idx < V, other=0.0).to(tl.float32)
            out_c = (idx < V) & (_pack(x, idx) < kth)
            xv = tl.where(out_c, x, -float("inf"))
            new = tl.maximum(mx, xv)
            safe = tl.where(new == -float("inf"), 0.0, new)
            acc = acc * tl.exp(mx - safe) + tl.where(out_c, tl.exp(xv - safe), 0.0)
            mx = new
        m = tl.max(mx, axis=0)
        safe_m = tl.where(m == -float("inf"), 0.0, m)
        total = tl.sum(acc * tl.exp(mx - safe_m), axis=0)
        rest = tl.where(total > 0.0, safe_m + tl.log(total), -float("inf"))
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
    x = logits.contiguous()
    b, gamma, vocab = x.shape
    kp = _pow2(topk)
    block = max(kp, _pow2(block_v) if block_v else min(1024, _pow2(vocab)))
    dev = x.device
    tokens = torch.empty(b, gamma, topk, dtype=torch.int64, device=dev)
    values = torch.empty(b, gamma, topk, dtype=torch.float32, device=dev)
    rest = torch.empty(b, gamma, dtype=torch.float32, device=dev)
    log_q = torch.empty(b, gamma, topk, dtype=torch.float32, device=dev)
    _topk_candidates_kernel[(b * gamma,)](x, tokens, values, rest, log_q, vocab, topk,
                                          VOCAB_NORM=bool(vocab_normalize and topk < vocab), BLOCK_V=block, KP=kp,
                                          LOG_V=_log2(block), LOG_K=_log2(kp))
    return CandidateSet(tokens=tokens, logits=values, rest_lse=rest, log_q=log_q)


# ----------------------------------------------------------------------------------- selection
@triton.jit
def _depth_step_kernel(parent_ptr, logq_ptr, parents_out, ranks_out, scores_out, m, K, lq_sb, lq_sm, beta,
                       W, MKP: tl.constexpr, WP: tl.constexpr, LOG_N: tl.constexpr, LOG_W: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    f = tl.arange(0, MKP)
    valid = f < m * K
    p = f // K
    r = f % K
    ps = tl.load(parent_ptr + row * m + p, mask=valid, other=0.0)
    lq = tl.load(logq_ptr + row * lq_sb + p * lq_sm + r, mask=valid, other=0.0)
    s = (ps + lq) + beta
    key = tl.where(valid, _pack(s, f), -9223372036854775807)
    w = tl.arange(0, WP)
    kth = tl.max(tl.where(w == W - 1, _top(key, LOG_N, LOG_W), -9223372036854775807), axis=0)
    lex = -_top(tl.where(valid & (key >= kth), -f, -2147483647), LOG_N, LOG_W)  # kept flat indices, ascending
    out = w < W
    lp = lex // K
    lr = lex % K
    ps2 = tl.load(parent_ptr + row * m + lp, mask=out, other=0.0)
    lq2 = tl.load(logq_ptr + row * lq_sb + lp * lq_sm + lr, mask=out, other=0.0)
    tl.store(parents_out + row * W + w, lp.to(tl.int64), mask=out)
    tl.store(ranks_out + row * W + w, lr.to(tl.int64), mask=out)
    tl.store(scores_out + row * W + w, (ps2 + lq2) + beta, mask=out)


def depth_step(parent_scores: Tensor, log_q: Tensor, beta: float, width: int) -> DepthStep:
    """Triton twin of :func:`dartree.fast.twins.depth_step`."""
    b, m = parent_scores.shape
    if log_q.dim() != 3 or log_q.shape[0] != b or log_q.shape[1] not in (1, m):
        raise ValueError(f"log_q: expected [{b}, {m} or 1, K], got {tuple(log_q.shape)}")
    topk = log_q.shape[-1]
    if not 1 <= width <= m * topk:
        raise ValueError(f"width: {width} outside 1..{m * topk} (branches x candidates)")
    ps = parent_scores.float().contiguous()
    lq = log_q.float().contiguous()
    dev = ps.device
    parents = torch.empty(b, width, dtype=torch.int64, device=dev)
    ranks = torch.empty(b, width, dtype=torch.int64, device=dev)
    scores = torch.empty(b, width, dtype=torch.float32, device=dev)
    stride_m = 0 if lq.shape[1] == 1 else topk
    _depth_step_kernel[(b,)](ps, lq, parents, ranks, scores, m, topk, lq.shape[1] * topk, stride_m, float(beta),
                             width, MKP=_pow2(m * topk), WP=_pow2(width), LOG_N=_log2(_pow2(m * topk)),
                             LOG_W=_log2(_pow2(width)))
    return DepthStep(parents=parents, ranks=ranks, scores=scores)


@triton.jit
def _top_b_kernel(scores_ptr, out_ptr, N, B, NP: tl.constexpr, BP: tl.constexpr, LOG_N: tl.constexpr,
                  LOG_B: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    f = tl.arange(0, NP)
    s = tl.load(scores_ptr + row * N + f, mask=f < N, other=0.0)
    key = tl.where(f < N, _pack(s, f), -9223372036854775807)
    best = _top(key, LOG_N, LOG_B)
    j = tl.arange(0, BP)
    tl.store(out_ptr + row * B + j, _unpack_tie(best), mask=j < B)


def top_b(scores: Tensor, budget: int) -> Tensor:
    """Triton twin of :func:`dartree.fast.twins.top_b`."""
    b, n = scores.shape
    if not 1 <= budget <= n:
        raise ValueError(f"budget: {budget} outside 1..{n}")
    s = scores.float().contiguous()
    out = torch.empty(b, budget, dtype=torch.int64, device=s.device)
    np_, bp = _pow2(n), _pow2(budget)
    _top_b_kernel[(b,)](s, out, n, budget, NP=np_, BP=bp, LOG_N=_log2(np_), LOG_B=_log2(bp))
    return out


# ----------------------------------------------------------------------------------- structure
@triton.jit
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


def tree_structure(parents: Tensor, num_nodes: Tensor, prefix_len: int | Tensor = 0,
                   block_rows: int = 16) -> TreeStructure:
    """Triton twin of :func:`dartree.fast.twins.tree_structure` (``block_rows`` nodes per program)."""
    b, n = parents.shape
    if num_nodes.shape != (b,):
        raise ValueError(f"num_nodes: expected [{b}], got {tuple(num_nodes.shape)}")
    dev = parents.device
    par = parents.to(torch.int64).contiguous()
    num = num_nodes.to(torch.int64).contiguous()
    prefix = torch.as_tensor(prefix_len, dtype=torch.int64, device=dev).expand(b).contiguous()
    mask = torch.empty(b, n, n, dtype=torch.int8, device=dev)
    positions = torch.empty(b, n, dtype=torch.int64, device=dev)
    first = torch.empty(b, n, dtype=torch.int64, device=dev)
    nxt = torch.empty(b, n, dtype=torch.int64, device=dev)
    bi = min(_pow2(block_rows), _pow2(n))
    _tree_structure_kernel[(b, triton.cdiv(n, bi))](par, num, prefix, mask, positions, first, nxt, n,
                                                     BI=bi, NP=_pow2(n))
    return TreeStructure(mask=mask.bool(), positions=positions, first_child=first, next_sibling=nxt)


@triton.jit
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
    dev = tokens.device
    accepted = torch.empty(b, n, dtype=torch.int64, device=dev)
    length = torch.empty(b, dtype=torch.int64, device=dev)
    bonus = torch.empty(b, dtype=torch.int64, device=dev)
    _greedy_walk_kernel[(b,)](tokens.to(torch.int64).contiguous(), parents.to(torch.int64).contiguous(),
                              num_nodes.to(torch.int64).contiguous(), picks.to(torch.int64).contiguous(),
                              accepted, length, bonus, n, NP=_pow2(n))
    return GreedyWalk(accepted=accepted, accepted_length=length, bonus=bonus)

