"""dartree inside HF ``generate``: ``model.generate(ids, custom_generate=dartree.hf.generate, drafter=, builder=)``.

What is honoured and what is refused by name (anything that would change the distribution at every tree node):
docs/serving.md.  Shape: ``input_ids`` int64 ``[b, L]`` (left-padded when ``b > 1``) -> sequences ``[b, L + new]``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from dartree.decode import SpeculativeDecoder
from dartree.models.target import HFTarget
from dartree.sampling_options import Sampling, sampling_of

__all__ = ["generate"]

_WARPERS = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper)
_STOPPERS = (MaxLengthCriteria, EosTokenCriteria)
_REFUSED_FLAGS = ("output_scores", "output_logits", "output_attentions", "output_hidden_states")


#: decoders kept on a model, most recent last: a caller that makes a builder per call (``builder=make_builder(
#: ...)`` inline) reuses none, and must not grow the model by a decoder per call
KEPT_DECODERS = 4


def _decoder(model, drafter, builder, head) -> SpeculativeDecoder:
    """One decoder per (model, drafter, builder, head) among the :data:`KEPT_DECODERS` most recent, kept on the
    model, so the lean forward's probe, the target's buffers and the drafter's state are made once."""
    cache: OrderedDict = model.__dict__.setdefault("_dartree_decoders", OrderedDict())
    key = (id(drafter), id(builder), id(head))
    if key not in cache:        # a kept decoder holds its drafter, builder and head: no other object has their ids
        target = HFTarget(model, layer_ids=tuple(drafter.target_layer_ids))
        cache[key] = SpeculativeDecoder(target, drafter, builder, head)
        while len(cache) > KEPT_DECODERS:
            cache.popitem(last=False)
    cache.move_to_end(key)
    return cache[key]


def _check(generation_config, logits_processor, stopping_criteria) -> None:
    if generation_config.num_beams != 1 or generation_config.num_return_sequences != 1:
        raise ValueError("num_beams / num_return_sequences: dartree.hf.generate decodes one sequence per prompt "
                         "(beam search and several returns are not speculative decoding); allowed: 1")
    for flag in _REFUSED_FLAGS:
        if getattr(generation_config, flag, False):
            raise ValueError(f"{flag}: not available from dartree.hf.generate (it returns sequences only); allowed: "
                             f"False")
    others = [type(p).__name__ for p in (logits_processor or []) if type(p) not in _WARPERS]
    if others:
        raise ValueError(f"logits_processor: dartree.hf.generate applies temperature, top_k, top_p and min_p only; "
                         f"these would change the distribution at every tree node: {others}")
    stops = [type(c).__name__ for c in (stopping_criteria or []) if not isinstance(c, _STOPPERS)]
    if stops:
        raise ValueError(f"stopping_criteria: dartree.hf.generate stops at max_new_tokens / max_length and "
                         f"eos_token_id only; got {stops}")


def _warp_options(logits_processor) -> dict[str, Any]:
    """The sampling options of the warpers HF hands over, in the list's order (a caller's ``logits_processor``
    comes before the config's).  :class:`~dartree.verify.warp.Warp` applies temperature, top-k, top-p, min-p in
    that order; a list reduces to it when temperatures and top-k (which commute; several multiply / keep the
    smallest) precede top-p and min-p, each at most once and in that order.  Any other list, or a setting a
    ``Warp`` cannot express (``filter_value`` not ``-inf``, ``min_tokens_to_keep > 1`` for top-p / min-p), is
    refused rather than sampled from another distribution."""
    options: dict[str, Any] = {"temperature": 1.0, "top_k": None, "top_p": None, "min_p": None}
    names = [type(p).__name__ for p in logits_processor or []]
    filtered = []                                   # the top-p / min-p met so far, in order
    for p in logits_processor or []:
        if getattr(p, "filter_value", float("-inf")) != float("-inf") or (
                not isinstance(p, TopKLogitsWarper) and getattr(p, "min_tokens_to_keep", 1) != 1):
            raise ValueError(f"logits_processor: {type(p).__name__} with filter_value={p.filter_value} and "
                             f"min_tokens_to_keep={p.min_tokens_to_keep}; allowed: filter_value=-inf, "
                             f"min_tokens_to_keep=1 (top-k: any)")
        kind = type(p)
        if filtered and (kind in (TemperatureLogitsWarper, TopKLogitsWarper) or kind in filtered
                         or (kind is TopPLogitsWarper and MinPLogitsWarper in filtered)):
            raise ValueError(f"logits_processor: {names} is not one temperature, top-k, top-p, min-p sampler "
                             f"(a temperature or top-k after a top-p / min-p, a top-p after a min-p, or either "
                             f"twice); pass the warpers as generate's temperature/top_k/top_p/min_p instead")
        if kind is TemperatureLogitsWarper:
            options["temperature"] *= float(p.temperature)
        elif kind is TopKLogitsWarper:               # HF stores max(top_k, min_tokens_to_keep)
            options["top_k"] = int(p.top_k) if options["top_k"] is None else min(options["top_k"], int(p.top_k))
        else:
            filtered.append(kind)
            if kind is TopPLogitsWarper:
                options["top_p"] = float(p.top_p) if p.top_p < 1.0 else None
            else:
                options["min_p"] = float(p.min_p)
    return options


