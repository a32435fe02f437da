"""Fast ``sequential-heap``: exact node-wise best-first search under corrected scores.

The algorithm is sequential by nature: the head runs on one popped node at a time, so a build makes
about ``2 B`` head calls and at least one host-device round trip per pop (the head protocol takes the
depth as a Python int, and the depth of the next node is data).  Given that, this version keeps the
device doing only what must be there and removes everything else:

- rows are batched: every row pops one node per step, and the head is called once per step and
  depth for all rows whose popped node has that depth (one call in the usual case);
- per expansion the device scores the K children with the shared float32 formula, sorts them by
  corrected score (ties by rank: a stable sort) and hands the sorted list to the host (the one sync
  per pop);
- lazy sibling pushing: the frontier holds only the best not-yet-popped child of each expanded node
  (its next sibling is pushed when it is popped), so it never exceeds the budget;
- the frontier is a host ``heapq`` keyed by ``(-score, rank path)`` — exactly the total order —
  because a heap of a few dozen entries is cheaper on the host than any device op.  (A tensorized
  frontier with a masked lexicographic arg-max was measured about 3x slower per pop on the CPU.)
"""

from __future__ import annotations

import heapq

import torch
from torch import Tensor

from dartree.block import CorrectionHead, DraftBlock
from dartree.fast.core import candidate_set, head_advance, head_initial, head_logits
from dartree.scoring import child_scores, log_normalize
from dartree.tree import PAD, DraftTree

__all__ = ["sequential_heap", "trie_size"]

Entry = tuple[float, tuple[int, ...], int, int]  # (-score, rank path, source list, cursor)


def trie_size(topk: int, gamma: int, cap: int) -> int:
    """Draft nodes of the full candidate trie (``K + K^2 + ... + K^gamma``), capped at ``cap``."""
    total, level = 0, 1
    for _ in range(gamma):
        level *= topk
        total += level
        if total >= cap:
            return cap
    return total


def sequential_heap(block: DraftBlock, head: CorrectionHead, config) -> DraftTree:
    """Exact best-first under corrected scores: pop a node, run the head on it alone, push its children."""
    cands = candidate_set(block, config.topk, config.normalize)
    b, gamma, topk = cands.tokens.shape
    dev = block.device
    n_out = trie_size(topk, gamma, config.budget)
    cand_tokens = cands.tokens.tolist()  # sync, once per build: tokens of popped nodes are needed on the host
    root_state = head_initial(head, block)[:, 0]                   # [b, S]
    states = root_state.new_zeros((b, n_out, root_state.shape[-1]))  # head state of expanded node t
    states[:, 0] = root_state
    all_rows = torch.arange(b, device=dev)

    heaps: list[list[Entry]] = [[] for _ in range(b)]
    siblings: list[list[tuple[list[float], list[int]]]] = [[([], [])] * n_out for _ in range(b)]
    paths: list[list[tuple[int, ...]]] = [[()] for _ in range(b)]
    out = [{"tokens": [int(t)], "parents": [PAD], "depths": [0], "scores": [0.0], "ranks": [PAD]}
           for t in block.root.tolist()]

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
                state = states[sel, 0]
            else:
                src = torch.tensor([sources[r] for r in members], device=dev)
                tok = torch.tensor([[tokens[r]] for r in members], device=dev)
                state = head_advance(head, sub, depth, states[rows, src][:, None], tok)[:, 0]
                states[sel, t] = state
            logits = head_logits(head, sub, depth + 1, state[:, None], cands.tokens[sel, depth])[:, 0]  # [r, K]
            log_q = log_normalize(logits, cands.rest_lse[sel, depth])
            parent = torch.tensor([out[r]["scores"][t] for r in members], dtype=torch.float32, device=dev)
            scores = child_scores(parent[:, None], log_q[:, None], 0.0)[:, 0]
            # Siblings by corrected score, ties by rank (the total order among siblings): a stable sort.
            ordered, ranks = torch.sort(scores, dim=1, descending=True, stable=True)
            ordered_host, ranks_host = ordered.tolist(), ranks.tolist()  # sync, once per pop (see above)
            for i, r in enumerate(members):
                siblings[r][t] = (ordered_host[i], ranks_host[i])
                heapq.heappush(heaps[r], (-ordered_host[i][0], paths[r][t] + (ranks_host[i][0],), t, 0))

    open_lists(0, [], [])
    for t in range(1, n_out + 1):
        sources, tokens = [], []
        for r in range(b):
            neg, path, src, pos = heapq.heappop(heaps[r])
            if pos + 1 < topk:  # the popped node's next sibling enters the frontier
                scores, ranks = siblings[r][src]
                heapq.heappush(heaps[r], (-scores[pos + 1], paths[r][src] + (ranks[pos + 1],), src, pos + 1))
            token = cand_tokens[r][len(path) - 1][path[-1]]
            row = out[r]
            row["tokens"].append(token)
            row["parents"].append(src)
            row["depths"].append(len(path))
            row["scores"].append(-neg)
            row["ranks"].append(path[-1])
            paths[r].append(path)
            sources.append(src)
            tokens.append(token)
        if t < n_out:  # the last popped node's children could never be selected
            open_lists(t, sources, tokens)

    def field(name: str, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([row[name] for row in out], dtype=dtype, device=dev)

    return DraftTree(tokens=field("tokens", torch.int64), parents=field("parents", torch.int64),
                     depths=field("depths", torch.int64), scores=field("scores", torch.float32),
                     ranks=field("ranks", torch.int64),
                     num_nodes=torch.full((b,), n_out + 1, dtype=torch.int64, device=dev))
