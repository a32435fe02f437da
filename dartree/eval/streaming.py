"""Per-round streaming of :meth:`SpeculativeDecoder.generate` through the drafter protocol.

The decoder tells its drafter every token it commits: ``append_context(hidden, tokens)`` receives
``[root, accepted...]`` right after a round's commit, and the next ``draft(root)`` receives that
round's bonus token.  :class:`StreamingDrafter` wraps any drafter and forwards those tokens to a
callback as they arrive, so a caller sees each round's tokens when the round ends, without touching
the decoding loop.  The last round's bonus token is never drafted from: the caller flushes it from
the returned :class:`~dartree.decode.GenerationResult` (see :func:`stream_generate`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from dartree.decode import GenerationResult, SpeculativeDecoder
from dartree.verify.sampling import Sampler

__all__ = ["StreamingDrafter", "stream_generate"]


class StreamingDrafter:
    """A drafter that reports committed tokens to ``on_tokens(list[int])`` and otherwise delegates."""

    def __init__(self, drafter: Any, on_tokens: Callable[[list[int]], None]) -> None:
        self.inner = drafter
        self.on_tokens = on_tokens
        self.target_layer_ids = tuple(drafter.target_layer_ids)
        self._appends = 0

    def __getattr__(self, name: str) -> Any:       # gamma, block_size, ... of the wrapped drafter
        return getattr(self.inner, name)

    def reset(self) -> None:
        self._appends = 0
        self.inner.reset()

    def append_context(self, hidden_states: Tensor | None, tokens: Tensor) -> None:
        self.inner.append_context(hidden_states, tokens)
        if self._appends > 0:                         # the first call is the prompt
            # Host copy of a few ids per round, on purpose: the caller prints them now.
            self.on_tokens(tokens[0, 1:].tolist())    # tokens[0, 0] is the previous root, already reported
        self._appends += 1

    def draft(self, root: Tensor):
        if self._appends > 1:                         # root is the previous round's bonus token
            self.on_tokens(root.tolist())
        return self.inner.draft(root)


@torch.no_grad()
def stream_generate(decoder: SpeculativeDecoder, input_ids: Tensor, max_new_tokens: int,
                    on_tokens: Callable[[list[int]], None], temperature: float = 0.0,
                    sampler: Sampler | None = None, stop_token_ids: list[int] | None = None) -> GenerationResult:
    """``decoder.generate(...)`` that calls ``on_tokens`` with the new tokens of every round, in order.

    Every token of the result is reported exactly once.
    """
    emitted: list[int] = []

    def report(tokens: list[int]) -> None:
        emitted.extend(tokens)
        on_tokens(tokens)

    original = decoder.drafter
    decoder.drafter = StreamingDrafter(original, report)
    try:
        result = decoder.generate(input_ids, max_new_tokens, temperature, sampler, stop_token_ids)
    finally:
        decoder.drafter = original
    rest = result.tokens[0, len(emitted):].tolist()
    if emitted != result.tokens[0, : len(emitted)].tolist():
        raise RuntimeError("stream_generate: streamed tokens differ from the result (drafter protocol changed?)")
    if rest:
        report(rest)
    return result