def generate(model, input_ids: Tensor, logits_processor=None, stopping_criteria=None, generation_config=None,
             synced_gpus: bool = False, streamer=None, *, drafter=None, builder=None, head=None,
             verifier: str | None = None, sampler=None, stream=None, sampling: Sampling | None = None,
             **model_kwargs: Any):
    """HF ``custom_generate`` entry point (module docstring); ``drafter`` and ``builder`` are required.

    ``sampler``: for ``do_sample=True`` (default: a ``GeneratorSampler`` on torch's global generator, as HF).
    ``stream``: a streamer (``put`` / ``end``) fed the prompt, then each round's tokens; pass it as ``stream=``,
    since transformers 5.x keeps only a callable's own keywords (``streamer=`` gets the prompt only).
    ``sampling``: a :class:`dartree.Sampling` instead of HF's ``do_sample`` and warpers (not with them, nor with
    ``sampler=`` / ``verifier=``); HF's ``eos_token_id`` stays a stop token.
    """
    streamer = streamer if streamer is not None else stream
    if streamer is not None:
        streamer.put(input_ids.cpu())
    if drafter is None or builder is None:
        raise ValueError("drafter / builder: pass both to model.generate(..., custom_generate=dartree.hf.generate, "
                         "drafter=..., builder=dartree.make_builder(...)); head= too for a corrected builder")
    if synced_gpus:
        raise ValueError("synced_gpus: dartree.hf.generate runs on one device; allowed: False")
    _check(generation_config, logits_processor, stopping_criteria)
    b, length = input_ids.shape
    new = generation_config.max_length - length
    if new < 1:
        raise ValueError(f"max_new_tokens: the prompt ({length} tokens) leaves no room under max_length "
                         f"{generation_config.max_length}; allowed: >= 1 new token")
    eos = generation_config._eos_token_tensor
    stop = frozenset() if eos is None else frozenset(int(t) for t in eos.reshape(-1).tolist())
    pad = generation_config._pad_token_tensor
    if sampling is not None:               # the distribution from one place: dartree's object, not HF's warpers
        warpers = [type(p).__name__ for p in logits_processor or [] if isinstance(p, _WARPERS)]
        if generation_config.do_sample or warpers:
            raise ValueError(f"sampling: given together with do_sample=True or HF warpers ({warpers}); pass the "
                             f"distribution either as sampling=dartree.Sampling(...) or as HF's do_sample / "
                             f"temperature / top_k / top_p / min_p, not both")
        sampling = sampling_of(sampling, sampler=sampler, verifier=verifier)
        sampling = replace(sampling, stop_token_ids=sampling.stop_token_ids | stop)    # eos_token_id stops too
    elif generation_config.do_sample:      # the warpers HF would apply, read from the list it hands over
        sampling = Sampling(**_warp_options(logits_processor), sampler=sampler, verifier=verifier, stop_token_ids=stop)
    else:
        sampling = Sampling(stop_token_ids=stop)
    decoder = _decoder(model, drafter, builder, head)
    mask = model_kwargs.get("attention_mask")
    if b == 1 and (mask is None or bool(mask.all())):
        on_round = None
        if streamer is not None:
            on_round = lambda stats, tokens: streamer.put(torch.tensor(tokens, dtype=torch.int64))  # noqa: E731
        out = decoder.generate(input_ids[0], new, on_round=on_round, sampling=sampling)
        rows = [out.tokens[0]]
    else:
        if streamer is not None:
            raise ValueError("streamer: supported for a batch of one prompt (as HF's own streamers)")
        keep = torch.ones_like(input_ids, dtype=torch.bool) if mask is None else mask.bool()
        prompts = [input_ids[r][keep[r]] for r in range(b)]
        rows = [r.tokens[0] for r in decoder.generate_batch(prompts, new, sampling=sampling)]
    if streamer is not None:
        streamer.end()
    width = max(r.shape[0] for r in rows)
    if any(r.shape[0] < width for r in rows) and pad is None:
        raise ValueError("pad_token_id: rows ended at eos_token_id at different lengths; set pad_token_id (or "
                         "eos_token_id, which HF uses as the pad) to pad them")
    fill = 0 if pad is None else int(pad.reshape(-1)[0])
    out = pad_sequence([row.to(input_ids.device) for row in rows], batch_first=True, padding_value=fill)
    sequences = torch.cat([input_ids, out], dim=1)
    if generation_config.return_dict_in_generate:
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        return GenerateDecoderOnlyOutput(sequences=sequences)
    return sequences
