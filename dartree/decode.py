"""The speculative decoding loop, the autoregressive baseline, and the drafter protocol.

Drafter protocol
----------------
A drafter is any object with::

    target_layer_ids: tuple[int, ...]     # target decoder layers whose hidden states it conditions on
    reset() -> None                       # a new prompt: forget all context
    append_context(hidden_states, tokens) -> None
    draft(root) -> DraftBlock

The decoder drives it in this order, for every prompt::

    drafter.reset()
    drafter.append_context(h, prompt)                   # the prefilled prompt
    root = the first new token                          # from the prefill's last logits
    repeat:
        block = drafter.draft(root)                     # root = last committed token, [b]
        ... build, verify ...
        drafter.append_context(h, [root, accepted...])  # exactly the tokens the target just cached

* ``tokens`` is int64 ``[b, m]``: the tokens that entered the target's KV cache since the last call,
  in order.  The drafter's context is therefore always the target's cache: the committed sequence
  minus its last token, which is the next ``root``.  Context positions are implicit: the first
  ``append_context`` token is at absolute position 0, and ``root`` sits at position
  ``len(context)``.
* ``hidden_states`` is float ``[b, m, len(target_layer_ids) * H]``: the target's hidden states of
  ``tokens`` at ``target_layer_ids`` (decoder layer i = HF's ``hidden_states[i + 1]``), concatenated
  in that order; ``None`` when ``target_layer_ids`` is empty.
* Rejected positions are never reported: only committed tokens are ever appended, so a drafter
  keeps nothing from a round's block except what ``append_context`` later confirms.  Anything it
  computes inside ``draft`` (e.g. KV of the block's mask positions) is scratch and must be dropped
  (or cropped) before the next ``append_context``.
* ``draft`` returns a :class:`~dartree.block.DraftBlock` whose ``root`` equals the ``root`` given
  (checked every round: a block built on another root is rejected with a ``ValueError``).

Decoding
--------
``SpeculativeDecoder(target, drafter, builder, head=None).generate(...)`` decodes one prompt.  The
prefill runs the whole prompt and scores its last position only (as the references do); that
gives the first new token, which is the first round's root, so ``1 + sum(r.committed for r in
rounds) == len(tokens)``.  Every round is one drafter call, one build, one target forward.
:mod:`dartree.engine` is the one round, batch-first: ``generate`` is a batch of one,
``generate_batch`` and :mod:`dartree.serve` run it on many rows, :func:`generate_ar` without a drafter.
Stopping: at ``max_new_tokens`` (an accepted path is truncated exactly there) or at
the first stop token (included).  Per round we record the accepted length, the tree size and the
wall time of each stage (:class:`RoundStats`); ``tau`` is the mean committed per round.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

from dartree.builders import TreeBuilder
from dartree.engine import Engine
from dartree.models.target import HFTarget
from dartree.protocols import CorrectionHead, Drafter, Sampler, check_drafter
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
from dartree.timing import check_head, timed_head

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
    ) -> GenerationResult:
        """Decode ``max_new_tokens`` tokens (fewer if a stop token is committed) after ``input_ids``.

        ``temperature == 0`` is greedy (``sampler`` unused); ``> 0`` samples with ``sampler``
        (default: ``GeneratorSampler()`` on torch's global generator).  Output is lossless: greedy
        equals the target's own greedy decoding; sampled output follows the target's distribution,
        and with a ``KeyedSampler`` equals :func:`generate_ar` with the same sampler token for token.
        ``on_round(stats, tokens)``, if given, is called with the first token after the prefill
        (``stats`` is ``None``: no round drafted it), then after every round with that round's
        statistics and the tokens it committed (for streaming): every token is reported once.

        Shape:
            input_ids: integer ``[L]`` or ``[1, L]``, ``L >= 1``.
        """
        req = check_request(self.target, input_ids, max_new_tokens, temperature, sampler, stop_token_ids,
                            top_k=top_k, top_p=top_p, min_p=min_p, verifier=verifier)
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
    ) -> list[GenerationResult]:
        """Decode several prompts of any lengths together, all live rows per round; one result per prompt.

        Same arguments as :meth:`generate`, with ``prompts`` a sequence of integer ``[L]`` or ``[1, L]``
        tensors of any lengths; one result per prompt, in order.  Each row equals :meth:`generate` on
        that prompt alone (T=0, and T>0 with a ``KeyedSampler``).
        """
        reqs = check_requests(self.target, prompts, max_new_tokens, temperature, sampler, stop_token_ids,
                              top_k=top_k, top_p=top_p, min_p=min_p, verifier=verifier)
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
) -> GenerationResult:
    """Autoregressive baseline with the same contract as :meth:`SpeculativeDecoder.generate`.

    The prefill runs the whole prompt and scores its last position (the first new token), then one
    token per step with ordinary causal attention, the LM head on that one position: the forwards
    HF ``generate`` runs.  The token at absolute position p is drawn by ``sampler.sample(warped logits,
    p)`` (temperature, then top-k / top-p / min-p: :class:`~dartree.verify.warp.Warp`), exactly as
    speculative verification draws it.  Each step is reported as a
    round (committed 1, tree size 0, its forward time under ``verify_s`` and ``target_s``, the argmax
    or sample in ``accept_s``).
    """
    if not isinstance(target, HFTarget):
        target = as_target(target, ())
    req = check_request(target, input_ids, max_new_tokens, temperature, sampler, stop_token_ids,
                        top_k=top_k, top_p=top_p, min_p=min_p)
    engine = Engine(target, options=req, single=True)
    engine.admit([req])
    engine.run()
    return engine.result(0)
