"""What every entry point's round shares (single, batched, served, AR): the request checks, the per-round result
types, the stage clock, the contract check of a drafter's block, the cut of a tree to the model's limits and the
truncation at a stop token.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
from torch import Tensor, nn

from dartree.arguments import index_arg
from dartree.block import DraftBlock
from dartree.models.target import HFTarget
from dartree.sampling_options import (
    DEFAULT_VERIFIER,
    SAMPLED_VERIFIERS,
    VERIFIERS,
    Sampling,
    sampling_of,
    stop_tokens,
)
from dartree.tree import DraftTree
from dartree.verify.sampling import GeneratorSampler, Sampler
from dartree.verify.warp import Warp

__all__ = ["RoundStats", "StageTimes", "GenerationResult", "STOP_REASONS", "ROUND_STAGES", "Request", "Clock",
           "TimedRows", "ROWS_PER_PASS", "WalkRows", "scored_rows", "walk_pays",
           "as_target", "check_options", "check_request", "check_requests", "VERIFIERS", "DEFAULT_VERIFIER",
           "SAMPLED_VERIFIERS", "check_block", "fit_tree", "truncate", "index_arg", "stop_tokens"]

STOP_REASONS = ("max_new_tokens", "stop_token")
#: Disjoint per-round stages, in round order; they sum to ``RoundStats.total_s``.
ROUND_STAGES = ("draft", "head", "builder", "mask", "target", "accept", "context", "kv")


class StageTimes(NamedTuple):
    """A round's wall seconds by stage, as :class:`RoundStats` holds them (which contain which: its docstring)."""

    draft_s: float = 0.0
    build_s: float = 0.0
    mask_s: float = 0.0
    verify_s: float = 0.0
    commit_s: float = 0.0
    head_s: float = 0.0
    target_s: float = 0.0
    context_s: float = 0.0


@dataclass(frozen=True)
class RoundStats:
    """One round of speculative decoding (or one AR step); the stages and what each time (``*_s``, wall seconds)
    holds: docs/verification.md, "One round".

    accepted_length: draft tokens the target accepted (before any truncation).
    committed: tokens appended to the output this round (accepted + bonus, after truncation).
    tree_size: draft nodes in the verified tree (root excluded).
    head_calls: correction-head method calls in the build (what bound pruning saves).
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
    head_calls: int = 0

    @classmethod
    def of(cls, accepted_length: int, committed: int, tree_size: int, times: StageTimes,
           head_calls: int = 0) -> RoundStats:
        """A round's statistics from its stage times."""
        return cls(accepted_length, committed, tree_size, *times, head_calls)      # perf: StageTimes in field order

    @property
    def times(self) -> StageTimes:
        """The round's stage times as one record."""
        return StageTimes(self.draft_s, self.build_s, self.mask_s, self.verify_s, self.commit_s, self.head_s,
                          self.target_s, self.context_s)

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
    """Output of :meth:`SpeculativeDecoder.generate` or :func:`generate_ar`: the first new token comes from the
    prefill, ``rounds`` are the rounds after it (docs/verification.md, "``generate`` and ``generate_ar``").

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

    def stage_seconds(self, stages: Sequence[str] = ("draft", "build", "mask", "verify", "commit")) -> dict:
        """Total wall seconds per stage over all rounds, plus ``prefill``: by default the five disjoint stages."""
        return {"prefill": self.prefill_s, **{s: sum(getattr(r, f"{s}_s") for r in self.rounds) for s in stages}}

    def stage_breakdown(self) -> dict[str, float]:
        """:meth:`stage_seconds` of the eight disjoint fine stages (:data:`ROUND_STAGES`); the same total."""
        return self.stage_seconds(ROUND_STAGES)


class Clock:
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


class TimedRows:
    """``rows(rows, nodes)``: the target's logits at those (row, node) pairs from its final hidden
    states ``[b, n, H]``, timing each call (the walk of :func:`~dartree.verify.walk_greedy`)."""

    def __init__(self, target: HFTarget, final: Tensor) -> None:
        self.target, self.final, self.seconds = target, final, 0.0

    def __call__(self, rows: list[int], nodes: list[int]) -> Tensor:
        start = time.perf_counter()
        out = self.target.head_logits(self.final[rows, nodes])
        self.seconds += time.perf_counter() - start
        return out


def scored_rows(logits: Tensor):
    """``rows(rows, nodes) -> logits[rows, nodes]``: the walk's node logits when the forward scored every node."""
    return lambda rows, nodes: logits[rows, nodes]


