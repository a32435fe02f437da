"""Fast ``sequential-heap``: exact node-wise best-first search under corrected scores.

The algorithm is sequential by nature: the head runs on one popped node at a time (per row).  What
this version removes is everything around it:

- rows are batched: every row pops one node per step, and the head is called once per step and
  depth for all rows whose popped node has that depth (one call in the usual case);
- lazy sibling pushing: when a node is expanded its K children are sorted once by corrected score
  (ties by rank), and only the best not-yet-popped child of each expanded node is in the frontier,
  so the frontier holds one entry per expanded node instead of K;
- the frontier is a set of tensors (score, and the rank path as mixed-radix words for ties), and the
  pop is a masked lexicographic arg-max, not a Python heap of objects.

One host-device synchronisation per pop is kept on purpose: the head protocol takes the depth as a
Python int, and the depth of a popped node is data.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dartree.block import CorrectionHead, DraftBlock
from dartree.fast.core import candidate_set, head_advance, head_initial, head_logits
from dartree.fast.keys import pack, word_plan
from dartree.scoring import child_scores, log_normalize
from dartree.tree import PAD, DraftTree

__all__ = ["sequential_heap", "trie_size"]

_NO_ENTRY = torch.iinfo(torch.int64).max


def trie_size(topk: int, gamma: int, cap: int) -> int:
    """Draft nodes of the full candidate trie (``K + K^2 + ... + K^gamma``), capped at ``cap``."""
    total, level = 0, 1
    for _ in range(gamma):
        level *= topk
        total += level
        if total >= cap:
            return cap
    return total


def _best(score: Tensor, words: Tensor) -> Tensor:
    """int64 ``[b]``: the frontier entry first in the total order (max score, then lex-smallest words).

    Shape: score float32 ``[b, L]``, words int64 ``[b, L, w]``.
    """
    cand = score == score.amax(1, keepdim=True)
    for j in range(words.shape[-1]):
        w = words[..., j].masked_fill(~cand, _NO_ENTRY)
        cand = cand & (w == w.amin(1, keepdim=True))
    return cand.to(torch.int8).argmax(1)


def sequential_heap(block: DraftBlock, head: CorrectionHead, config) -> DraftTree:
    """Exact best-first under corrected scores: pop a node, run the head on it alone, push its children."""
    cands = candidate_set(block, config.topk, config.normalize)
    b, gamma, topk = cands.tokens.shape
    dev = block.device
    n_out = trie_size(topk, gamma, config.budget)
    rows = torch.arange(b, device=dev)
    plan = word_plan([topk + 1] * gamma)
    nw = plan.num_words
    word_of = torch.tensor(plan.word + (0,), device=dev)     # by depth 0..gamma+1
    place_of = torch.tensor(plan.place + (0,), device=dev)
    word_ids = torch.arange(nw, device=dev)
    ks = torch.arange(topk, device=dev)

    # Expanded node t (t = 0: the root, t >= 1: the t-th popped node) owns sibling list t.
    lists = n_out
    sib_scores = torch.full((b, lists, topk + 1), float("-inf"), device=dev)  # column K: exhausted
    sib_ranks = torch.zeros((b, lists, topk + 1), dtype=torch.int64, device=dev)
    cursor = torch.zeros((b, lists), dtype=torch.int64, device=dev)
    front_score = torch.full((b, lists), float("-inf"), device=dev)
    front_words = torch.full((b, lists, nw), _NO_ENTRY, dtype=torch.int64, device=dev)
    own_words = torch.zeros((b, lists, nw), dtype=torch.int64, device=dev)
    own_depth = torch.zeros((b, lists), dtype=torch.int64, device=dev)
    root_state = head_initial(head, block)[:, 0]                            # [b, S]
    states = root_state.new_zeros((b, lists, root_state.shape[-1]))
    states[:, 0] = root_state

    out_tokens = torch.full((b, n_out + 1), PAD, dtype=torch.int64, device=dev)
    out_parents, out_depths, out_ranks = out_tokens.clone(), out_tokens.clone(), out_tokens.clone()
    out_scores = torch.zeros((b, n_out + 1), dtype=torch.float32, device=dev)
    out_tokens[:, 0] = block.root
    out_depths[:, 0] = 0

    def frontier_words(words: Tensor, depth: Tensor, rank: Tensor) -> Tensor:
        """Words of the child at ``depth`` with ``rank`` of a node with ``words``: one more digit."""
        digit = (rank + 1) * place_of[depth]
        return words + (word_ids == word_of[depth][:, None]).to(torch.int64) * digit[:, None]

    def open_list(t: int, src: Tensor | None, token: Tensor, depth: Tensor, score: Tensor, words: Tensor) -> None:
        """Expand node t: advance the head to it, score its children, sort them into list t."""
        depth_host = depth.tolist()  # sync (see the module docstring): the head takes an int depth
        groups: dict[int, list[int]] = {}
        for r, d in enumerate(depth_host):
            if d < gamma:
                groups.setdefault(d, []).append(r)
        for d, members in groups.items():
            if len(members) == b:
                sel: Tensor | slice = slice(None)
                sub = block
            else:
                sel = torch.tensor(members, device=dev)
                sub = block.rows(sel)
            if src is None:
                state = states[sel, t]
            else:
                parent_state = states[rows[sel], src[sel]]
                state = head_advance(head, sub, d, parent_state[:, None], token[sel][:, None])[:, 0]
                states[sel, t] = state
            logits = head_logits(head, sub, d + 1, state[:, None], cands.tokens[sel, d])[:, 0]   # [r, K]
            log_q = log_normalize(logits, cands.rest_lse[sel, d])
            scores = child_scores(score[sel, None], log_q[:, None], 0.0)[:, 0]                  # [r, K]
            order = torch.sort(pack(scores, ks), dim=1, descending=True).indices
            sib_ranks[sel, t, :topk] = order
            sib_scores[sel, t, :topk] = torch.gather(scores, 1, order)
        own_depth[:, t] = depth
        own_words[:, t] = words
        front_score[:, t] = sib_scores[:, t, 0]
        first = frontier_words(words, depth + 1, sib_ranks[:, t, 0])
        front_words[:, t] = torch.where((depth < gamma)[:, None], first, _NO_ENTRY)

    zeros = torch.zeros(b, dtype=torch.int64, device=dev)
    open_list(0, None, block.root, zeros, torch.zeros(b, device=dev), torch.zeros((b, nw), dtype=torch.int64,
                                                                                  device=dev))
    for t in range(1, n_out + 1):
        src = _best(front_score, front_words)                # the list the popped node comes from
        pos = cursor[rows, src]
        rank = sib_ranks[rows, src, pos]
        score = sib_scores[rows, src, pos]
        depth = own_depth[rows, src] + 1
        words = front_words[rows, src]
        token = cands.tokens[rows, depth - 1, rank]
        out_tokens[:, t], out_parents[:, t], out_depths[:, t] = token, src, depth
        out_scores[:, t], out_ranks[:, t] = score, rank
        # The next sibling of the popped node takes its place in the frontier.
        nxt = pos + 1
        cursor[rows, src] = nxt
        front_score[rows, src] = sib_scores[rows, src, nxt]
        nxt_words = frontier_words(own_words[rows, src], depth, sib_ranks[rows, src, nxt])
        front_words[rows, src] = torch.where((nxt < topk)[:, None], nxt_words, _NO_ENTRY)
        if t < n_out:  # the last popped node's children could never be selected
            open_list(t, src, token, depth, score, words)
    return DraftTree(tokens=out_tokens, parents=out_parents, depths=out_depths, scores=out_scores, ranks=out_ranks,
                     num_nodes=torch.full((b,), n_out + 1, dtype=torch.int64, device=dev))
