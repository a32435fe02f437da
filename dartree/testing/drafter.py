"""A synthetic drafter that proposes the target's own continuation, with controllable noise.

Use it to check a target, a builder or a head end to end the way our tests do: with no noise a
chain is always fully accepted; ``demote`` and ``drop`` make partial and zero acceptance happen.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers.cache_utils import DynamicCache

from dartree.arguments import check_int
from dartree.block import DraftBlock
from dartree.models.hf_compat import cache_kwargs
from dartree.verify.sampling import KeyedSampler

__all__ = ["OracleDrafter", "SharpDrafter"]

#: how far the true continuation's logit stands from the random ones
MARGIN = 4.0


class OracleDrafter:
    """Follows the :class:`dartree.decode.Drafter` protocol by running the target model itself.

    At each ``draft(root)`` it computes the target's continuation ``c_1..c_gamma`` of ``context + root``
    (greedy, or with a :class:`KeyedSampler` at ``temperature``: exactly what speculative sampling will draw) and
    ranks ``c_d`` at depth d first with probability ``1 - demote - drop``, second (after a random wrong token:
    a chain misses it, two candidates per depth still accept it) with probability ``demote``, and last with
    probability ``drop`` (no builder with ``topk < V`` proposes it).  Other tokens get random logits, :data:`MARGIN`
    below, from a CPU generator re-seeded by ``reset``.  Batch 1 only.  ``target_layer_ids``: layers whose hidden
    states it asks for, recorded in ``context_hidden`` for tests.
    """

    def __init__(
        self,
        model: nn.Module,
        gamma: int,
        *,
        demote: float = 0.0,
        drop: float = 0.0,
        seed: int = 0,
        temperature: float = 0.0,
        sampler: KeyedSampler | None = None,
        target_layer_ids: tuple[int, ...] = (),
    ) -> None:
        if not isinstance(model, nn.Module) or getattr(model, "config", None) is None:
            raise ValueError(f"model: expected a transformers causal LM, got {type(model).__name__}")
        check_int("gamma", gamma)
        for name, p in (("demote", demote), ("drop", drop)):
            if not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
                raise ValueError(f"{name}: expected a probability in [0, 1], got {p!r}")
        if demote + drop > 1.0:
            raise ValueError(f"drop: demote + drop must be <= 1, got {demote} + {drop}")
        if not isinstance(temperature, int | float) or not temperature >= 0:
            raise ValueError(f"temperature: expected a number >= 0, got {temperature!r}")
        if sampler is not None and not isinstance(sampler, KeyedSampler):
            raise ValueError("sampler: expected None or a KeyedSampler (a generator's draws cannot be foreseen)")
        self.model = model
        self.gamma = gamma
        self.demote, self.drop = float(demote), float(drop)
        self.seed = seed
        self.temperature = float(temperature)
        self.sampler = sampler if temperature > 0 else None
        self.target_layer_ids = tuple(target_layer_ids)
        self.vocab_size = int(model.config.get_text_config(decoder=True).vocab_size)
        self.device = next(model.parameters()).device
        self.context_hidden: list[Tensor | None] = []
        self.reset()

    def reset(self) -> None:
        """Forget the context and re-seed the noise."""
        self._cache = DynamicCache(config=self.model.config)
        self._context = torch.zeros(1, 0, dtype=torch.int64, device=self.device)
        self._fed = 0                      # context tokens already in the private cache
        self._noise = torch.Generator().manual_seed(self.seed)
        self.context_hidden = []

    @property
    def context(self) -> Tensor:
        """int64 ``[1, m]``: every token appended so far (= the target's cache contents)."""
        return self._context

    def append_context(self, hidden_states: Tensor | None, tokens: Tensor) -> None:
        if tokens.dim() != 2 or tokens.shape[0] != 1:
            raise ValueError(f"tokens: expected int64 [1, m], got {tuple(tokens.shape)}")
        self._context = torch.cat([self._context, tokens.to(self.device)], dim=1)
        self.context_hidden.append(hidden_states)

    def _pick(self, logits: Tensor, position: int) -> Tensor:
        if self.sampler is None:
            return logits.argmax(dim=-1)
        pos = torch.full((logits.shape[0],), position, dtype=torch.int64, device=logits.device)
        return self.sampler.sample(logits / self.temperature, pos)

    @torch.no_grad()
    def continuation(self, root: Tensor) -> Tensor:
        """int64 ``[1, gamma]``: the target's continuation of ``context + root``."""
        feed = torch.cat([self._context[:, self._fed:], root.to(self.device)[:, None]], dim=1)
        start = self._context.shape[1] + 1            # absolute position of c_1
        picks = []
        ids, offset = feed, self._fed
        for d in range(self.gamma):
            pos = torch.arange(offset, offset + ids.shape[1], device=self.device)[None]
            logits = self.model(input_ids=ids, position_ids=pos, use_cache=True,
                                **cache_kwargs(self.model.forward, self._cache)).logits[:, -1]
            offset += ids.shape[1]
            nxt = self._pick(logits.float(), start + d)
            picks.append(nxt)
            ids = nxt[:, None]
        # Keep only the context in the private cache: drop root and c_1..c_{gamma-1}.
        self._cache.crop(-self.gamma)
        self._fed = self._context.shape[1]
        return torch.stack(picks, dim=1)

    def draft(self, root: Tensor) -> DraftBlock:
        """The block for ``root`` (int64 ``[1]``): noisy logits ranking the true continuation."""
        if not isinstance(root, Tensor) or root.shape != (1,):
            raise ValueError("root: expected an int64 tensor of shape [1] (batch 1 only)")
        truth = self.continuation(root)[0].cpu()                                  # [gamma]
        g, v = self.gamma, self.vocab_size
        logits = torch.randn(g, v, generator=self._noise)
        u = torch.rand(g, generator=self._noise)
        wrong = (truth + 1 + torch.randint(0, max(1, v - 1), (g,), generator=self._noise)) % v
        top = logits.max(dim=1).values
        rows = torch.arange(g)
        demoted = (u >= self.drop) & (u < self.drop + self.demote)
        dropped = u < self.drop
        logits[rows, truth] = top + 2 * MARGIN
        logits[rows[demoted], wrong[demoted]] = top[demoted] + 3 * MARGIN
        logits[rows[dropped], truth[dropped]] = logits.min(dim=1).values[dropped] - MARGIN
        return DraftBlock(logits=logits[None].to(self.device), root=root.to(self.device))


class SharpDrafter:
    """A drafter for law tests: at depth ``d``, the target's own next-token logits along its greedy continuation
    of ``context + root``, times ``sharpness``: an overconfident proposal, as trained drafters make, where a
    wrong acceptance rule shows most (tail tokens reach the output mostly through rejected drafts' residual).

    Batch-native (:mod:`dartree.batch_drafters`: ``gamma`` batched forwards over the left-padded contexts, no
    KV cache, each context's block kept) and a single-request drafter.  Deterministic.

    Args:
        model: the target's HF causal LM (fp32; short contexts: it recomputes them every round).
        gamma: block length, ``>= 1``.
        sharpness: the factor on the target's logits (``> 1``: sharper than the target).
    """

    target_layer_ids: tuple[int, ...] = ()

    def __init__(self, model: nn.Module, gamma: int, sharpness: float = 2.0) -> None:
        check_int("gamma", gamma)
        if not isinstance(sharpness, int | float) or not sharpness > 0:
            raise ValueError(f"sharpness: expected a number > 0, got {sharpness!r}")
        self.model, self.gamma, self.sharpness = model, gamma, float(sharpness)
        self.device = next(model.parameters()).device
        self.contexts: list[list[int]] = []
        self._memo: dict[tuple[int, ...], Tensor] = {}

    # the single-request protocol (dartree.decode)
    def reset(self) -> None:
        self.start(1)

    def append_context(self, hidden_states: Tensor | None, tokens: Tensor) -> None:
        self.append_rows(hidden_states, tokens, [tokens.shape[1]])

    def draft(self, root: Tensor) -> DraftBlock:
        return self.draft_rows(root)

    # the batch protocol (dartree.batch_drafters)
    def start(self, batch_size: int) -> None:
        self.contexts = [[] for _ in range(batch_size)]

    def append_rows(self, hidden_states: Tensor | None, tokens: Tensor, counts: list[int]) -> None:
        host = tokens.tolist()
        for r, c in enumerate(counts):
            self.contexts[r] += host[r][:c]

    def add_rows(self, hidden_states: Tensor | None, tokens: Tensor, counts: list[int]) -> None:
        host = tokens.tolist()
        self.contexts += [host[r][:c] for r, c in enumerate(counts)]

    def keep_rows(self, rows: list[int]) -> None:
        self.contexts = [self.contexts[r] for r in rows]

    @torch.no_grad()
    def draft_rows(self, roots: Tensor) -> DraftBlock:
        seqs = [tuple(c) + (r,) for c, r in zip(self.contexts, roots.tolist(), strict=True)]
        missing = list(dict.fromkeys(s for s in seqs if s not in self._memo))
        if missing:
            self._memo.update(zip(missing, self._blocks([list(s) for s in missing]), strict=True))
        return DraftBlock(logits=torch.stack([self._memo[s] for s in seqs]), root=roots)

    def _blocks(self, seqs: list[list[int]]) -> Tensor:
        """``[len(seqs), gamma, V]``: the blocks of contexts not drafted before (the drafter is a function of its
        context: blocks are kept per context, so that many decodes of a few prompts run no forward twice)."""
        logits = []
        for _ in range(self.gamma):
            width = max(len(s) for s in seqs)
            ids = torch.tensor([[0] * (width - len(s)) + s for s in seqs], device=self.device)
            mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], device=self.device)
            out = self.model(input_ids=ids, attention_mask=mask,
                             position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits[:, -1].float()
            logits.append(out * self.sharpness)
            seqs = [s + [t] for s, t in zip(seqs, out.argmax(-1).tolist(), strict=True)]
        return torch.stack(logits, dim=1)