#: perf (CPU): one LM-head call on a tree's ``n`` nodes costs about as much as ``1 + n / ROWS_PER_PASS`` calls on
#: one node (each call streams the whole output embedding; the rows add little: docs/verification.md,
#: "Acceptance").  A constant, not a timing, so that the rows a decode scores do not depend on the load.
ROWS_PER_PASS = 16


def walk_pays(nodes: int, committed: float) -> bool:
    """Whether scoring only the root in the tree forward, then one LM-head row per node the walk
    visits (``committed`` a round: the accepted nodes plus the root), costs less than one LM-head
    call on all ``nodes`` (root included) in the forward (:data:`ROWS_PER_PASS`)."""
    return committed < 1 + nodes / ROWS_PER_PASS


class WalkRows:
    """Per decode: which logits a round's tree forward computes, ``"all"`` or ``"root"`` (the walk then runs the
    LM head on each node it visits).  Root only while the decode's mean committed tokens per round so far make
    that pay (:func:`walk_pays`); the first round scores every node.  It reads the committed tokens only, never
    a timing, so a decode is reproducible.  ``allowed=False`` (an accelerator, a model whose logits are not its
    LM head on the final state, a sampler without keyed draws): every round scores every node.
    """

    def __init__(self, allowed: bool) -> None:
        self.allowed, self.rounds, self.committed = allowed, 0, 0

    def logits(self, nodes: int) -> str:
        """``"root"`` or ``"all"`` for the next round's forward of a tree of ``nodes`` nodes."""
        lazy = self.allowed and self.rounds > 0 and walk_pays(nodes, self.committed / self.rounds)
        return "root" if lazy else "all"

    def record(self, committed: int) -> None:
        """One more round, in which the walk committed ``committed`` tokens (accepted nodes + 1)."""
        self.rounds += 1
        self.committed += committed


def as_target(target: HFTarget | nn.Module, layer_ids: tuple[int, ...] | None = None) -> HFTarget:
    """``target`` as an :class:`HFTarget` capturing ``layer_ids`` (a causal LM is wrapped; an HFTarget is checked);
    ``None`` (the AR baselines): an HFTarget as it is, a causal LM wrapped capturing no layers."""
    if isinstance(target, HFTarget):
        if layer_ids is not None and target.layer_ids != layer_ids:
            raise ValueError(f"target: captures layers {target.layer_ids}, but the drafter needs {layer_ids}; "
                             f"build HFTarget(model, layer_ids=drafter.target_layer_ids)")
        return target
    if isinstance(target, nn.Module):
        return HFTarget(target, layer_ids=layer_ids or ())
    raise ValueError(f"target: expected an HFTarget or a transformers causal LM, got {type(target).__name__}")


@dataclass(frozen=True)
class Request:
    """A decode's checked options (:func:`check_options`, shared by all its requests) and, once given, one request's
    ``prompt`` (int64 ``[1, L]`` on the target's device).  ``sampler`` is ``None`` at temperature 0; ``stop`` the
    stop tokens; ``warp`` the target's warped distribution and ``verifier`` the acceptance rule (:data:`VERIFIERS`;
    ``"greedy"`` at temperature 0)."""

    max_new_tokens: int
    temperature: float
    sampler: Sampler | None
    stop: frozenset[int]
    warp: Warp | None
    verifier: str
    prompt: Tensor | None = None


