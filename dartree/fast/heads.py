"""Correction-head calls of the fast builders: shape checks, the optional fused call, finite checks.

A head's outputs are checked for shape on every call (cheap, no synchronisation).  Non-finite
corrected logits are an error, as in the reference; how that is checked depends on the device:

- CPU (the host builders): immediately, on the numpy view the builder reads anyway (free);
- the tensorized builders (every other device): the flag ``~isfinite(logits).all()`` is handed to
  :func:`dartree.fast.checks.defer`, and :meth:`dartree.builders.TreeBuilder.build` reads every
  deferred flag of the build at once, after it (one host synchronisation per build, none per depth).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dartree.block import DraftBlock
from dartree.fast import checks
from dartree.protocols import CorrectionHead, head_method
from dartree.timing import TimedHead, check_steps

__all__ = ["HeadSteps", "head_initial", "head_logits", "head_advance", "head_advance_logits", "fused"]


def _check(out: Tensor, what: str, shape: tuple[int, ...], state: bool) -> Tensor:
    if not isinstance(out, Tensor):
        raise ValueError(f"head.{what}: returned {type(out).__name__}, expected a Tensor")
    if tuple(out.shape[: len(shape)]) != shape or out.dim() != len(shape) + state:
        raise ValueError(f"head.{what}: returned shape {tuple(out.shape)}, expected {list(shape)}"
                         f"{' + [S]' if state else ''}")
    return out


def check_logits_finite(logits: Tensor) -> None:
    """Reject NaN / inf corrected logits of the tensorized builders: deferred to the end of the build
    (the host builders check the numpy view they read instead)."""
    checks.defer(~torch.isfinite(logits).all(), "head.logits: must be finite (found NaN or inf)")


def head_logits(head: CorrectionHead, block: DraftBlock, depth: int, states: Tensor, cand_tokens: Tensor) -> Tensor:
    """Corrected logits ``[b, m, K]`` of ``C_depth`` after each of ``m`` branch states ``[b, m, S]``."""
    out = head.logits(block, depth, states, cand_tokens)
    return _check(out, "logits", (states.shape[0], states.shape[1], cand_tokens.shape[-1]), False)


def head_advance(head: CorrectionHead, block: DraftBlock, depth: int, states: Tensor, tokens: Tensor) -> Tensor:
    """States ``[b, m, S]`` after appending ``tokens`` ``[b, m]`` at ``depth``."""
    return _check(head.advance(block, depth, states, tokens), "advance", tuple(tokens.shape), True)


def fused(head: CorrectionHead):
    """The head's optional ``advance_logits`` method, or None (:class:`dartree.protocols.CorrectionHead`)."""
    return head_method(head, "advance_logits")


def head_advance_logits(head: CorrectionHead, block: DraftBlock, depth: int, states: Tensor, tokens: Tensor,
                        cand_tokens: Tensor) -> tuple[Tensor, Tensor]:
    """Advance ``states`` by ``tokens`` at ``depth`` and score ``C_{depth+1}``: one fused call if the head
    has ``advance_logits``, else ``advance`` then ``logits``.

    Shape:
        states ``[b, m, S]``, tokens ``[b, m]``, cand_tokens ``[b, K]`` -> (``[b, m, S]``, ``[b, m, K]``).
    """
    fn = fused(head)
    if fn is None:
        new = head_advance(head, block, depth, states, tokens)
        return new, head_logits(head, block, depth + 1, new, cand_tokens)
    return _pair("advance_logits", fn(block, depth, states, tokens, cand_tokens), tokens, cand_tokens.shape[-1])


def _pair(name: str, out, tokens: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """``(states [b, m, S], logits [b, m, k])`` returned by the fused call ``name``, shape-checked."""
    if not isinstance(out, tuple) or len(out) != 2:
        raise ValueError(f"head.{name}: returned {type(out).__name__}, expected (states, logits)")
    return _check(out[0], name, tuple(tokens.shape), True), _check(out[1], name, (*tokens.shape, k), False)


def head_initial(head: CorrectionHead, block: DraftBlock) -> Tensor:
    """Root states ``[b, 1, S]``."""
    out = head.initial_state(block)
    if not isinstance(out, Tensor) or out.dim() != 2 or out.shape[0] != block.batch_size:
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"head.initial_state: returned {got}, expected [b={block.batch_size}, S]")
    return out[:, None]


class HeadSteps:
    """The head calls of one depth-wise build: the root, then ``logits`` / ``advance_logits`` by depth.

    When the head has the protocol's optional ``prepare_block(block, candidates)`` and it returns an
    object, that object's calls are used (the head prepared what every depth shares once: perf, one
    call per depth with no per-call gathers on either device); otherwise the protocol calls, with
    ``candidates[:, d - 1]`` as ``C_d``.  Outputs are shape-checked either way.

    Shape:
        candidates: int64 ``[b, gamma, K]``.
    """

    def __init__(self, head: CorrectionHead, block: DraftBlock, candidates: Tensor) -> None:
        self.head, self.block, self.candidates = head, block, candidates
        prepare = head_method(head, "prepare_block")
        steps = None if prepare is None else prepare(block, candidates)
        self.steps = None if steps is None else check_steps(steps)
        # perf: a TimedHead (the decoder's proxy) has checked what its prepared calls return: they are called
        # directly (instance attributes over the methods below: one Python frame less a depth)
        self._checked = isinstance(head, TimedHead)
        if self._checked and self.steps is not None:
            self.logits, self.advance_logits = self.steps.logits, self.steps.advance_logits

    def initial(self) -> Tensor:
        """Root states ``[b, 1, S]``."""
        return head_initial(self.head, self.block)

    def logits(self, depth: int, states: Tensor) -> Tensor:
        """Corrected logits ``[b, m, K]`` of ``C_depth`` after the branch states ``[b, m, S]``."""
        if self.steps is None:
            return head_logits(self.head, self.block, depth, states, self.candidates[:, depth - 1])
        out = self.steps.logits(depth, states)
        if self._checked:
            return out
        return _check(out, "prepare_block(...).logits", (states.shape[0], states.shape[1], self.candidates.shape[-1]),
                      False)

    def advance_logits(self, depth: int, states: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """States after ``tokens [b, m]`` at ``depth``, and the corrected logits of ``C_{depth+1}``."""
        if self.steps is None:
            return head_advance_logits(self.head, self.block, depth, states, tokens, self.candidates[:, depth])
        out = self.steps.advance_logits(depth, states, tokens)
        if self._checked:
            return out
        return _pair("prepare_block(...).advance_logits", out, tokens, self.candidates.shape[-1])
