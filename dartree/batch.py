"""Batched decoding entry points: many prompts in flight, one forward per round of :class:`dartree.engine.Engine`
(one batched draft, one tree for all rows, one target forward, per-row commits; finished rows leave).
:meth:`SpeculativeDecoder.generate_batch` decodes speculatively, :func:`generate_ar_batch` is the AR baseline;
each row equals what it would get alone.  Per-row ``RoundStats`` carry the round's (shared) wall times: sum a
row's rounds for its latency, the longest row's for the batch's wall time."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn

from dartree.decode import SpeculativeDecoder
from dartree.engine import Engine
from dartree.models.target import HFTarget
from dartree.rounds import GenerationResult, as_target, check_requests
from dartree.sampling_options import Sampling
from dartree.verify.sampling import Sampler

__all__ = ["generate_batch", "generate_ar_batch"]


def generate_batch(decoder: SpeculativeDecoder, prompts: Sequence[Tensor], max_new_tokens: int,
                   temperature: float = 0.0, sampler: Sampler | None = None,
                   stop_token_ids: Iterable[int] | None = None, **options) -> list[GenerationResult]:
    """:meth:`SpeculativeDecoder.generate_batch` as a function (``options``: its keyword-only arguments,
    ``sampling=`` among them)."""
    return decoder.generate_batch(prompts, max_new_tokens, temperature, sampler, stop_token_ids, **options)


@torch.inference_mode()      # as SpeculativeDecoder.generate
def generate_ar_batch(
    target: HFTarget | nn.Module,
    prompts: Sequence[Tensor],
    max_new_tokens: int,
    temperature: float = 0.0,
    sampler: Sampler | None = None,
    stop_token_ids: Iterable[int] | None = None,
    *,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    sampling: Sampling | None = None,
) -> list[GenerationResult]:
    """Batched autoregressive baseline: one causal step for every live row per forward, each row equal to
    :func:`dartree.decode.generate_ar` on its prompt (ragged lengths; finished rows leave the batch).
    ``sampling``: as in ``generate_ar``."""
    if not isinstance(target, HFTarget):
        target = as_target(target, ())
    reqs = check_requests(target, prompts, max_new_tokens, temperature, sampler, stop_token_ids,
                          top_k=top_k, top_p=top_p, min_p=min_p, sampling=sampling)
    engine = Engine(target, options=reqs[0])
    engine.admit(reqs)
    engine.run()
    return [engine.result(q) for q in range(len(reqs))]
