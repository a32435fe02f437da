"""Cheap deterministic correction heads for tests and for users checking their own builders.

Both use only exact element-wise float32 arithmetic (small integers, divisions by powers of two),
so their outputs are bit-identical whether a builder calls them for one branch, for many branches,
or for many rows at once.  (Transcendentals are avoided on purpose: the CPU's vectorised ``cos``
takes a different code path, with different rounding, depending on the other lanes of its vector.)
"""

from __future__ import annotations

import torch
from torch import Tensor

from dartree.block import DraftBlock

__all__ = ["IdentityHead", "PathHashHead"]


def _base_candidate_logits(block: DraftBlock, depth: int, candidates: Tensor, m: int) -> Tensor:
    """float32 ``[b, m, K]``: the block's base logits of ``candidates`` at ``depth``."""
    base = torch.gather(block.logits[:, depth - 1].float(), 1, candidates)  # [b, K]
    return base[:, None, :].expand(-1, m, -1)


class IdentityHead:
    """Returns the base logits unchanged: corrected builders then equal their uncorrected twins.  State: float32
    ``[b, 1]`` of zeros.  Both test heads have the protocol's optional fused ``advance_logits``."""

    def initial_state(self, block: DraftBlock) -> Tensor:
        return torch.zeros(block.batch_size, 1, device=block.device)

    def logits(self, block: DraftBlock, depth: int, states: Tensor, candidates: Tensor) -> Tensor:
        return _base_candidate_logits(block, depth, candidates, states.shape[1])

    def advance(self, block: DraftBlock, depth: int, states: Tensor, tokens: Tensor) -> Tensor:
        return torch.zeros(*tokens.shape, 1, device=block.device)

    def advance_logits(self, block: DraftBlock, depth: int, states: Tensor, tokens: Tensor,
                       candidates: Tensor) -> tuple[Tensor, Tensor]:
        """The fused call of the protocol: ``advance`` at ``depth``, then ``logits`` at ``depth + 1``."""
        return (torch.zeros(*tokens.shape, 1, device=block.device),
                _base_candidate_logits(block, depth + 1, candidates, tokens.shape[1]))


class PathHashHead:
    """A head whose correction depends on every token of the branch (through a rolling hash).

    State: float32 ``[b, 2]`` = (rolling hash of the branch's tokens mod 1009, last token).
    Corrected logit of candidate c at depth d = base logit + strength * (((7h + 13c + 5d + 3 last) mod 17) - 8) / 8.
    Every intermediate is an integer below 2**24, so float32 holds it exactly.
    """

    def __init__(self, strength: float = 0.5) -> None:
        self.strength = float(strength)

    def initial_state(self, block: DraftBlock) -> Tensor:
        root = block.root.float()
        return torch.stack([torch.remainder(root, 1009.0), root], dim=-1)

    def logits(self, block: DraftBlock, depth: int, states: Tensor, candidates: Tensor) -> Tensor:
        m = states.shape[1]
        base = _base_candidate_logits(block, depth, candidates, m)
        h, last = states[..., 0:1], states[..., 1:2]  # [b, m, 1]
        mix = torch.remainder(7.0 * h + 13.0 * candidates[:, None, :].float() + 5.0 * depth + 3.0 * last, 17.0)
        return base + self.strength * ((mix - 8.0) / 8.0)

    def advance(self, block: DraftBlock, depth: int, states: Tensor, tokens: Tensor) -> Tensor:
        tok = tokens.float()
        h = torch.remainder(states[..., 0] * 31.0 + tok, 1009.0)
        return torch.stack([h, tok], dim=-1)

    def advance_logits(self, block: DraftBlock, depth: int, states: Tensor, tokens: Tensor,
                       candidates: Tensor) -> tuple[Tensor, Tensor]:
        """The fused call of the protocol: ``advance`` at ``depth``, then ``logits`` at ``depth + 1``, with
        the new state's two fields used directly (no stack and re-slice): the same float32 operations."""
        tok = tokens.float()[..., None]                                  # [b, m, 1]
        h = torch.remainder(states[..., 0:1] * 31.0 + tok, 1009.0)      # [b, m, 1]
        base = _base_candidate_logits(block, depth + 1, candidates, tokens.shape[1])
        mix = torch.remainder(7.0 * h + 13.0 * candidates[:, None, :].float() + 5.0 * (depth + 1) + 3.0 * tok, 17.0)
        return torch.cat([h, tok], dim=-1), base + self.strength * ((mix - 8.0) / 8.0)
