"""Fast ``sequential-heap``: exact node-wise best-first search under corrected scores.

Sequential by nature (the head scores one popped node at a time, and the next node's depth is data), so the
device does only the head calls: rows pop one node each per step, one head call per step and depth (the
fused ``advance_logits``, or two calls; the last popped node is never advanced); children's log q and
scores are computed on the host (:func:`dartree.scoring.log_normalize_host`) and sorted by score, ties by
rank; the frontier, a ``heapq`` keyed by ``(-score, rank path)`` (the total order), holds only the best
unpopped child of each expanded node (its next sibling is pushed when it is popped).
"""

from __future__ import annotations

import heapq

import numpy as np
import torch
from torch import Tensor

from dartree.block import DraftBlock, check_logits
from dartree.fast.heads import head_advance_logits
from dartree.fast.widths import trie_size
from dartree.protocols import CorrectionHead
from dartree.scoring import check_candidate_logits, log_normalize_host
from dartree.tree import PAD, DraftTree

__all__ = ["sequential_heap"]

Entry = tuple[float, tuple[int, ...], int, int]  # (-score, rank path, source list, cursor)


def _candidates(block: DraftBlock, topk: int, normalize: str) -> tuple[Tensor, np.ndarray, np.ndarray | None]:
    """Candidate tokens (on the block's device) and, on the host, their tokens and ``rest_lse``
    (None: -inf everywhere)."""
    from dartree.fast import host_builders, ops

    if ops.builders(block.logits) is host_builders:  # the compiled candidates
        c = host_builders.HostCandidates(block, topk, normalize)
        return c.tokens_t, c.tokens, c.rest
    from dartree.fast.core import candidate_set

    check_logits("block.logits", block.logits)  # this builder syncs per pop anyway: check now
    c = candidate_set(block, topk, normalize)
    check_candidate_logits(c.logits)
    return c.tokens, c.tokens.cpu().numpy(), c.rest_lse.cpu().numpy()  # sync, once per build


def sequential_heap(block: DraftBlock, head: CorrectionHead, config) -> DraftTree:
    """Exact best-first under corrected scores: pop a node, run the head on it alone, push its children."""
    cand_t, cand_tokens, rest = _candidates(block, config.topk, config.normalize)
    b, gamma, topk = cand_tokens.shape
    dev = block.device
    n_out = trie_size(topk, gamma, config.budget)
    root_state = head.initial_state(block)                          # [b, S]
    states = root_state.new_zeros((b, n_out, root_state.shape[-1]))  # head state of expanded node t
    states[:, 0] = root_state
    all_rows = torch.arange(b, device=dev)
    cand_host = cand_tokens.tolist()

    heaps: list[list[Entry]] = [[] for _ in range(b)]
    siblings: list[list[tuple[list[float], list[int]]]] = [[([], [])] * n_out for _ in range(b)]
    paths: list[list[tuple[int, ...]]] = [[()] for _ in range(b)]
    out = np.zeros((5, b, n_out + 1), dtype=np.float64)  # tokens, parents, depths, scores, ranks
    out[0, :, 0] = block.root.cpu().numpy()
    out[1, :, 0] = out[4, :, 0] = PAD
    node_scores = out[3]

    def open_lists(t: int, sources: list[int], tokens: list[int]) -> None:
        """Expand node t of every row: advance the head to it, score its children, sort them."""
        groups: dict[int, list[int]] = {}
        for r in range(b):
            depth = len(paths[r][t])
            if depth < gamma:
                groups.setdefault(depth, []).append(r)
        for depth, members in groups.items():
            whole = len(members) == b
            rows = all_rows if whole else torch.tensor(members, device=dev)
            sel: Tensor | slice = slice(None) if whole else rows  # plain slicing when every row is here
            sub = block if whole else block.rows(rows)
            if t == 0:
                logits = head.logits(sub, 1, states[sel, :1], cand_t[sel, 0])
            else:
                src = torch.tensor([sources[r] for r in members], device=dev)
                tok = torch.tensor([[tokens[r]] for r in members], device=dev)
                state, logits = head_advance_logits(head, sub, depth, states[rows, src][:, None], tok,
                                                    cand_t[sel, depth])
                states[sel, t] = state[:, 0]
            z = logits[:, 0].detach().float().cpu().numpy()  # sync, once per pop (see above)
            if not np.isfinite(z).all():
                raise ValueError("head.logits: must be finite (found NaN or inf)")
            log_q = log_normalize_host(z, None if rest is None else rest[members, depth])
            parent = node_scores[members, t].astype(np.float32)
            scores = (parent[:, None] + log_q) + np.float32(0.0)
            # Siblings by corrected score, ties by rank (the total order among siblings): a stable sort.
            order = np.argsort(-scores, axis=1, kind="stable")
            ordered = np.take_along_axis(scores, order, 1).tolist()
            ranks = order.tolist()
            for i, r in enumerate(members):
                siblings[r][t] = (ordered[i], ranks[i])
                heapq.heappush(heaps[r], (-ordered[i][0], paths[r][t] + (ranks[i][0],), t, 0))

    open_lists(0, [], [])
    for t in range(1, n_out + 1):
        sources, tokens = [], []
        for r in range(b):
            neg, path, src, pos = heapq.heappop(heaps[r])
            if pos + 1 < topk:  # the popped node's next sibling enters the frontier
                scores, ranks = siblings[r][src]
                heapq.heappush(heaps[r], (-scores[pos + 1], paths[r][src] + (ranks[pos + 1],), src, pos + 1))
            token = cand_host[r][len(path) - 1][path[-1]]
            out[:, r, t] = (token, src, len(path), -neg, path[-1])
            paths[r].append(path)
            sources.append(src)
            tokens.append(token)
        if t < n_out:  # the last popped node's children could never be selected
            open_lists(t, sources, tokens)

    ints = torch.from_numpy(out[[0, 1, 2, 4]].astype(np.int64)).to(dev)
    return DraftTree(tokens=ints[0], parents=ints[1], depths=ints[2],
                     scores=torch.from_numpy(out[3].astype(np.float32)).to(dev), ranks=ints[3],
                     num_nodes=torch.full((b,), n_out + 1, dtype=torch.int64, device=dev))
