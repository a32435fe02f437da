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
    drafter.append_context(h, prompt[:, :-1])          # the prefilled prompt (may be empty)
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
``SpeculativeDecoder(target, drafter, builder, head=None).generate(...)`` decodes one prompt
(batch 1; the verify functions are batched, the loop is not, because rows would commit different
lengths and the cache would become ragged).  The prompt's last token is the first round's root, so
every output token is committed by some round and ``sum(r.committed for r in rounds) ==
len(tokens)``.  Stopping: at ``max_new_tokens`` (an accepted path is truncated exactly there) or at
the first stop token (included).  Per round we record the accepted length, the tree size and the
wall time of each stage (:class:`RoundStats`); ``tau`` is the mean committed per round.
"""

from __future__ import annotations

import math
import operator
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from dartree.block import CorrectionHead, DraftBlock
from dartree.builders import TreeBuilder
from dartree.models.target import HFTarget
from dartree.tree import DraftTree
from dartree.verify.accept import verify_greedy, verify_sampled, walk_greedy
from dartree.verify.sampling import GeneratorSampler, Sampler
from dartree.verify.timing import check_head, timed_head

__all__ = ["Drafter", "RoundStats", "GenerationResult", "SpeculativeDecoder", "generate_ar", "STOP_REASONS",
           "ROUND_STAGES"]

STOP_REASONS = ("max_new_tokens", "stop_token")
#: Disjoint per-round stages, in round order; they sum to ``RoundStats.total_s``.
ROUND_STAGES = ("draft", "head", "builder", "mask", "target", "accept", "context", "kv")


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


@dataclass(frozen=True)
class RoundStats:
    """One round of speculative decoding (or one AR step).

    accepted_length: draft tokens the target accepted (before any truncation).
    committed: tokens appended to the output this round (accepted + bonus, after truncation).
    tree_size: draft nodes in the verified tree (root excluded).
    *_s: wall seconds (CUDA is synchronised at stage boundaries).  The five stages ``draft``
    (``drafter.draft``), ``build`` (the tree builder, head calls included), ``mask`` (tree inputs),
    ``verify`` (target forward + acceptance walk) and ``commit`` (KV compaction, drafter context
    update, bookkeeping) are disjoint and sum to the round.  ``head_s`` is the part of ``build_s``
    spent inside correction-head calls, ``target_s`` the part of ``verify_s`` spent in the target's
    forward, ``context_s`` the part of ``commit_s`` spent in ``drafter.append_context`` (the
    drafter's forward over the newly committed tokens: projection, keys and values).
    """

    accepted_length: int
    committed: int
    tree_size: int
    draft_s: float
    build_s: float
    mask_s: float
    verify_s: float
    commit_s: float
    head_s: float = 0.0
    target_s: float = 0.0
    context_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.draft_s + self.build_s + self.mask_s + self.verify_s + self.commit_s

    @property
    def builder_s(self) -> float:
        """The builder's own time: ``build_s`` outside head calls."""
        return self.build_s - self.head_s

    @property
    def accept_s(self) -> float:
        """The acceptance walk: ``verify_s`` outside the target forward."""
        return self.verify_s - self.target_s

    @property
    def kv_s(self) -> float:
        """The commit outside the drafter's context update: KV compaction and bookkeeping."""
        return self.commit_s - self.context_s

    @property
    def model_s(self) -> float:
        """Time in model forwards: drafter (draft + context update), head calls, target."""
        return self.draft_s + self.context_s + self.head_s + self.target_s

    @property
    def overhead_s(self) -> float:
        """Everything that is not a model forward: round - (drafter forward + head calls + target forward)."""
        return self.total_s - self.model_s


@dataclass(frozen=True)
class GenerationResult:
    """Output of :meth:`SpeculativeDecoder.generate` or :func:`generate_ar`.

    Shape:
        tokens: int64 ``[1, m]`` the new tokens only (the prompt excluded).
        prompt: int64 ``[1, L]``.
    """

    tokens: Tensor
    prompt: Tensor
    rounds: tuple[RoundStats, ...]
    stop_reason: str
    prefill_s: float

    @property
    def sequence(self) -> Tensor:
        """int64 ``[1, L + m]``: prompt followed by the new tokens (what HF ``generate`` returns)."""
        return torch.cat([self.prompt, self.tokens], dim=1)

    @property
    def num_rounds(self) -> int:
        return len(self.rounds)

    @property
    def tau(self) -> float:
        """Mean tokens committed per round (accepted draft tokens + 1 bonus)."""
        return sum(r.committed for r in self.rounds) / max(1, len(self.rounds))

    @property
    def mean_accepted_length(self) -> float:
        return sum(r.accepted_length for r in self.rounds) / max(1, len(self.rounds))

    def stage_seconds(self) -> dict[str, float]:
        """Total wall seconds per stage over all rounds (plus ``prefill``): draft, build, mask, verify, commit."""
        out = {"prefill": self.prefill_s}
        for stage in ("draft", "build", "mask", "verify", "commit"):
            out[stage] = sum(getattr(r, f"{stage}_s") for r in self.rounds)
        return out

    def stage_breakdown(self) -> dict[str, float]:
        """Total wall seconds per disjoint fine stage (:data:`ROUND_STAGES`) over all rounds, plus ``prefill``.

        As :meth:`stage_seconds` with ``build`` split into ``head`` and ``builder``, ``verify`` into
        ``target`` and ``accept``, ``commit`` into ``context`` and ``kv``; same total.
        """
        out = {"prefill": self.prefill_s}
        for stage in ROUND_STAGES:
            out[stage] = sum(getattr(r, f"{stage}_s") for r in self.rounds)
        return out


class _Clock:
    """Stage timer; synchronises CUDA at each mark so that time is charged to the right stage."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.last = self._now()

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()   # deliberate: per-stage wall times need the device idle
        return time.perf_counter()

    def lap(self) -> float:
        now = self._now()
        out, self.last = now - self.last, now
        return out


class _TimedRows:
    """``rows(rows, nodes)``: the target's logits at those (row, node) pairs from its final hidden
    states ``[b, n, H]``, timing each call (the walk of :func:`~dartree.verify.walk_greedy`)."""

    def __init__(self, target: HFTarget, final: Tensor) -> None:
        self.target, self.final, self.seconds = target, final, 0.0

    def __call__(self, rows: list[int], nodes: list[int]) -> Tensor:
        start = time.perf_counter()
        out = self.target.head_logits(self.final[rows, nodes])
        self.seconds += time.perf_counter() - start
        return out


def _as_target(target: HFTarget | nn.Module, layer_ids: tuple[int, ...]) -> HFTarget:
    if isinstance(target, HFTarget):
        if target.layer_ids != layer_ids:
            raise ValueError(f"target: captures layers {target.layer_ids}, but the drafter needs {layer_ids}; "
                             f"build HFTarget(model, layer_ids=drafter.target_layer_ids)")
        return target
    if isinstance(target, nn.Module):
        return HFTarget(target, layer_ids=layer_ids)
    raise ValueError(f"target: expected an HFTarget or a transformers causal LM, got {type(target).__name__}")


@dataclass(frozen=True)
class _Request:
    prompt: Tensor                 # int64 [1, L] on the target's device
    max_new_tokens: int
    temperature: float
    sampler: Sampler | None        # None at temperature 0
    stop: frozenset[int]


def _check_request(
    target: HFTarget,
    input_ids: Tensor,
    max_new_tokens: int,
    temperature: float,
    sampler: Sampler | None,
    stop_token_ids: Iterable[int] | None,
) -> _Request:
    if not isinstance(input_ids, Tensor) or input_ids.is_floating_point() or input_ids.is_complex() \
            or input_ids.dtype == torch.bool:
        raise ValueError("input_ids: expected an integer tensor of shape [L] or [1, L]")
    prompt = input_ids[None] if input_ids.dim() == 1 else input_ids
    if prompt.dim() != 2:
        raise ValueError(f"input_ids: expected shape [L] or [1, L], got {tuple(input_ids.shape)}")
    if prompt.shape[0] != 1:
        raise ValueError(f"input_ids: batch size must be 1 (generate decodes one prompt), got {prompt.shape[0]}")
    length = prompt.shape[1]
    if length == 0:
        raise ValueError("input_ids: empty prompt; need at least one token (the first round's root)")
    limit = target.max_positions
    if limit is not None and length > limit:
        raise ValueError(f"input_ids: prompt of {length} tokens exceeds the model's maximum positions "
                         f"(max_position_embeddings={limit})")
    max_new_tokens = _index("max_new_tokens", max_new_tokens)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected an int >= 1, got {max_new_tokens!r}")
    if limit is not None and length + max_new_tokens > limit:
        raise ValueError(f"max_new_tokens: prompt ({length}) + max_new_tokens ({max_new_tokens}) exceeds the "
                         f"model's maximum positions (max_position_embeddings={limit}); allowed <= {limit - length}")
    if target.capacity is not None and length + max_new_tokens - 1 > target.capacity:
        raise ValueError(f"max_new_tokens: prompt + max_new_tokens - 1 = {length + max_new_tokens - 1} exceeds the "
                         f"static cache's capacity {target.capacity}")
    prompt = prompt.to(device=target.device, dtype=torch.int64)
    # One sync per call (not per round): token ids out of range would index the embedding out of bounds.
    if bool(((prompt < 0) | (prompt >= target.vocab_size)).any()):
        raise ValueError(f"input_ids: token ids must lie in [0, {target.vocab_size})")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not math.isfinite(temperature) \
            or temperature < 0:
        raise ValueError(f"temperature: expected a finite number >= 0, got {temperature!r}")
    if temperature == 0:
        sampler = None             # greedy: the sampler is unused
    elif sampler is None:
        sampler = GeneratorSampler()
    elif not hasattr(sampler, "sample"):
        raise ValueError(f"sampler: expected None, a GeneratorSampler, a KeyedSampler or any object with "
                         f"sample(logits, positions), got {type(sampler).__name__}")
    stop = _stop_tokens(stop_token_ids, target.vocab_size)
    return _Request(prompt, max_new_tokens, float(temperature), sampler, stop)


def _index(name: str, value: object) -> int:
    """``operator.index(value)`` (Python, numpy and 0-d integer tensor integers), never a bool."""
    if isinstance(value, bool) or (isinstance(value, Tensor) and value.dtype == torch.bool):
        raise ValueError(f"{name}: expected an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name}: expected an integer, got {type(value).__name__} {value!r}") from None


def _stop_tokens(stop_token_ids: object, vocab_size: int) -> frozenset[int]:
    """Stop tokens from an int, a numpy / tensor integer or array, or an iterable of integers."""
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
            value = _index("stop_token_ids", t)
        except ValueError:
            bad.append(t)
            continue
        (stop.add(value) if 0 <= value < vocab_size else bad.append(t))
    if bad:
        raise ValueError(f"stop_token_ids: each must be an integer in [0, {vocab_size}), got {sorted(map(repr, bad))}")
    return frozenset(stop)


def _check_block(block: object, root: Tensor, vocab_size: int) -> None:
    """A drafter's block must be a batch-1 DraftBlock over the target's vocabulary, built on ``root``."""
    if not isinstance(block, DraftBlock) or block.batch_size != 1:
        raise ValueError("drafter: draft(root) must return a DraftBlock of batch 1")
    if block.vocab_size > vocab_size:
        raise ValueError(f"drafter: block vocabulary {block.vocab_size} exceeds the target's "
                         f"{vocab_size}; draft tokens must be valid target tokens")
    # The tree's root token is block.root: a block built on another root would be verified on the
    # wrong token.  Same object: nothing to compare (the common case; a comparison syncs on CUDA).
    if block.root is not root and not torch.equal(block.root, root.to(block.root.device)):
        raise ValueError(f"drafter: draft(root) returned a block whose root {block.root.tolist()} differs from "
                         f"the root it was given {root.tolist()}; DraftBlock.root must equal the root argument")


def _truncate(tokens: list[int], remaining: int, stop: frozenset[int]) -> tuple[list[int], bool]:
    """The committed tokens that fit, and whether a stop token ended them."""
    tokens = tokens[:remaining]
    for i, t in enumerate(tokens):
        if t in stop:
            return tokens[: i + 1], True
    return tokens, False


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
        self.target = _as_target(target, tuple(drafter.target_layer_ids))
        self.drafter = drafter
        self.builder = builder
        self.head = head
        # the builder gets the head through a proxy that times its calls (the ``head`` stage)
        self._timed_head = None if head is None else timed_head(head, self.target.device)

    def _fit(self, tree: DraftTree, gamma: int) -> DraftTree:
        """Drop nodes the model cannot hold: positions past ``max_positions``, slots past a static cache.

        Only near the end of the position range or the cache; nodes are sorted so that parents precede
        children, hence both cuts are prefix-closed.  ``select`` syncs, but only in those rounds.
        """
        prefix = self.target.length
        keep = None
        limit = self.target.max_positions
        if limit is not None and prefix + gamma > limit - 1:
            keep = tree.depths <= limit - 1 - prefix
        room = None if self.target.capacity is None else self.target.capacity - prefix
        if room is not None and tree.max_nodes > room:
            first = torch.arange(tree.max_nodes, device=tree.device)[None, :] < room
            keep = first if keep is None else keep & first
        return tree if keep is None else tree.select(keep)

    @torch.no_grad()    # builders call heads on every round: never record an autograd graph
    def generate(
        self,
        input_ids: Tensor,
        max_new_tokens: int,
        temperature: float = 0.0,
        sampler: Sampler | None = None,
        stop_token_ids: Iterable[int] | None = None,
        on_round: Callable[[RoundStats, list[int]], None] | None = None,
    ) -> GenerationResult:
        """Decode ``max_new_tokens`` tokens (fewer if a stop token is committed) after ``input_ids``.

        ``temperature == 0`` is greedy (``sampler`` unused); ``> 0`` samples with ``sampler``
        (default: ``GeneratorSampler()`` on torch's global generator).  Output is lossless: greedy
        equals the target's own greedy decoding; sampled output follows the target's distribution,
        and with a ``KeyedSampler`` equals :func:`generate_ar` with the same sampler token for token.
        ``on_round(stats, tokens)``, if given, is called after every round with that round's
        statistics and the tokens it committed (for streaming).

        Shape:
            input_ids: integer ``[L]`` or ``[1, L]``, ``L >= 1``.
        """
        target, drafter = self.target, self.drafter
        req = _check_request(target, input_ids, max_new_tokens, temperature, sampler, stop_token_ids)
        clock = _Clock(target.device)
        context = req.prompt[:, :-1]
        out = target.prefill(context)
        drafter.reset()
        drafter.append_context(out.hidden, context)
        root = req.prompt[:, -1]
        # T=0 on the CPU: the LM head runs only on the nodes the greedy walk visits (probed once per target)
        lazy = req.sampler is None and target.scores_rows_apart
        prefill_s = clock.lap()

        generated: list[int] = []
        rounds: list[RoundStats] = []
        stopped = False
        while len(generated) < req.max_new_tokens and not stopped:
            prefix = target.length
            block = drafter.draft(root)
            _check_block(block, root, target.vocab_size)
            draft_s = clock.lap()
            timed = self._timed_head
            tree = self._fit(self.builder.build(block, timed), block.gamma)
            build_s = clock.lap()
            head_s = 0.0 if timed is None else timed.take()
            inputs = target.tree_inputs(tree)
            mask_s = clock.lap()
            scored = target.forward_tree(inputs, logits="root" if lazy else "all")
            target_s = clock.lap()
            if lazy:
                rows = _TimedRows(target, scored.final)
                result = walk_greedy(tree, scored.logits[:, 0], rows)
            elif req.sampler is None:
                result = verify_greedy(tree, scored.logits)
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
            kept, stopped = _truncate(committed, req.max_new_tokens - len(generated), req.stop)
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
            drafter.append_context(hidden, cached)      # the drafter's forward over the new context
            context_s = clock.lap()
            rounds.append(RoundStats(accepted_length, count, tree_size, draft_s, build_s, mask_s, verify_s,
                                     kv_s + context_s, head_s, target_s, context_s))
            if on_round is not None:
                on_round(rounds[-1], kept)

        tokens = torch.tensor([generated], dtype=torch.int64, device=target.device)
        return GenerationResult(tokens=tokens, prompt=req.prompt, rounds=tuple(rounds),
                                stop_reason="stop_token" if stopped else "max_new_tokens", prefill_s=prefill_s)

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
        from dartree.batch import generate_batch  # local import: dartree.batch imports this module

        return generate_batch(self, prompts, max_new_tokens, temperature, sampler, stop_token_ids)


@torch.no_grad()
def generate_ar(
    target: HFTarget | nn.Module,
    input_ids: Tensor,
    max_new_tokens: int,
    temperature: float = 0.0,
    sampler: Sampler | None = None,
    stop_token_ids: Iterable[int] | None = None,
) -> GenerationResult:
    """Autoregressive baseline with the same contract as :meth:`SpeculativeDecoder.generate`.

    One token per step with ordinary causal attention; the token at absolute position p is drawn by
    ``sampler.sample(logits / temperature, p)``, exactly as speculative verification draws it.  Each
    step is reported as a round (committed 1, tree size 0, its forward time under ``verify_s`` and
    ``target_s``, the argmax or sample in ``accept_s``).
    """
    if not isinstance(target, HFTarget):
        target = _as_target(target, ())
    req = _check_request(target, input_ids, max_new_tokens, temperature, sampler, stop_token_ids)
    clock = _Clock(target.device)
    target.prefill(req.prompt[:, :-1])
    root = req.prompt[:, -1]
    prefill_s = clock.lap()
    generated: list[int] = []
    rounds: list[RoundStats] = []
    stopped = False
    while len(generated) < req.max_new_tokens and not stopped:
        logits = target.extend(root[:, None]).logits[:, -1]                      # [1, V]
        target_s = clock.lap()
        if req.sampler is None:
            nxt = logits.argmax(dim=-1)
        else:
            position = torch.full((1,), target.length, dtype=torch.int64, device=target.device)
            nxt = req.sampler.sample(logits.float() / req.temperature, position).to(torch.int64)
        verify_s = target_s + clock.lap()
        token = int(nxt[0])            # one sync per step, on purpose: stop tokens are checked on the host
        generated.append(token)
        stopped = token in req.stop
        root = nxt
        rounds.append(RoundStats(0, 1, 0, 0.0, 0.0, 0.0, verify_s, clock.lap(), 0.0, target_s))
    tokens = torch.tensor([generated], dtype=torch.int64, device=target.device)
    return GenerationResult(tokens=tokens, prompt=req.prompt, rounds=tuple(rounds),
                            stop_reason="stop_token" if stopped else "max_new_tokens", prefill_s=prefill_s)
