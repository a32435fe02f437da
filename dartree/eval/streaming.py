"""Per-round streaming of :meth:`SpeculativeDecoder.generate` (through its ``on_round`` callback)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from dartree.decode import GenerationResult, SpeculativeDecoder
from dartree.verify.sampling import Sampler

__all__ = ["stream_generate"]


@torch.no_grad()
def stream_generate(decoder: SpeculativeDecoder, input_ids: Tensor, max_new_tokens: int,
                    on_tokens: Callable[[list[int]], None], temperature: float = 0.0,
                    sampler: Sampler | None = None, stop_token_ids: list[int] | None = None,
                    **options) -> GenerationResult:
    """``decoder.generate(...)`` that calls ``on_tokens`` with the tokens each round commits, as it ends.

    Every token of the result is reported exactly once, in order: the first (from the prefill), then one
    call per round.  ``options``: :meth:`SpeculativeDecoder.generate`'s keyword-only arguments.
    """
    return decoder.generate(input_ids, max_new_tokens, temperature, sampler, stop_token_ids,
                            on_round=lambda stats, tokens: on_tokens(tokens), **options)
