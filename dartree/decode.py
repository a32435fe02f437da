"""The speculative decoding loop (:class:`SpeculativeDecoder`) and the autoregressive baseline (:func:`generate_ar`);
the round itself is :mod:`dartree.engine`.  The drafter protocol and the decoding contract: docs/verification.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

from dartree.builders import TreeBuilder
from dartree.engine import Engine
from dartree.models.target import HFTarget
from dartree.protocols import CorrectionHead, Drafter, Sampler, check_drafter, check_head
from dartree.rounds import (
    ROUND_STAGES,
    STOP_REASONS,
    GenerationResult,
    Request,
    RoundStats,
    as_target,
    check_request,
    check_requests,
)
from dartree.sampling_options import Sampling
from dartree.timing import TimedHead

__all__ = ["Drafter", "RoundStats", "GenerationResult", "SpeculativeDecoder", "generate_ar", "STOP_REASONS",
           "ROUND_STAGES"]

class SpeculativeDecoder:
    """Draft-tree speculative decoding: draft a block, build a tree, verify it in one forward, commit.

    Args:
        target: an :class:`~dartree.models.target.HFTarget` whose ``layer_ids`` are the drafter's
            ``target_layer_ids``, or a transformers causal LM (wrapped with them).
        drafter: a :class:`Drafter`; builder: a ``TreeBuilder`` (``dartree.make_builder(...)``);
        head: the correction head, required iff ``builder.needs_head``.
    """

    def __init__(
        self,
        target: HFTarget | nn.Module,
        drafter: Drafter,
        builder: TreeBuilder,
        head: CorrectionHead | None = None,
    ) -> None:
        check_drafter(drafter)
        if not hasattr(builder, "build") or not hasattr(builder, "needs_head"):
            raise ValueError(f"builder: expected a TreeBuilder (dartree.make_builder), got {type(builder).__name__}")
        if builder.needs_head and head is None:
            raise ValueError(f"head: builder {getattr(builder, 'name', builder)!r} needs a CorrectionHead")
        if not builder.needs_head and head is not None:
            raise ValueError(f"head: builder {getattr(builder, 'name', builder)!r} uses no head; pass head=None")
        if head is not None:
            check_head(head)
        self.target = as_target(target, tuple(drafter.target_layer_ids))
        # every committed token is fed to the drafter: a smaller vocabulary would index past its embedding
        vocab = getattr(drafter, "vocab_size", None) or getattr(getattr(drafter, "config", None), "vocab_size", None)
        if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab < self.target.vocab_size:
            raise ValueError(f"drafter: its vocabulary ({vocab} tokens) is smaller than the target's "
                             f"({self.target.vocab_size}); the target's tokens are the drafter's context, so the "
                             f"drafter needs a vocabulary of at least {self.target.vocab_size}")
        self.drafter = drafter
        self.builder = builder
        self.head = head
        #: the head proxy the builder is given: it times the head's calls (the ``head`` stage)
        self.timed_head = None if head is None else TimedHead(head, self.target.device)

    # inference mode, not only no_grad: no version-counter or view tracking on a decode's many small ops
    @torch.inference_mode()
    def generate(
        self,
        input_ids: Tensor,
        max_new_tokens: int,
        temperature: float = 0.0,
        sampler: Sampler | None = None,
        stop_token_ids: Iterable[int] | None = None,
        on_round: Callable[[RoundStats | None, list[int]], None] | None = None,
        *,
        top_k: int | None = None,
        top_p: float | None = None,
        min_p: float | None = None,
        verifier: str | None = None,
        sampling: Sampling | None = None,
    ) -> GenerationResult:
        """Decode ``max_new_tokens`` tokens (fewer if a stop token is committed) after ``input_ids`` (integer ``[L]``
        or ``[1, L]``).

        ``temperature == 0`` is greedy; ``> 0`` samples with ``sampler`` (default: ``GeneratorSampler()``).  Lossless:
        greedy equals the target's greedy decoding; sampled output follows the target's distribution, and with a
        ``KeyedSampler`` equals :func:`generate_ar` token for token.  ``on_round(stats, tokens)`` gets the first
        token (``stats`` ``None``), then each round's statistics and tokens.  ``sampling``: a
        :class:`~dartree.Sampling` holding the sampling keywords at once (not with them).
        """
        req = check_request(self.target, input_ids, max_new_tokens, temperature, sampler, stop_token_ids,
                            top_k=top_k, top_p=top_p, min_p=min_p, verifier=verifier, sampling=sampling)
        engine = self.engine(req, single=True)
        engine.admit([req])
        if on_round is not None:
            on_round(None, list(engine.generated[0]))
            engine.on_round = lambda q, stats, kept: on_round(stats, kept)
        return engine.run()[0]

    def engine(self, options: Request | None = None, single: bool = False) -> Engine:
        """A fresh :class:`~dartree.engine.Engine` over this decoder's target, drafter, builder and head with a
        checked request's options (``None``: greedy; ``single``: the drafter used as is, for one request)."""
        return Engine(self.target, self.drafter, self.builder, self.timed_head, options=options, single=single)

    @torch.inference_mode()      # as generate
    def generate_batch(
        self,
        prompts,
        max_new_tokens: int,
        temperature: float = 0.0,
        sampler: Sampler | None = None,
        stop_token_ids: Iterable[int] | None = None,
        *,
        top_k: int | None = None,
        top_p: float | None = None,
        min_p: float | None = None,
        verifier: str | None = None,
        sampling: Sampling | None = None,
    ) -> list[GenerationResult]:
        """Decode several prompts (integer ``[L]`` or ``[1, L]`` tensors of any lengths) together, all live rows per
        round; one result per prompt, in order, each equal to :meth:`generate` on that prompt alone (T=0, and T>0
        with a ``KeyedSampler``).  Otherwise :meth:`generate`'s arguments."""
        reqs = check_requests(self.target, prompts, max_new_tokens, temperature, sampler, stop_token_ids,
                              top_k=top_k, top_p=top_p, min_p=min_p, verifier=verifier, sampling=sampling)
        engine = self.engine(reqs[0])
        engine.admit(reqs)
        return engine.run()


@torch.inference_mode()      # as SpeculativeDecoder.generate
def generate_ar(
    target: HFTarget | nn.Module,
    input_ids: Tensor,
    max_new_tokens: int,
    temperature: float = 0.0,
    sampler: Sampler | None = None,
    stop_token_ids: Iterable[int] | None = None,
    *,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    sampling: Sampling | None = None,
) -> GenerationResult:
    """Autoregressive baseline with the same contract as :meth:`SpeculativeDecoder.generate`.

    The forwards HF ``generate`` runs: the prompt, then one token per step, the LM head on that position only.
    The token at position p is ``sampler.sample(warped logits, p)`` (:class:`~dartree.verify.warp.Warp`), as
    speculative verification draws it.  Each step is reported as a round (committed 1, tree size 0).
    ``sampling``: as in ``generate`` (its ``verifier`` unused).
    """
    target = as_target(target)
    req = check_request(target, input_ids, max_new_tokens, temperature, sampler, stop_token_ids,
                        top_k=top_k, top_p=top_p, min_p=min_p, sampling=sampling)
    engine = Engine(target, options=req, single=True)
    engine.admit([req])
    return engine.run()[0]
