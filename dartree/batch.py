"""The batched AR baseline (:func:`generate_ar_batch`); speculative batches: :meth:`SpeculativeDecoder.generate_batch`.
Each row equals what it would get alone; per-row ``RoundStats`` carry the round's shared wall times.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn

from dartree.engine import Engine
from dartree.models.target import HFTarget
from dartree.rounds import GenerationResult, as_target, check_requests
from dartree.sampling_options import Sampling
from dartree.verify.sampling import Sampler

__all__ = ["generate_ar_batch"]


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
    target = as_target(target)
    reqs = check_requests(target, prompts, max_new_tokens, temperature, sampler, stop_token_ids,
                          top_k=top_k, top_p=top_p, min_p=min_p, sampling=sampling)
    engine = Engine(target, options=reqs[0])
    engine.admit(reqs)
    return engine.run()