def _check_prompt(target: HFTarget, input_ids: object, max_new_tokens: int) -> Tensor:
    if not isinstance(input_ids, Tensor) or input_ids.is_floating_point() or input_ids.is_complex() \
            or input_ids.dtype == torch.bool:
        raise ValueError("input_ids: expected an integer tensor of shape [L] or [1, L]")
    if input_ids.device.type == "meta":
        raise ValueError("input_ids: a tensor on the 'meta' device holds no values; pass real token ids")
    prompt = input_ids[None] if input_ids.dim() == 1 else input_ids
    if prompt.dim() != 2:
        raise ValueError(f"input_ids: expected shape [L] or [1, L], got {tuple(input_ids.shape)}")
    if prompt.shape[0] != 1:
        raise ValueError(f"input_ids: batch size must be 1 (generate decodes one prompt), got {prompt.shape[0]}")
    length = prompt.shape[1]
    if length == 0:
        raise ValueError("input_ids: empty prompt; need at least one token (the prefill scores its last one)")
    limit = target.max_positions
    if limit is not None and length > limit:
        raise ValueError(f"input_ids: prompt of {length} tokens exceeds the model's maximum positions "
                         f"(max_position_embeddings={limit})")
    if limit is not None and length + max_new_tokens > limit:
        raise ValueError(f"max_new_tokens: prompt ({length}) + max_new_tokens ({max_new_tokens}) exceeds the "
                         f"model's maximum positions (max_position_embeddings={limit}); allowed <= {limit - length}")
    if target.capacity is not None and length + max_new_tokens - 1 > target.capacity:
        raise ValueError(f"max_new_tokens: prompt + max_new_tokens - 1 = {length + max_new_tokens - 1} exceeds the "
                         f"static cache's capacity {target.capacity}")
    # a copy even when device and dtype match: the drafter, the target and the result hold the prompt, and
    # none may share the caller's tensor (a drafter editing its tokens argument changed the caller's ids)
    prompt = prompt.to(device=target.device, dtype=torch.int64, copy=True)
    # One sync per call (not per round): token ids out of range would index the embedding out of bounds.
    if bool(((prompt < 0) | (prompt >= target.vocab_size)).any()):
        raise ValueError(f"input_ids: token ids must lie in [0, {target.vocab_size})")
    return prompt


def check_options(target: HFTarget, max_new_tokens: object, sampling: Sampling | None = None,
                  **keywords: object) -> Request:
    """The options of a decode, checked (every argument named in its error) and normalised: ``sampling``, or
    the individual keywords (:class:`~dartree.sampling_options.Sampling`'s fields), never both
    (:func:`~dartree.sampling_options.sampling_of`); here the stop tokens meet the target's vocabulary.

    At T>0 a missing sampler is a fresh ``GeneratorSampler()`` (torch's global generator), and a missing
    verifier is :data:`DEFAULT_VERIFIER` with it, ``"match"`` with a ``KeyedSampler`` or a custom sampler; at
    T=0 decoding is greedy: no sampler, no warp, verifier ``"greedy"``.
    """
    max_new_tokens = index_arg("max_new_tokens", max_new_tokens)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected an int >= 1, got {max_new_tokens!r}")
    sampling = sampling_of(sampling, **keywords)
    stop = stop_tokens(sampling.stop_token_ids, target.vocab_size)
    if sampling.temperature == 0:
        return Request(max_new_tokens, 0.0, None, stop, None, "greedy")
    sampler = GeneratorSampler() if sampling.sampler is None else sampling.sampler
    # keyed (or custom) draws verify by matching; a torch.Generator: the default
    verifier = sampling.verifier or (DEFAULT_VERIFIER if type(sampler) is GeneratorSampler else "match")
    return Request(max_new_tokens, sampling.temperature, sampler, stop, sampling.warp, verifier)


