"""Correction-head calls of the fast builders: the optional prepared and fused calls, finite checks.

The builders get the head as the decoder's proxy (:class:`dartree.timing.TimedHead`; ``TreeBuilder.build`` wraps
any other head in one), which checks the shape, device and dtype of every output where it enters.  Non-finite
corrected logits are an error, checked without a sync per depth: docs/kernels.md, "Checks without syncs".
"""

from __future__ import annotations

import torch
from torch import Tensor

from dartree.block import DraftBlock
from dartree.fast import checks
from dartree.protocols import CorrectionHead, head_method

__all__ = ["HeadSteps", "head_advance_logits", "check_logits_finite"]


def check_logits_finite(logits: Tensor) -> None:
    """Reject NaN / inf corrected logits of the tensorized builders: deferred to the end of the build
    (the host builders check the numpy view they read instead)."""
    checks.defer(~torch.isfinite(logits).all(), "head.logits: must be finite (found NaN or inf)")


def head_advance_logits(head: CorrectionHead, block: DraftBlock, depth: int, states: Tensor, tokens: Tensor,
                        cand_tokens: Tensor) -> tuple[Tensor, Tensor]:
    """Advance ``states`` by ``tokens`` at ``depth`` and score ``C_{depth+1}``: one fused call if the head
    has ``advance_logits``, else ``advance`` then ``logits``.

    Shape:
        states ``[b, m, S]``, tokens ``[b, m]``, cand_tokens ``[b, K]`` -> (``[b, m, S]``, ``[b, m, K]``).
    """
    fused = head_method(head, "advance_logits")
    if fused is None:
        new = head.advance(block, depth, states, tokens)
        return new, head.logits(block, depth + 1, new, cand_tokens)
    return fused(block, depth, states, tokens, cand_tokens)


class HeadSteps:
    """The head calls of one depth-wise build: the root, then ``logits`` / ``advance_logits`` by depth.

    When the head has the protocol's optional ``prepare_block(block, candidates)`` and it returns an
    object, that object's calls are used (the head prepared what every depth shares once: perf, one
    call per depth with no per-call gathers on either device); otherwise the protocol calls, with
    ``candidates[:, d - 1]`` as ``C_d``.

    Shape:
        candidates: int64 ``[b, gamma, K]``.
    """

    def __init__(self, head: CorrectionHead, block: DraftBlock, candidates: Tensor) -> None:
        self.head, self.block, self.candidates = head, block, candidates
        prepare = head_method(head, "prepare_block")
        steps = None if prepare is None else prepare(block, candidates)
        if steps is not None:   # perf: instance attributes over the methods below, one Python frame less a depth
            self.logits, self.advance_logits = steps.logits, steps.advance_logits

    def initial(self) -> Tensor:
        """Root states ``[b, 1, S]``."""
        return self.head.initial_state(self.block)[:, None]

    def logits(self, depth: int, states: Tensor) -> Tensor:
        """Corrected logits ``[b, m, K]`` of ``C_depth`` after the branch states ``[b, m, S]``."""
        return self.head.logits(self.block, depth, states, self.candidates[:, depth - 1])

    def advance_logits(self, depth: int, states: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """States after ``tokens [b, m]`` at ``depth``, and the corrected logits of ``C_{depth+1}``."""
        return head_advance_logits(self.head, self.block, depth, states, tokens, self.candidates[:, depth])
