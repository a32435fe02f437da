"""Correction heads: GRU (Domino) and Markov (DSpark), for many branches at once.

Both implement :class:`dartree.block.CorrectionHead`.  Inside a builder they only ever score the
``K`` candidate tokens of a depth: the base logits of the candidates are gathered from the block
(``block.logits`` is already the LM-head projection of ``H_d``) and the correction gathers only the
``K`` rows of its output projection, so no full-vocabulary product is computed per branch.

GRU head (Domino, arXiv 2605.29707)::

    state(root)       = GRU(emb(root), 0)
    state(.., t_d)    = GRU(emb(t_d), state(..))                      emb = the target's token embedding
    corrected_d(v)    = L_d(v) + fc2_v . silu(fc1([H_d; state]))     at depths d > prefix_len
    corrected_d(v)    = L_d(v)                                        at depths d <= prefix_len (default 1)

The state at depth d has read the root and the branch's tokens at depths 1..d-1.  Weight names
follow the released Domino checkpoints: ``prefix_gru.{weight,bias}_{ih,hh}_l0``,
``embed_proj.0`` (fc1, ``[emb_dim, H + G]``) and ``embed_proj.2`` (fc2, ``[V, emb_dim]``).

Markov head (DSpark "vanilla", arXiv 2607.05147)::

    corrected_d(v) = L_d(v) + markov_w2[v] . markov_w1[t_{d-1}]       t_0 = root

with ``markov_w1: [V, r]`` and ``markov_w2: [V, r]`` (``markov_head.markov_w{1,2}.weight``).
Its state is the previous token, stored as float32 ``[.., 1]`` (exact for ids below 2**24).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dartree.block import DraftBlock

__all__ = ["GRUHead", "MarkovHead"]


def _check_depth(block: DraftBlock, depth: int) -> None:
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= block.gamma:
        raise ValueError(f"depth: expected an int in [1, {block.gamma}], got {depth!r}")


def _check_states(block: DraftBlock, states: Tensor, width: int) -> None:
    if not isinstance(states, Tensor) or states.dim() != 3 or states.shape[0] != block.batch_size \
            or states.shape[2] != width:
        got = tuple(states.shape) if isinstance(states, Tensor) else type(states).__name__
        raise ValueError(f"states: expected [{block.batch_size}, m, {width}], got {got}")


def _check_tokens(block: DraftBlock, tokens: Tensor, name: str, m: int | None = None) -> None:
    ok = isinstance(tokens, Tensor) and tokens.dtype == torch.int64 and tokens.dim() == 2 \
        and tokens.shape[0] == block.batch_size and (m is None or tokens.shape[1] == m)
    if not ok:
        got = f"{tokens.dtype} {tuple(tokens.shape)}" if isinstance(tokens, Tensor) else type(tokens).__name__
        want = f"[{block.batch_size}, {'m' if m is None else m}]"
        raise ValueError(f"{name}: expected an int64 tensor {want}, got {got}")


def _base_candidates(block: DraftBlock, depth: int, candidates: Tensor) -> Tensor:
    """float32 ``[b, K]``: base logits of ``candidates`` at ``depth``."""
    return torch.gather(block.logits[:, depth - 1].float(), 1, candidates)


class GRUHead(nn.Module):
    """Domino correction head: a GRU over the branch's target embeddings + a low-rank residual.

    Args:
        hidden_size: the drafter's (= target's) hidden size ``H``.
        vocab_size: ``V``.
        gru_hidden_dim: GRU state width ``G``.
        emb_dim: bottleneck width of the correction MLP.
        prefix_len: depths ``<= prefix_len`` are not corrected (Domino's ``pure_draft_prefix_len``).
        embedding: the target's token-embedding matrix ``[V, H]`` (or call :meth:`bind`).

    State: float ``[.., G]``.
    """

    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        gru_hidden_dim: int,
        emb_dim: int,
        prefix_len: int = 1,
        embedding: Tensor | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("hidden_size", hidden_size), ("vocab_size", vocab_size),
                            ("gru_hidden_dim", gru_hidden_dim), ("emb_dim", emb_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if isinstance(prefix_len, bool) or not isinstance(prefix_len, int) or prefix_len < 0:
            raise ValueError(f"prefix_len: expected an int >= 0, got {prefix_len!r}")
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.gru_hidden_dim, self.emb_dim, self.prefix_len = gru_hidden_dim, emb_dim, prefix_len
        self.prefix_gru = nn.GRU(hidden_size, gru_hidden_dim, num_layers=1, batch_first=True)
        self.embed_proj = nn.Sequential(
            nn.Linear(hidden_size + gru_hidden_dim, emb_dim), nn.SiLU(), nn.Linear(emb_dim, vocab_size)
        )
        self._embedding: Tensor | None = None
        if embedding is not None:
            self.set_embedding(embedding)

    # ------------------------------------------------------------------------------ wiring
    def bind(self, target: nn.Module) -> GRUHead:
        """Read token embeddings from ``target``'s input embedding (shared, not copied)."""
        self.set_embedding(target.get_input_embeddings().weight)
        return self

    def set_embedding(self, embedding: Tensor) -> None:
        shape = (self.vocab_size, self.hidden_size)
        if not isinstance(embedding, Tensor) or tuple(embedding.shape) != shape:
            got = tuple(embedding.shape) if isinstance(embedding, Tensor) else type(embedding).__name__
            raise ValueError(f"embedding: expected shape {shape}, got {got}")
        object.__setattr__(self, "_embedding", embedding)  # the target's parameter: not registered here

    @property
    def embedding_weight(self) -> Tensor:
        if self._embedding is None:
            raise ValueError("embedding: the GRU head is not bound to a target; call head.bind(target_model)")
        return self._embedding

    # ---------------------------------------------------------------------------- the math
    def gru_step(self, tokens: Tensor, states: Tensor) -> Tensor:
        """One GRU step on the embeddings of ``tokens``.

        Shape:
            tokens: int64 ``[...]``; states: ``[..., G]`` -> ``[..., G]``.
        """
        x = F.embedding(tokens, self.embedding_weight).to(states.dtype)
        flat_x, flat_h = x.reshape(-1, x.shape[-1]), states.reshape(-1, states.shape[-1])
        g = self.prefix_gru
        h = torch._VF.gru_cell(flat_x, flat_h, g.weight_ih_l0, g.weight_hh_l0, g.bias_ih_l0, g.bias_hh_l0)
        return h.view(states.shape)

    def correction_hidden(self, hidden: Tensor, states: Tensor) -> Tensor:
        """``silu(fc1([H_d; state]))``.

        Shape:
            hidden: ``[b, H]`` or broadcastable ``[b, 1, H]``; states ``[b, m, G]`` -> ``[b, m, emb_dim]``.
        """
        fc1 = self.embed_proj[0]
        w_h, w_s = fc1.weight[:, : self.hidden_size], fc1.weight[:, self.hidden_size :]
        if hidden.dim() == 2:
            hidden = hidden[:, None, :]
        return F.silu(F.linear(hidden.to(w_h.dtype), w_h, fc1.bias) + F.linear(states, w_s))

    def full_logits(self, base: Tensor, hidden: Tensor, states: Tensor) -> Tensor:
        """Corrected logits over the whole vocabulary (training and tests; builders use :meth:`logits`).

        Shape:
            base ``[..., V]``, hidden ``[..., H]``, states ``[..., G]`` -> ``[..., V]``.
        """
        fc1, fc2 = self.embed_proj[0], self.embed_proj[2]
        mid = F.silu(fc1(torch.cat([hidden.to(states.dtype), states], dim=-1)))
        return base + fc2(mid)

    # ------------------------------------------------------------------------- protocol
    def initial_state(self, block: DraftBlock) -> Tensor:
        """State after reading the root.  Shape: ``[b, G]``."""
        h0 = torch.zeros(block.batch_size, self.gru_hidden_dim, device=block.device,
                         dtype=self.prefix_gru.weight_hh_l0.dtype)
        return self.gru_step(block.root, h0)

    def logits(self, block: DraftBlock, depth: int, states: Tensor, candidates: Tensor) -> Tensor:
        """Corrected logits of the K candidates on each of m branches.

        Shape:
            states ``[b, m, G]``, candidates int64 ``[b, K]`` -> float32 ``[b, m, K]``.
        """
        _check_depth(block, depth)
        _check_states(block, states, self.gru_hidden_dim)
        _check_tokens(block, candidates, "candidates")
        if block.hidden is None:
            raise ValueError("block: the GRU head needs block.hidden (the drafter's H_d); got None")
        m = states.shape[1]
        base = _base_candidates(block, depth, candidates)[:, None, :].expand(-1, m, -1)
        if depth <= self.prefix_len:
            return base.contiguous()
        mid = self.correction_hidden(block.hidden[:, depth - 1], states)          # [b, m, E]
        fc2 = self.embed_proj[2]
        rows = fc2.weight[candidates]                                            # [b, K, E]
        bias = torch.einsum("bme,bke->bmk", mid, rows) + fc2.bias[candidates][:, None, :]
        return base + bias.float()

    def advance(self, block: DraftBlock, depth: int, states: Tensor, tokens: Tensor) -> Tensor:
        """States after appending ``tokens`` at ``depth``.  Shape: states ``[b, m, G]``, tokens ``[b, m]``."""
        _check_depth(block, depth)
        _check_states(block, states, self.gru_hidden_dim)
        _check_tokens(block, tokens, "tokens", states.shape[1])
        return self.gru_step(tokens, states)


class MarkovHead(nn.Module):
    """DSpark vanilla Markov head: a rank-r bigram bias ``markov_w2[v] . markov_w1[previous token]``.

    Args:
        vocab_size: ``V`` (below 2**24: the state stores the previous token id as float32).
        markov_rank: ``r``.

    State: float32 ``[.., 1]`` holding the previous token id.
    """

    def __init__(self, vocab_size: int, markov_rank: int) -> None:
        super().__init__()
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not 1 <= vocab_size < 2**24:
            raise ValueError(f"vocab_size: expected an int in [1, 2**24), got {vocab_size!r}")
        if isinstance(markov_rank, bool) or not isinstance(markov_rank, int) or markov_rank < 1:
            raise ValueError(f"markov_rank: expected an int >= 1, got {markov_rank!r}")
        self.vocab_size, self.markov_rank = vocab_size, markov_rank
        self.markov_w1 = nn.Embedding(vocab_size, markov_rank)
        self.markov_w2 = nn.Linear(markov_rank, vocab_size, bias=False)

    def bind(self, target: nn.Module) -> MarkovHead:
        """Nothing to share (the Markov head owns all its weights); kept for a uniform API."""
        return self

    def full_logits(self, base: Tensor, previous: Tensor) -> Tensor:
        """Corrected logits over the whole vocabulary.  Shape: base ``[..., V]``, previous int64 ``[...]``."""
        return base + self.markov_w2(self.markov_w1(previous))

    def initial_state(self, block: DraftBlock) -> Tensor:
        """The root as the previous token.  Shape: float32 ``[b, 1]``."""
        return block.root.to(torch.float32)[:, None]

    def logits(self, block: DraftBlock, depth: int, states: Tensor, candidates: Tensor) -> Tensor:
        """Shape: states ``[b, m, 1]``, candidates int64 ``[b, K]`` -> float32 ``[b, m, K]``."""
        _check_depth(block, depth)
        _check_states(block, states, 1)
        _check_tokens(block, candidates, "candidates")
        previous = states[..., 0].to(torch.int64)                               # [b, m]
        u = self.markov_w1.weight[previous]                                       # [b, m, r]
        rows = self.markov_w2.weight[candidates]                                  # [b, K, r]
        bias = torch.einsum("bmr,bkr->bmk", u, rows).float()
        return _base_candidates(block, depth, candidates)[:, None, :] + bias

    def advance(self, block: DraftBlock, depth: int, states: Tensor, tokens: Tensor) -> Tensor:
        """Shape: states ``[b, m, 1]``, tokens int64 ``[b, m]`` -> ``[b, m, 1]``."""
        _check_depth(block, depth)
        _check_states(block, states, 1)
        _check_tokens(block, tokens, "tokens", states.shape[1])
        return tokens.to(torch.float32)[..., None]
