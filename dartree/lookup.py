"""A prompt-lookup (n-gram) drafter, as HF's prompt lookup: the ``gamma`` tokens that followed the most recent
earlier occurrence of the longest suffix (``max_ngram`` down to ``min_ngram`` tokens) of the context plus root.

``PromptLookupDrafter(vocab_size, gamma=4, max_ngram=3, min_ngram=1)`` reads no hidden states.  Its block
is a distribution: the proposed token has probability ``hit`` (default 0.9), the rest share ``1 - hit``
(finite logits); without a match every depth is uniform.  No model forward: a scan of the context.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from dartree.arguments import check_int, check_number
from dartree.block import DraftBlock

__all__ = ["PromptLookupDrafter"]


class PromptLookupDrafter:
    """Prompt lookup as a block drafter (module docstring): ``draft(root int64 [1])`` -> logits
    ``[1, gamma, vocab_size]``."""

    target_layer_ids: tuple[int, ...] = ()

    def __init__(self, vocab_size: int, gamma: int = 4, max_ngram: int = 3, min_ngram: int = 1,
                 hit: float = 0.9) -> None:
        for name, value, low in (("vocab_size", vocab_size, 2), ("gamma", gamma, 1), ("max_ngram", max_ngram, 1),
                                 ("min_ngram", min_ngram, 1)):
            check_int(name, value, low)
        if min_ngram > max_ngram:
            raise ValueError(f"min_ngram: {min_ngram} exceeds max_ngram {max_ngram}; allowed: <= max_ngram")
        check_number("hit", hit, lambda x: 0 < x < 1, "expected a probability with 0 < hit < 1")
        self.vocab_size, self.gamma, self.max_ngram, self.min_ngram = vocab_size, gamma, max_ngram, min_ngram
        rest = (1 - hit) / (vocab_size - 1)
        self._high, self._low = math.log(hit), math.log(rest)
        self._context: list[int] = []

    def reset(self) -> None:
        self._context = []

    def append_context(self, hidden_states: Tensor | None, tokens: Tensor) -> None:
        if tokens.dim() != 2 or tokens.shape[0] != 1:
            raise ValueError(f"tokens: expected int64 [1, m], got {tuple(tokens.shape)}")
        self._context.extend(tokens[0].tolist())

    def propose(self, sequence: list[int]) -> list[int]:
        """The tokens that followed the latest earlier occurrence of ``sequence``'s longest matching suffix."""
        seq = np.asarray(sequence, dtype=np.int64)
        n = len(seq)
        for size in range(min(self.max_ngram, n - 1), self.min_ngram - 1, -1):
            tail = seq[n - size:]
            windows = np.lib.stride_tricks.sliding_window_view(seq[: n - 1], size)
            hits = np.nonzero((windows == tail).all(axis=1))[0]
            if len(hits):
                start = int(hits[-1]) + size                   # the most recent earlier occurrence
                return seq[start: start + self.gamma].tolist()
        return []

    def draft(self, root: Tensor) -> DraftBlock:
        proposal = self.propose(self._context + [int(root[0])])
        logits = torch.full((1, self.gamma, self.vocab_size), self._low, dtype=torch.float32)
        if proposal:
            logits[0, : len(proposal)] = torch.where(
                torch.arange(self.vocab_size)[None] == torch.tensor(proposal)[:, None],
                torch.tensor(self._high), torch.tensor(self._low))
        if len(proposal) < self.gamma:                             # no proposal: uniform
            logits[0, len(proposal):] = 0.0
        return DraftBlock(logits=logits.to(root.device), root=root)
