"""The correction head as the decoder sees it: protocol checked at the boundary, time inside its calls
(:class:`TimedHead`; :func:`checked_head` for ``TreeBuilder.build`` called directly).  What is timed and checked,
and why an untrusted head gets copies of ``states``: docs/internals.md, "The head proxy".
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch
from torch import Tensor, nn

from dartree.block import DraftBlock
from dartree.protocols import check_head, head_method

__all__ = ["check_head_device", "TimedHead", "checked_head", "trusted_head"]

def check_head_device(head: Any, device: torch.device | str) -> None:
    """Raise ``ValueError`` if ``head`` is a module whose parameters are not on ``device``."""
    if not isinstance(head, nn.Module):
        return
    first = next(iter(head.parameters()), None)
    if first is not None and first.device != torch.device(device):
        raise ValueError(f"head: {type(head).__name__}'s parameters are on {first.device}, the block on "
                         f"{torch.device(device)}; move the head with head.to(device)")


def _tensor(name: str, out: Any) -> Tensor:
    if not isinstance(out, Tensor):
        raise ValueError(f"head.{name}: returned {type(out).__name__}, expected a torch.Tensor")
    return out


def _state(name: str, out: Any, block: Any, lead: tuple[int, ...], width: int | None) -> Tensor:
    """A state tensor returned by ``name``: shape ``lead + (S,)`` with ``S == width`` when known."""
    out = _tensor(name, out)
    if out.dim() != len(lead) + 1 or tuple(out.shape[:-1]) != lead or (width is not None and out.shape[-1] != width):
        want = [*lead, "S" if width is None else width]
        raise ValueError(f"head.{name}: returned shape {list(out.shape)}, expected {want}"
                         + ("" if width is None else " (the state width S of initial_state must not change)"))
    if out.device != block.device:
        raise ValueError(f"head.{name}: returned a tensor on {out.device}, the block is on {block.device}")
    return out


def _logits(name: str, out: Any, block: Any, states: Tensor, candidates: Tensor) -> Tensor:
    """Corrected logits returned by ``name``: floating ``[b, m, K]`` on the block's device."""
    out = _tensor(name, out)
    want = (states.shape[0], states.shape[1], candidates.shape[-1])
    if tuple(out.shape) != want:
        raise ValueError(f"head.{name}: returned logits of shape {list(out.shape)}, expected [b, m, K] = {list(want)}")
    if not out.is_floating_point():
        raise ValueError(f"head.{name}: returned {out.dtype} logits, expected a floating dtype (scores are "
                         f"log-softmaxed; integer or bool logits are not scores)")
    if out.device != block.device:
        raise ValueError(f"head.{name}: returned a tensor on {out.device}, the block is on {block.device}")
    return out


def _pair(name: str, out: Any, block: Any, tokens: Tensor, width: int | None,
          candidates: Tensor) -> tuple[Tensor, Tensor]:
    """``(new_states, logits)`` returned by a fused call ``name``, each checked as :func:`_state` / :func:`_logits`."""
    if not isinstance(out, tuple) or len(out) != 2 or not all(isinstance(x, Tensor) for x in out):
        raise ValueError(f"head.{name}: returned {type(out).__name__}, expected a tuple (new_states, logits) "
                         f"of two tensors")
    new = _state(name, out[0], block, tuple(tokens.shape), width)
    return new, _logits(name, out[1], block, new, candidates)


