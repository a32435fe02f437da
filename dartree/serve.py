"""Serve a list of prompts with ``concurrency`` requests in flight (continuous batching): batched rounds of
:class:`dartree.engine.Engine`, finished rows' slots taken by the next prompts before the next round.  Each request's
tokens equal what it would get alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dartree.arguments import check_int
from dartree.decode import SpeculativeDecoder
from dartree.engine import Engine
from dartree.models.target import HFTarget
from dartree.rounds import GenerationResult, as_target, check_requests
from dartree.sampling_options import Sampling
from dartree.verify.sampling import Sampler

__all__ = ["ServeResult", "serve"]


@dataclass(frozen=True)
class ServeResult:
    """One serving run: a result per prompt (in prompt order), the wall time, the rounds run."""

    results: tuple[GenerationResult, ...]
    seconds: float
    concurrency: int
    steps: int                   # batched rounds (AR: batched steps)

    @property
    def tokens(self) -> int:
        return sum(r.tokens.shape[1] for r in self.results)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


@torch.inference_mode()      # as SpeculativeDecoder.generate
def serve(
    decoder: SpeculativeDecoder | HFTarget | nn.Module,
    prompts: Sequence[Tensor],
    concurrency: int,
    max_new_tokens: int,
    temperature: float = 0.0,
    sampler: Sampler | None = None,
    stop_token_ids: Iterable[int] | None = None,
    on_finish: Callable[[int, GenerationResult], None] | None = None,
    *,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    verifier: str | None = None,
    sampling: Sampling | None = None,
) -> ServeResult:
    """Decode ``prompts`` with at most ``concurrency`` in flight (module docstring).  ``decoder``: a
    :class:`SpeculativeDecoder`, or an ``HFTarget`` / causal LM (the batched AR baseline); ``on_finish(index,
    result)`` is called as each request completes; ``sampling``: as in :meth:`SpeculativeDecoder.generate`."""
    check_int("concurrency", concurrency)
    target = decoder.target if isinstance(decoder, SpeculativeDecoder) else as_target(decoder)
    reqs = check_requests(target, prompts, max_new_tokens, temperature, sampler, stop_token_ids,
                          top_k=top_k, top_p=top_p, min_p=min_p, verifier=verifier, sampling=sampling)
    batch = decoder.engine(reqs[0]) if isinstance(decoder, SpeculativeDecoder) else Engine(target, options=reqs[0])
    start = time.perf_counter()
    nxt, steps = 0, 0

    def report(done: list[int]) -> None:
        if on_finish is not None:
            for q in done:
                on_finish(q, batch.result(q))     # admitted in prompt order: q is the prompt index

    def fill() -> None:                           # free slots take the next prompts
        nonlocal nxt
        while nxt < len(reqs) and len(batch.live) < concurrency:
            take = reqs[nxt: nxt + concurrency - len(batch.live)]
            nxt += len(take)
            report(batch.admit(take))             # requests that end at their first token finish here

    fill()
    while batch.live:
        report(batch.step())
        steps += 1
        fill()
    seconds = time.perf_counter() - start
    return ServeResult(tuple(batch.result(q) for q in range(len(reqs))), seconds, concurrency, steps)