def check_request(target: HFTarget, input_ids: Tensor, max_new_tokens: int, temperature: float = 0.0,
                  sampler: Sampler | None = None, stop_token_ids: Iterable[int] | None = None,
                  **options) -> Request:
    """One request, checked (every argument named in its error) and normalised; ``options``: ``top_k``,
    ``top_p``, ``min_p``, ``verifier``, or ``sampling`` instead of all the sampling keywords (:func:`check_options`)."""
    opts = check_options(target, max_new_tokens, temperature=temperature, sampler=sampler,
                         stop_token_ids=stop_token_ids, **options)
    return replace(opts, prompt=_check_prompt(target, input_ids, opts.max_new_tokens))


def check_requests(target: HFTarget, prompts: Sequence[Tensor], max_new_tokens: int, temperature: float = 0.0,
                   sampler: Sampler | None = None, stop_token_ids: Iterable[int] | None = None,
                   **options) -> list[Request]:
    """A request per prompt with shared options, normalised once (a stop-token iterator is read once,
    one default sampler is shared by every row); a bad prompt is named by its index."""
    if isinstance(prompts, Tensor) or not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise ValueError("prompts: expected a non-empty sequence of 1-D integer tensors (one per request)")
    opts = check_options(target, max_new_tokens, temperature=temperature, sampler=sampler,
                         stop_token_ids=stop_token_ids, **options)
    reqs = []
    for i, p in enumerate(prompts):
        try:
            reqs.append(replace(opts, prompt=_check_prompt(target, p, opts.max_new_tokens)))
        except ValueError as err:
            raise ValueError(f"prompts[{i}]: {err}") from None
    return reqs


def check_block(block: object, roots: Tensor, vocab_size: int, rows: int) -> None:
    """A drafter's block must be a DraftBlock of ``rows`` rows over the target's vocabulary, built on ``roots``."""
    if not isinstance(block, DraftBlock) or block.batch_size != rows:
        raise ValueError(f"drafter: draft must return a DraftBlock of batch {rows}, got "
                         f"{type(block).__name__ if not isinstance(block, DraftBlock) else block.batch_size}")
    if block.vocab_size > vocab_size:
        raise ValueError(f"drafter: block vocabulary {block.vocab_size} exceeds the target's "
                         f"{vocab_size}; draft tokens must be valid target tokens")
    # The tree's root token is block.root: a block built on another root would be verified on the
    # wrong token.  Same object: nothing to compare (the common case; a comparison syncs on CUDA).
    if block.root is not roots and not torch.equal(block.root, roots.to(block.root.device)):
        raise ValueError(f"drafter: draft returned a block whose root {block.root.tolist()} differs from "
                         f"the root it was given {roots.tolist()}; DraftBlock.root must equal the root argument")


def fit_tree(tree: DraftTree, gamma: int, target: HFTarget) -> DraftTree:
    """Drop the nodes the model cannot hold: positions past ``max_positions`` (row ``r``'s root sits at position
    ``target.lengths[r]``), slots past a static cache's capacity (``target.length`` columns in use).

    Only near the end of the position range or the cache; nodes are sorted so that parents precede
    children, hence both cuts are prefix-closed.  ``select`` syncs, but only in those rounds.
    """
    keep = None
    limit, lengths = target.max_positions, target.lengths
    if limit is not None and max(lengths) + gamma > limit - 1:
        room = limit - 1 - torch.tensor(lengths, dtype=torch.int64, device=tree.device)
        keep = tree.depths <= room[:, None]
    space = None if target.capacity is None else target.capacity - target.length
    if space is not None and tree.max_nodes > space:
        first = torch.arange(tree.max_nodes, device=tree.device)[None, :] < space
        keep = first if keep is None else keep & first
    return tree if keep is None else tree.select(keep)


def truncate(tokens: list[int], remaining: int, stop: frozenset[int]) -> tuple[list[int], bool]:
    """The committed tokens that fit, and whether a stop token ended them."""
    tokens = tokens[:remaining]
    for i, t in enumerate(tokens):
        if t in stop:
            return tokens[: i + 1], True
    return tokens, False