class TimedHead:
    """Forwards to ``head``; ``seconds`` accumulates the wall time spent inside its calls.  ``sync``: on CUDA,
    bracket each call with ``torch.cuda.synchronize``; ``False`` only checks and counts (:func:`checked_head`)."""

    def __init__(self, head: Any, device: torch.device | str = "cpu", sync: bool = True) -> None:
        check_head(head)
        check_head_device(head, device)
        self.head = head
        self.seconds = 0.0
        self.calls = 0                          # head method calls since the last take
        self._cuda = sync and torch.device(device).type == "cuda"
        self._width: int | None = None          # the state width S of the last initial_state
        # perf: dartree's own heads' calls are not re-checked (their shapes are tested); a subclass is
        self._trusted = type(head) in _TRUSTED
        self._block_source: Any = None          # the block last handed to the head, and its copy (_own_block)
        self._block_copy: Any = None
        if head_method(head, "advance_logits") is not None:     # exposed only when the head has it
            self.advance_logits = self._advance_logits

    def take(self) -> tuple[float, int]:
        """Seconds and head method calls accumulated since the last ``take`` (both reset to 0)."""
        out, self.seconds, self.calls = (self.seconds, self.calls), 0.0, 0
        return out

    def _call(self, fn: Any, *args: Any) -> Any:
        self.calls += 1
        return self._timed(fn, *args)

    def _timed(self, fn: Any, *args: Any) -> Any:
        if self._cuda:
            torch.cuda.synchronize()       # deliberate: charge the head only for its own work
        start = time.perf_counter()
        out = fn(*args)
        if self._cuda:
            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - start
        return out

    def prepare_block(self, block: Any, candidates: Tensor) -> _TimedSteps | None:
        """The head's optional ``prepare_block`` (timed, not counted), its result wrapped so that each of its calls
        is timed, counted and checked; ``None`` when the head has none or declines."""
        prepare = head_method(self.head, "prepare_block")
        if prepare is None:
            return None
        self._check_block(block)          # the fast builders prepare before they ask for the initial state
        steps = self._timed(prepare, self._own_block(block), self._own(candidates))
        if steps is None:
            return None
        missing = [m for m in ("logits", "advance_logits") if not callable(getattr(steps, m, None))]
        if missing:
            raise ValueError(f"head.prepare_block: returned {type(steps).__name__}, which lacks {missing}; it must "
                             f"return None or an object with logits(depth, states) and "
                             f"advance_logits(depth, states, tokens) (dartree.protocols.CorrectionHead)")
        return _TimedSteps(self, steps, block, candidates)

    def _check_block(self, block: Any) -> None:
        """Once per build: the head's device and the drafter's hidden width (metadata only)."""
        check_head_device(self.head, block.device)
        size = getattr(self.head, "hidden_size", None)
        hidden = getattr(block, "hidden", None)
        if isinstance(size, int) and isinstance(hidden, Tensor) and hidden.shape[-1] != size:
            raise ValueError(f"block: hidden has width {hidden.shape[-1]}, but {type(self.head).__name__} expects "
                             f"hidden_size={size} (the drafter's H_d must match the head's hidden size)")

    def initial_state(self, block: Any) -> Tensor:
        self._check_block(block)
        out = _state("initial_state", self._call(self.head.initial_state, self._own_block(block)), block,
                     (block.batch_size,), None)
        self._width = out.shape[-1]
        return out

    def _own(self, x: Tensor) -> Tensor:
        """``states``, ``tokens`` or ``candidates`` as the head gets them: the builder's tensor for dartree's own heads,
        a copy for any other, so that a head editing its argument in place cannot change what the builder keeps (it
        changed the tree, and made a trusted fast builder's tree break the decoder's contract)."""
        return x if self._trusted else x.clone()

    def _own_block(self, block: Any) -> Any:
        """``block`` for dartree's own heads; for any other, one copy per block, so that a head editing the drafter's
        logits or hidden states in place changes neither the tree nor the decoder's block."""
        if self._trusted or not isinstance(block, DraftBlock):
            return block
        if self._block_source is not block:
            self._block_source = block
            self._block_copy = dataclasses.replace(
                block, logits=block.logits.clone(), root=block.root.clone(),
                hidden=None if block.hidden is None else block.hidden.clone())
        return self._block_copy

    def logits(self, block: Any, depth: int, states: Tensor, candidates: Tensor) -> Tensor:
        out = self._call(self.head.logits, self._own_block(block), depth, self._own(states), self._own(candidates))
        return _logits("logits", out, block, states, candidates)

    def _vocab_logits(self, block: Any, depth: int, states: Tensor) -> Tensor:
        """The head's optional ``vocab_logits``, timed and checked (``vocab_logits`` when the head has one)."""
        if self._trusted:           # perf: a sampled round's proposals (dartree's own heads: shapes tested, no copies)
            return self._call(self.head.vocab_logits, block, depth, states)
        out = self._call(self.head.vocab_logits, self._own_block(block), depth, self._own(states))
        return _logits("vocab_logits", out, block, states, block.logits)      # its last dimension: V

    def advance(self, block: Any, depth: int, states: Tensor, tokens: Tensor) -> Tensor:
        if self._trusted:           # perf: as vocab_logits
            return self._call(self.head.advance, block, depth, states, tokens)
        out = self._call(self.head.advance, self._own_block(block), depth, self._own(states), self._own(tokens))
        return _state("advance", out, block, tuple(tokens.shape), self._width)

    def _advance_logits(self, block: Any, depth: int, states: Tensor, tokens: Tensor,
                        candidates: Tensor) -> tuple[Tensor, Tensor]:
        out = self._call(self.head.advance_logits, self._own_block(block), depth, self._own(states), self._own(tokens),
                         self._own(candidates))
        return _pair("advance_logits", out, block, tokens, self._width, candidates)

    def __getattr__(self, name: str) -> Any:      # other attributes of the head (not its methods above)
        if name in ("head", "advance_logits", "_width"):
            raise AttributeError(name)
        if name == "vocab_logits":
            if getattr(self.head, name, None) is None:
                raise AttributeError(name)
            return self._vocab_logits
        return getattr(self.head, name)


class _TimedSteps:
    """A prepared head's calls, timed and counted on the :class:`TimedHead` and checked as its own are."""

    def __init__(self, timed: TimedHead, steps: Any, block: Any, candidates: Tensor) -> None:
        self._head, self._steps, self._block, self._candidates = timed, steps, block, candidates

    def logits(self, depth: int, states: Tensor) -> Tensor:
        out = self._head._call(self._steps.logits, depth, self._head._own(states))
        if self._head._trusted:
            return out
        return _logits("prepare_block(...).logits", out, self._block, states, self._candidates)

    def advance_logits(self, depth: int, states: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        out = self._head._call(self._steps.advance_logits, depth, self._head._own(states), self._head._own(tokens))
        if self._head._trusted:
            return out
        return _pair("prepare_block(...).advance_logits", out, self._block, tokens, self._head._width,
                     self._candidates)


#: head classes whose calls the proxy neither re-checks nor hands copies (:func:`trusted_head`)
_TRUSTED: set[type] = set()


def trusted_head(cls: type) -> type:
    """Class decorator of dartree's own heads (``GRUHead``, ``MarkovHead``): the proxy skips the output checks of
    their prepared calls, ``vocab_logits`` and ``advance`` and hands them its own tensors (perf: their shapes are
    tested, and they edit nothing in place).  Exactly the decorated class: a subclass is user code and is checked."""
    _TRUSTED.add(cls)
    return cls


def checked_head(head: Any, device: torch.device | str) -> TimedHead:
    """``head`` wrapped for a direct :meth:`~dartree.builders.TreeBuilder.build` call: every output
    checked as the decoder's proxy checks it (:class:`TimedHead`), with no CUDA synchronisation."""
    return TimedHead(head, device, sync=False)
