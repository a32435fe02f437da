"""The speculative decoding loop, the autoregressive baseline, and the drafter protocol.

Entry points: :class:`SpeculativeDecoder` (``.generate`` decodes one prompt: a prefill, then rounds of one
drafter call, one build and one target forward; :mod:`dartree.engine` is the round itself, batch-first),
:func:`generate_ar` (the same contract without a drafter), :class:`Drafter` (the protocol a drafter
implements), :class:`RoundStats` and :class:`GenerationResult`.  The drafter protocol in full (the order of
calls, what ``append_context`` receives, what a drafter may keep) and the decoding contract (prefill,
stopping, per-round statistics): docs/verification.md, "Drafter protocol" and "`generate` and
`generate_ar`".
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
from dartree.timing import timed_head

__all__ = ["Drafter", "RoundStats", "GenerationResult", "SpeculativeDecoder", "generate_ar", "STOP_REASONS",
           "ROUND_STAGES"]

class SpeculativeDecoder:
    """Draft-tree speculative decoding: draft a block, build a tree, verify it in one forward, commit.

    Args:
        target: an :class:`~dartree.models.target.HFTarget` (its ``layer_ids`` must equal the drafter's
            ``target_layer_ids``) or a transformers causal LM (wrapped with those layer ids).
        drafter: follows the :class:`Drafter` protocol.
        builder: a ``TreeBuilder`` (``dartree.make_builder(...)``).
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
        # the builder gets the head through a proxy that times its calls (the ``head`` stage)
        self._timed_head = None if head is None else timed_head(head, self.target.device)

    @property
    def timed_head(self):
        """The head proxy the builder is given (times its calls: the ``head`` stage); ``None`` without a head."""
        return self._timed_head

    # inference mode, not only no_grad: no autograd graph and no version-counter or view tracking on
    # the thousands of small ops of a decode (measured on the zoo, one CPU thread: 6% of a chain decode)
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
        """Decode ``max_new_tokens`` tokens (fewer if a stop token is committed) after ``input_ids``.

        ``temperature == 0`` is greedy (``sampler`` unused); ``> 0`` samples with ``sampler``
        (default: ``GeneratorSampler()`` on torch's global generator).  Output is lossless: greedy
        equals the target's own greedy decoding; sampled output follows the target's distribution,
        and with a ``KeyedSampler`` equals :func:`generate_ar` with the same sampler token for token.
        ``on_round(stats, tokens)``, if given, is called with the first token after the prefill
        (``stats`` is ``None``: no round drafted it), then after every round with that round's
        statistics and the tokens it committed (for streaming): every token is reported once.
        ``sampling``: a :class:`~dartree.Sampling` holding ``temperature``, ``sampler``, ``stop_token_ids``,
        ``top_k``, ``top_p``, ``min_p`` and ``verifier`` at once, instead of those keywords (not with them:
        ``ValueError``).

        Shape:
            input_ids: integer ``[L]`` or ``[1, L]``, ``L >= 1``.
        """
        req = check_request(self.target, input_ids, max_new_tokens, temperature, sampler, stop_token_ids,
                            top_k=top_k, top_p=top_p, min_p=min_p, verifier=verifier, sampling=sampling)
        engine = self.engine(req, single=True)
        engine.admit([req])
        if on_round is not None:
            on_round(None, list(engine.generated[0]))
            engine.on_round = lambda q, stats, kept: on_round(stats, kept)
        engine.run()
        return engine.result(0)

    def engine(self, options: Request | None = None, single: bool = False) -> Engine:
        """A fresh :class:`~dartree.engine.Engine` over this decoder's target, drafter, builder and head with a
        checked request's options (``None``: greedy; ``single``: the drafter used as is, for one request)."""
        return Engine(self.target, self.drafter, self.builder, self._timed_head, options=options, single=single)

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
        """Decode several prompts of any lengths together, all live rows per round; one result per prompt.

        Same arguments as :meth:`generate`, with ``prompts`` a sequence of integer ``[L]`` or ``[1, L]``
        tensors of any lengths; one result per prompt, in order.  Each row equals :meth:`generate` on
        that prompt alone (T=0, and T>0 with a ``KeyedSampler``).
        """
        reqs = check_requests(self.target, prompts, max_new_tokens, temperature, sampler, stop_token_ids,
                              top_k=top_k, top_p=top_p, min_p=min_p, verifier=verifier, sampling=sampling)
        engine = self.engine(reqs[0])
        engine.admit(reqs)
        engine.run()
        return [engine.result(q) for q in range(len(reqs))]


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

    The prefill runs the whole prompt and scores its last position (the first new token), then one
    token per step with ordinary causal attention, the LM head on that one position: the forwards
    HF ``generate`` runs.  The token at absolute position p is drawn by ``sampler.sample(warped logits,
    p)`` (temperature, then top-k / top-p / min-p: :class:`~dartree.verify.warp.Warp`), exactly as
    speculative verification draws it.  Each step is reported as a
    round (committed 1, tree size 0, its forward time under ``verify_s`` and ``target_s``, the argmax
    or sample in ``accept_s``).  ``sampling``: as in ``generate`` (its ``verifier`` unused: AR verifies nothing).
    """
    if not isinstance(target, HFTarget):
        target = as_target(target, ())
    req = check_request(target, input_ids, max_new_tokens, temperature, sampler, stop_token_ids,
                        top_k=top_k, top_p=top_p, min_p=min_p, sampling=sampling)
    engine = Engine(target, options=req, single=True)
    engine.admit([req])
    engine.run()
    return engine.result(0)
