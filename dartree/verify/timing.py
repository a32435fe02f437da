"""The correction head as the decoder sees it: protocol checked at the boundary, time inside its calls.

:func:`check_head` is called when a :class:`~dartree.decode.SpeculativeDecoder` is built, so that a
head missing a method fails there with a message naming it, not deep inside a builder.
:class:`TimedHead` wraps the head for the decoding loop: it forwards every call, adds the wall time
spent inside head calls to ``seconds`` (the ``head`` column of the stage tables; the rest of the
build is the builder's own work), and checks that each call returned a tensor.  The optional fused
method ``advance_logits`` is exposed only when the wrapped head has it, because builders detect it
with ``getattr(head, "advance_logits", None)``.

On CUDA each head call is bracketed by ``torch.cuda.synchronize`` so that its time is charged to
the head and not to whatever synchronises next; on the CPU timing costs two ``perf_counter`` calls.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

__all__ = ["HEAD_METHODS", "check_head", "TimedHead", "timed_head"]

#: Methods every correction head must have (``dartree.block.CorrectionHead``).
HEAD_METHODS = ("initial_state", "logits", "advance")


def check_head(head: Any) -> None:
    """Raise ``ValueError`` naming the methods ``head`` lacks (see ``dartree.block.CorrectionHead``)."""
    missing = [m for m in HEAD_METHODS if not callable(getattr(head, m, None))]
    if missing:
        raise ValueError(f"head: {type(head).__name__} is missing {missing}; a correction head needs "
                         f"initial_state(block), logits(block, depth, states, candidates) and "
                         f"advance(block, depth, states, tokens) (dartree.block.CorrectionHead)")
    fused = getattr(head, "advance_logits", None)
    if fused is not None and not callable(fused):
        raise ValueError(f"head: {type(head).__name__}.advance_logits is not callable")


def _tensor(name: str, out: Any) -> Any:
    if not isinstance(out, Tensor):
        raise ValueError(f"head.{name}: returned {type(out).__name__}, expected a torch.Tensor")
    return out


class TimedHead:
    """Forwards to ``head``; ``seconds`` accumulates the wall time spent inside its calls."""

    def __init__(self, head: Any, device: torch.device | str = "cpu") -> None:
        check_head(head)
        self.head = head
        self.seconds = 0.0
        self._cuda = torch.device(device).type == "cuda"

    def take(self) -> float:
        """Seconds accumulated since the last ``take`` (and reset to 0)."""
        out, self.seconds = self.seconds, 0.0
        return out

    def _call(self, name: str, *args: Any) -> Any:
        if self._cuda:
            torch.cuda.synchronize()       # deliberate: charge the head only for its own work
        start = time.perf_counter()
        out = getattr(self.head, name)(*args)
        if self._cuda:
            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - start
        return out

    def initial_state(self, block: Any) -> Tensor:
        return _tensor("initial_state", self._call("initial_state", block))

    def logits(self, block: Any, depth: int, states: Tensor, candidates: Tensor) -> Tensor:
        return _tensor("logits", self._call("logits", block, depth, states, candidates))

    def advance(self, block: Any, depth: int, states: Tensor, tokens: Tensor) -> Tensor:
        return _tensor("advance", self._call("advance", block, depth, states, tokens))

    def __getattr__(self, name: str) -> Any:      # other attributes of the head (not its methods above)
        if name in ("head", "advance_logits"):
            raise AttributeError(name)
        return getattr(self.head, name)


class _TimedFusedHead(TimedHead):
    """A :class:`TimedHead` whose head has the optional fused ``advance_logits``."""

    def advance_logits(self, block: Any, depth: int, states: Tensor, tokens: Tensor,
                       candidates: Tensor) -> tuple[Tensor, Tensor]:
        out = self._call("advance_logits", block, depth, states, tokens, candidates)
        if not isinstance(out, tuple) or len(out) != 2 or not all(isinstance(x, Tensor) for x in out):
            raise ValueError(f"head.advance_logits: returned {type(out).__name__}, expected a tuple "
                             f"(new_states, logits) of two tensors")
        return out


def timed_head(head: Any, device: torch.device | str = "cpu") -> TimedHead:
    """``head`` wrapped in a :class:`TimedHead` (with ``advance_logits`` iff ``head`` has it)."""
    cls = _TimedFusedHead if getattr(head, "advance_logits", None) is not None else TimedHead
    return cls(head, device)
