"""A decode's sampling options as one public object, :class:`Sampling`, checked when made: every entry point takes
``sampling=Sampling(...)`` or the same options as keywords, never both (the call checks the stop tokens against the
target's vocabulary, :func:`dartree.rounds.check_options`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from dartree.arguments import index_arg
from dartree.verify.sampling import GeneratorSampler, Sampler, check_temperature
from dartree.verify.warp import Warp

__all__ = ["Sampling", "sampling_of", "stop_tokens", "VERIFIERS", "SAMPLED_VERIFIERS", "DEFAULT_VERIFIER"]

#: the acceptance rules at T>0 (T=0 is always "greedy"): exact target-sample matching of deterministic trees,
#: and two verifiers of trees sampled from known proposals, lossless in law: recursive rejection sampling
#: (:mod:`dartree.verify.rejection`) and Traversal Verification (:mod:`dartree.verify.traversal`)
VERIFIERS = ("match", "rejection", "traversal")
#: the verifiers of trees sampled with a torch.Generator's draws: lossless in law, not token for token
SAMPLED_VERIFIERS = ("rejection", "traversal")
#: the T>0 default with a torch.Generator's draws, chosen by measurement (docs/results.md and
#: docs/verification.md, "Traversal verification"): sampled trees accept more than matching on the zoo, and
#: traversal accepts more than rejection on the same trees for a little more host work a round
DEFAULT_VERIFIER = "traversal"


def stop_tokens(stop_token_ids: object, vocab_size: int | None = None) -> frozenset[int]:
    """Stop tokens from an int, a numpy / tensor integer or array, or an iterable of integers, each ``>= 0``
    (and ``< vocab_size`` when given).

    An iterator (e.g. a generator) is read once here: callers normalise once per call and share the
    result between rows, so no row sees an exhausted iterator.
    """
    if stop_token_ids is None:
        return frozenset()
    if isinstance(stop_token_ids, Tensor):
        if stop_token_ids.is_floating_point() or stop_token_ids.is_complex() or stop_token_ids.dtype == torch.bool:
            raise ValueError(f"stop_token_ids: expected integer tokens, got a {stop_token_ids.dtype} tensor")
        stop_token_ids = stop_token_ids.reshape(-1).tolist()
    elif hasattr(stop_token_ids, "tolist") and hasattr(stop_token_ids, "ndim"):    # a numpy array or scalar
        stop_token_ids = [stop_token_ids.tolist()] if stop_token_ids.ndim == 0 else stop_token_ids.ravel().tolist()
    elif hasattr(stop_token_ids, "__index__") or isinstance(stop_token_ids, str | bytes):
        stop_token_ids = [stop_token_ids]
    try:
        items = list(stop_token_ids)
    except TypeError:
        raise ValueError(f"stop_token_ids: expected an integer or an iterable of integers, "
                         f"got {type(stop_token_ids).__name__}") from None
    stop, bad = set(), []
    for t in items:
        try:
            value = index_arg("stop_token_ids", t)
        except ValueError:
            bad.append(t)
            continue
        (stop.add(value) if 0 <= value and (vocab_size is None or value < vocab_size) else bad.append(t))
    if bad:
        allowed = ">= 0" if vocab_size is None else f"in [0, {vocab_size})"
        raise ValueError(f"stop_token_ids: each must be an integer {allowed}, got {sorted(map(repr, bad))}")
    return frozenset(stop)


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """How a decode picks its tokens; checked when made, a bad value named with its allowed values.  Each
    option: docs/quickstart.md, "From Python"."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    sampler: Sampler | None = None
    verifier: str | None = None
    stop_token_ids: Iterable[int] | None = None

    def __post_init__(self) -> None:
        temperature = check_temperature(self.temperature)
        sampler, verifier = self.sampler, self.verifier
        if sampler is not None and not callable(getattr(sampler, "sample", None)):   # checked at T=0 too: a typo
            raise ValueError(f"sampler: expected None, a GeneratorSampler, a KeyedSampler or any object with "
                             f"sample(logits, positions), got {type(sampler).__name__}")
        if verifier is not None and verifier not in VERIFIERS:
            raise ValueError(f"verifier: expected None (the default, {DEFAULT_VERIFIER!r}) or one of {VERIFIERS}, "
                             f"got {verifier!r}")
        warp = Warp(temperature if temperature > 0 else 1.0, self.top_k, self.top_p, self.min_p)   # checked at T=0 too
        if temperature > 0 and verifier in SAMPLED_VERIFIERS and sampler is not None \
                and type(sampler) is not GeneratorSampler:
            raise ValueError(f"sampler: verifier {verifier!r} draws from a torch.Generator; pass a GeneratorSampler "
                             f"(or None), got {type(sampler).__name__} (keyed draws: use verifier='match')")
        for name, value in (("temperature", temperature), ("top_k", warp.top_k), ("top_p", warp.top_p),
                            ("min_p", warp.min_p), ("stop_token_ids", stop_tokens(self.stop_token_ids))):
            object.__setattr__(self, name, value)

    @property
    def warp(self) -> Warp | None:
        """The target's sampling distribution (``None`` at temperature 0: greedy)."""
        return Warp(self.temperature, self.top_k, self.top_p, self.min_p) if self.temperature > 0 else None


def _given(name: str, value: object) -> bool:
    """Whether a sampling keyword differs from its default (``temperature=0``, every other ``None``)."""
    if name == "temperature":
        return not (isinstance(value, int | float) and not isinstance(value, bool) and value == 0)
    return value is not None


def sampling_of(sampling: Sampling | None = None, **keywords: object) -> Sampling:
    """``sampling``, or a :class:`Sampling` of the individual keywords (its field names) when it is ``None``.

    Both at once is a ``ValueError`` naming them: no keyword silently overrides the object, nor the object a
    keyword.  A keyword at its default (``temperature=0``, every other ``None``) counts as not given.
    """
    if sampling is None:
        return Sampling(**keywords)
    if not isinstance(sampling, Sampling):
        raise ValueError(f"sampling: expected None or a dartree.Sampling, got {type(sampling).__name__}")
    given = [name for name, value in keywords.items() if _given(name, value)]
    if given:
        raise ValueError(f"sampling: given together with the keyword(s) {', '.join(given)}; pass the sampling "
                         f"options either as sampling=Sampling(...) or as keywords, not both")
    return sampling
