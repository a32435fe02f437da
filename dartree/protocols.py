"""The protocols a user's objects follow (:class:`Drafter`, :class:`BatchDrafter`, :class:`CorrectionHead`,
:class:`Sampler`) and their checks, in one place: the entry points' object checks, a head call's argument checks and
the lookup of an optional head method (:func:`head_method`).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from dartree.block import DraftBlock

__all__ = ["Drafter", "BatchDrafter", "CorrectionHead", "Sampler", "DRAFTER_MEMBERS", "BATCH_DRAFTER_MEMBERS",
           "HEAD_METHODS", "OPTIONAL_HEAD_METHODS", "check_head", "check_drafter", "is_batch_drafter",
           "check_sampler", "head_method", "check_depth", "check_states", "check_tokens",
           "check_candidates"]


@runtime_checkable
class Drafter(Protocol):
    """A block drafter driven by :class:`~dartree.decode.SpeculativeDecoder`: ``reset()`` at a new request,
    ``append_context(hidden_states [b, m, len(target_layer_ids) * H] or None, tokens int64 [b, m])`` with what
    the target committed, ``draft(root int64 [b])`` -> a DraftBlock with logits ``[b, gamma, V]``."""

    target_layer_ids: tuple[int, ...]

    def reset(self) -> None: ...

    def append_context(self, hidden_states: Tensor | None, tokens: Tensor) -> None: ...

    def draft(self, root: Tensor) -> DraftBlock: ...


@runtime_checkable
class BatchDrafter(Protocol):
    """A drafter of several rows at once (:mod:`dartree.batch_drafters` wraps a :class:`Drafter` as one):
    ``start`` a batch, ``append_rows`` each row's ``counts`` new tokens, ``draft_rows`` one block for every row,
    ``keep_rows`` the rows still decoding, ``add_rows`` new requests."""

    target_layer_ids: tuple[int, ...]

    def start(self, batch_size: int) -> None: ...

    def append_rows(self, hidden_states: Tensor | None, tokens: Tensor, counts: list[int]) -> None: ...

    def draft_rows(self, roots: Tensor) -> DraftBlock: ...

    def keep_rows(self, rows: list[int]) -> None: ...

    def add_rows(self, hidden_states: Tensor | None, tokens: Tensor, counts: list[int]) -> None: ...


@runtime_checkable
class CorrectionHead(Protocol):
    """Path-conditioned re-scoring of draft candidates (``depth`` 1-based): ``initial_state`` -> ``[b, S]``,
    ``logits`` -> ``[b, m, K]``, ``advance`` -> ``[b, m, S]``.  Shapes, the optional methods (found by
    :func:`head_method`: ``advance_logits``, ``vocab_logits``, ``prepare_block``) and what each must equal:
    docs/custom-head.md, "The head protocol".
    """

    def initial_state(self, block: DraftBlock) -> Tensor: ...

    def logits(self, block: DraftBlock, depth: int, states: Tensor, candidates: Tensor) -> Tensor: ...

    def advance(self, block: DraftBlock, depth: int, states: Tensor, tokens: Tensor) -> Tensor: ...


@runtime_checkable
class Sampler(Protocol):
    """Draws one token per row: ``sample(logits [..., V] already divided by the temperature, positions int64
    [...] of the tokens drawn) -> int64 [...]``."""

    def sample(self, logits: Tensor, positions: Tensor) -> Tensor: ...


#: what :class:`Drafter` asks for, checked by :func:`check_drafter`
DRAFTER_MEMBERS = ("reset", "append_context", "draft", "target_layer_ids")
#: what :class:`BatchDrafter` asks for (its row methods), read by :func:`is_batch_drafter`
BATCH_DRAFTER_MEMBERS = ("start", "append_rows", "draft_rows", "keep_rows", "target_layer_ids")
#: the optional methods of a :class:`CorrectionHead` (its docstring says what each must equal)
OPTIONAL_HEAD_METHODS = ("advance_logits", "vocab_logits", "prepare_block")


#: the methods every :class:`CorrectionHead` must have, checked by :func:`check_head`
HEAD_METHODS = ("initial_state", "logits", "advance")


def check_head(head: Any) -> None:
    """Raise ``ValueError`` naming the methods ``head`` lacks (see :class:`CorrectionHead`)."""
    missing = [m for m in HEAD_METHODS if not callable(getattr(head, m, None))]
    if missing:
        raise ValueError(f"head: {type(head).__name__} is missing {missing}; a correction head needs "
                         f"initial_state(block), logits(block, depth, states, candidates) and "
                         f"advance(block, depth, states, tokens) (dartree.protocols.CorrectionHead)")
    for optional in OPTIONAL_HEAD_METHODS:
        method = getattr(head, optional, None)
        if method is not None and not callable(method):
            raise ValueError(f"head: {type(head).__name__}.{optional} is not callable")


def check_drafter(drafter: Any) -> None:
    """``ValueError`` naming the first member of :class:`Drafter` that ``drafter`` lacks."""
    for member in DRAFTER_MEMBERS:
        if not hasattr(drafter, member):
            raise ValueError(f"drafter: missing {member!r}; a drafter needs target_layer_ids, reset(), "
                             f"append_context(hidden_states, tokens) and draft(root) (dartree.protocols.Drafter)")


def is_batch_drafter(drafter: Any) -> bool:
    """Whether ``drafter`` drafts rows of a batch itself (has every member of :class:`BatchDrafter`)."""
    return all(hasattr(drafter, member) for member in BATCH_DRAFTER_MEMBERS)


def check_sampler(sampler: Any) -> None:
    """``ValueError`` unless ``sampler`` has :class:`Sampler`'s ``sample(logits, positions)``."""
    if not callable(getattr(sampler, "sample", None)):
        raise ValueError(f"sampler: expected an object with sample(logits, positions) (dartree.protocols.Sampler), "
                         f"got {type(sampler).__name__}")


