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
:mod:`dartree.batch` runs the same round on many rows; the pieces both share are public in
:mod:`dartree.rounds`.  Stopping: at ``max_new_tokens`` (an accepted path is truncated exactly there) or at
the first stop token (included).  Per round we record the accepted length, the tree size and the
wall time of each stage (:class:`RoundStats`); ``tau`` is the mean committed per round.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from dartree.batch import generate_batch
from dartree.block import CorrectionHead, DraftBlock
from dartree.builders import TreeBuilder, checked_tree
from dartree.models.target import HFTarget
from dartree.rounds import (
    ROUND_STAGES,
    STOP_REASONS,
    Clock,
    GenerationResult,
    RoundStats,
    TimedRows,
    WalkRows,
    as_target,
    check_block,
    check_request,
    first_tokens,
    fit_tree,
    scored_rows,
    truncate,
)
from dartree.verify.accept import verify_greedy, verify_sampled, walk_greedy, walk_greedy_logits, walk_sampled
from dartree.verify.sampling import KeyedSampler, Sampler, sample_checked
from dartree.verify.timing import check_head, timed_head

__all__ = ["Drafter", "RoundStats", "GenerationResult", "SpeculativeDecoder", "generate_ar", "STOP_REASONS",
           "ROUND_STAGES"]

@runtime_checkable
class Drafter(Protocol):
    """A block drafter driven by :class:`SpeculativeDecoder` (see the module docstring).

    Shape:
        append_context: hidden_states float ``[b, m, len(target_layer_ids) * H]`` or ``None``,
                        tokens int64 ``[b, m]``.
        draft:          root int64 ``[b]`` -> DraftBlock with logits ``[b, gamma, V]``.
    """

    target_layer_ids: tuple[int, ...]

    def reset(self) -> None: ...

    def append_context(self, hidden_states: Tensor | None, tokens: Tensor) -> None: ...

    def draft(self, root: Tensor) -> DraftBlock: ...


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
        for attr in ("reset", "append_context", "draft", "target_layer_ids"):
            if not hasattr(drafter, attr):
                raise ValueError(f"drafter: missing {attr!r}; a drafter needs target_layer_ids, reset(), "
                                 f"append_context(hidden_states, tokens) and draft(root)")
        if not hasattr(builder, "build") or not hasattr(builder, "needs_head"):
            raise ValueError(f"builder: expected a TreeBuilder (dartree.make_builder), got {type(builder).__name__}")
        if builder.needs_head and head is None:
            raise ValueError(f"head: builder {getattr(builder, 'name', builder)!r} needs a CorrectionHead")
        if not builder.needs_head and head is not None:
            raise ValueError(f"head: builder {getattr(builder, 'name', builder)!r} uses no head; pass head=None")
        if head is not None:
            check_head(head)
        self.target = as_target(target, tuple(drafter.target_layer_ids))
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
        target, drafter = self.target, self.drafter
        req = check_request(target, input_ids, max_new_tokens, temperature, sampler, stop_token_ids)
        clock = Clock(target.device)
        length = req.prompt.shape[1]
        out = target.prefill(req.prompt, logits="last")
        drafter.reset()
        drafter.append_context(out.hidden, req.prompt.clone())   # its own copy: the result keeps req.prompt
        root = first_tokens(out.logits[:, -1], (req,), torch.full((1,), length, device=target.device))
        first = int(root[0])            # one sync, on purpose: the first token may be a stop token
        generated, stopped = [first], first in req.stop
        # on the CPU, greedy or with a keyed sampler (its draw at a node depends on nothing else: walk_sampled
        # equals verify_sampled), the walk draws only at the nodes it visits, and while walks are short the LM
        # head runs only there too (WalkRows; scores_rows_apart: probed once per target)
        walks = (req.sampler is None or type(req.sampler) is KeyedSampler) and target.device.type == "cpu"
        policy = WalkRows(walks and target.scores_rows_apart)
        prefill_s = clock.lap()
        if on_round is not None:
            on_round(None, [first])

        rounds: list[RoundStats] = []
        while len(generated) < req.max_new_tokens and not stopped:
            prefix = target.length
            block = drafter.draft(root)
            check_block(block, root, target.vocab_size)
            draft_s = clock.lap()
            timed = self._timed_head
            # a user builder's tree is checked before the target sees it (~0.1-0.3 ms of numpy on the CPU
            # in a round; on an accelerator one host sync, on purpose: a bad tree must fail here, not
            # inside the target); dartree's own strategies build decodable trees by construction and skip it
            tree = fit_tree(checked_tree(self.builder, self.builder.build(block, timed), block), block.gamma,
                            (prefix,), prefix, target)
            build_s = clock.lap()
            head_s, head_calls = (0.0, 0) if timed is None else (timed.take(), timed.take_calls())
            inputs = target.tree_inputs(tree)
            mask_s = clock.lap()
            lazy = policy.logits(inputs.input_ids.shape[1]) == "root"
            scored = target.forward_tree(inputs, logits="root" if lazy else "all")
            target_s = clock.lap()
            if lazy:
                rows = TimedRows(target, scored.final)
                if req.sampler is None:
                    result = walk_greedy(tree, scored.logits[:, 0], rows)
                else:
                    result = walk_sampled(tree, scored.logits[:, 0], rows, req.temperature, req.sampler, prefix)
            elif req.sampler is None:
                result = walk_greedy_logits(tree, scored.logits) if walks else verify_greedy(tree, scored.logits)
            elif walks:           # every node scored, drawn only where the walk goes
                result = walk_sampled(tree, scored.logits[:, 0], scored_rows(scored.logits), req.temperature,
                                      req.sampler, prefix)
            else:
                result = verify_sampled(tree, scored.logits, req.temperature, req.sampler, prefix)
            verify_s = target_s + clock.lap()
            if lazy:
                target_s += rows.seconds                # LM-head rows of the walk are target work
            # One host sync per round, on purpose: the loop must know how many tokens were committed
            # (to size the cache and to check stop tokens).  Tokens and tree size come back together.
            n = result.tokens.shape[1]
            host = torch.cat([result.tokens[0], result.accepted[0], tree.num_nodes]).tolist()
            tree_size, row, path = host[-1] - 1, host[:n], host[n:2 * n]
            committed = row[: row.index(-1)] if -1 in row else row
            accepted_length = len(committed) - 1
            policy.record(len(committed))
            kept, stopped = truncate(committed, req.max_new_tokens - len(generated), req.stop)
            count = len(kept)
            target.commit(result.accepted, count, path[:count])   # prefix + root + (count - 1) accepted nodes
            hidden = None
            if scored.hidden is not None:
                hidden = torch.gather(scored.hidden, 1, result.accepted[:, :count, None].expand(
                    -1, -1, scored.hidden.shape[-1]))
            cached = torch.cat([root[:, None], result.tokens[:, : count - 1]], dim=1)
            root = result.tokens[:, count - 1]
            generated.extend(kept)
            kv_s = clock.lap()
            # held by a DFlash drafter until its next draft (one drafter forward per round)
            drafter.append_context(hidden, cached)
            context_s = clock.lap()
            rounds.append(RoundStats(accepted_length, count, tree_size, draft_s, build_s, mask_s, verify_s,
                                     kv_s + context_s, head_s, target_s, context_s, head_calls))
            if on_round is not None:
                on_round(rounds[-1], kept)

        tokens = torch.tensor([generated], dtype=torch.int64, device=target.device)
        return GenerationResult(tokens=tokens, prompt=req.prompt, rounds=tuple(rounds),
                                stop_reason=STOP_REASONS[1] if stopped else STOP_REASONS[0], prefill_s=prefill_s)

    def generate_batch(
        self,
        prompts,
        max_new_tokens: int,
        temperature: float = 0.0,
        sampler: Sampler | None = None,
        stop_token_ids: Iterable[int] | None = None,
    ) -> list[GenerationResult]:
        """Decode several prompts of any lengths together, all live rows per round; one result per prompt.

        Each row equals :meth:`generate` on that prompt alone; see :func:`dartree.batch.generate_batch`.
        """
        return generate_batch(self, prompts, max_new_tokens, temperature, sampler, stop_token_ids)