def head_method(head: Any, method: str) -> Any:
    """The optional :class:`CorrectionHead` method ``method`` of ``head`` (one of
    :data:`OPTIONAL_HEAD_METHODS`), or ``None`` when the head does not have it."""
    if method not in OPTIONAL_HEAD_METHODS:
        raise ValueError(f"method: expected one of {OPTIONAL_HEAD_METHODS}, got {method!r}")
    return getattr(head, method, None)


# ---------------------------------------------------------------- a head call's arguments (any head may use them)
def check_depth(depth: int, last: int, fused: bool = False) -> None:
    """A head call's ``depth``: an int in ``[1, last]`` (``fused``: ``advance_logits``, which scores ``depth + 1``)."""
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= last:
        note = " (advance_logits scores depth + 1)" if fused else ""
        raise ValueError(f"depth: expected an int in [1, {last}]{note}, got {depth!r}")


def check_states(block: DraftBlock, states: Tensor, width: int) -> None:
    """A head call's ``states``: ``[b, m, width]`` for ``block``'s batch ``b``."""
    if not isinstance(states, Tensor) or states.dim() != 3 or states.shape[0] != block.batch_size \
            or states.shape[2] != width:
        got = tuple(states.shape) if isinstance(states, Tensor) else type(states).__name__
        raise ValueError(f"states: expected [{block.batch_size}, m, {width}], got {got}")


def check_tokens(block: DraftBlock, tokens: Tensor, name: str, m: int | None = None) -> None:
    """A head call's int64 ``[b, m]`` argument ``name`` (``tokens`` or ``candidates``)."""
    ok = isinstance(tokens, Tensor) and tokens.dtype == torch.int64 and tokens.dim() == 2 \
        and tokens.shape[0] == block.batch_size and (m is None or tokens.shape[1] == m)
    if not ok:
        got = f"{tokens.dtype} {tuple(tokens.shape)}" if isinstance(tokens, Tensor) else type(tokens).__name__
        want = f"[{block.batch_size}, {'m' if m is None else m}]"
        raise ValueError(f"{name}: expected an int64 tensor {want}, got {got}")


def check_candidates(block: DraftBlock, candidates: Tensor) -> None:
    """``prepare_block``'s candidates: int64 ``[b, gamma, K]`` on ``block``'s device."""
    ok = isinstance(candidates, Tensor) and candidates.dtype == torch.int64 and candidates.dim() == 3 \
        and candidates.shape[:2] == (block.batch_size, block.gamma) and candidates.device == block.device
    if not ok:
        got = f"{candidates.dtype} {tuple(candidates.shape)}" if isinstance(candidates, Tensor) \
            else type(candidates).__name__
        raise ValueError(f"candidates: expected an int64 tensor [{block.batch_size}, {block.gamma}, K] on "
                         f"{block.device}, got {got}")