@torch.inference_mode()      # as SpeculativeDecoder.generate
def generate_ar(
    target: HFTarget | nn.Module,
    input_ids: Tensor,
    max_new_tokens: int,
    temperature: float = 0.0,
    sampler: Sampler | None = None,
    stop_token_ids: Iterable[int] | None = None,
) -> GenerationResult:
    """Autoregressive baseline with the same contract as :meth:`SpeculativeDecoder.generate`.

    The prefill runs the whole prompt and scores its last position (the first new token), then one
    token per step with ordinary causal attention, the LM head on that one position: the forwards
    HF ``generate`` runs.  The token at absolute position p is drawn by ``sampler.sample(logits /
    temperature, p)``, exactly as speculative verification draws it.  Each step is reported as a
    round (committed 1, tree size 0, its forward time under ``verify_s`` and ``target_s``, the argmax
    or sample in ``accept_s``).
    """
    if not isinstance(target, HFTarget):
        target = as_target(target, ())
    req = check_request(target, input_ids, max_new_tokens, temperature, sampler, stop_token_ids)
    clock = Clock(target.device)
    logits = target.prefill(req.prompt, logits="last").logits[:, -1]                # [1, V]
    nxt = first_tokens(logits, (req,), torch.full((1,), target.length, device=target.device))
    token = int(nxt[0])                # one sync per step, on purpose: stop tokens are checked on the host
    generated, stopped = [token], token in req.stop
    prefill_s = clock.lap()
    rounds: list[RoundStats] = []
    while len(generated) < req.max_new_tokens and not stopped:
        logits = target.extend(nxt[:, None]).logits[:, -1]                      # [1, V]
        target_s = clock.lap()
        if req.sampler is None:
            nxt = logits.argmax(dim=-1)
        else:
            position = torch.full((1,), target.length, dtype=torch.int64, device=target.device)
            nxt = sample_checked(req.sampler, logits.float() / req.temperature, position).to(torch.int64)
        verify_s = target_s + clock.lap()
        token = int(nxt[0])            # one sync per step, on purpose: stop tokens are checked on the host
        generated.append(token)
        stopped = token in req.stop
        rounds.append(RoundStats(0, 1, 0, 0.0, 0.0, 0.0, verify_s, clock.lap(), 0.0, target_s))
    tokens = torch.tensor([generated], dtype=torch.int64, device=target.device)
    return GenerationResult(tokens=tokens, prompt=req.prompt, rounds=tuple(rounds),
                            stop_reason=STOP_REASONS[1] if stopped else STOP_REASONS[0], prefill_s=prefill_s)
