"""Correction heads: GRU (Domino) and Markov (DSpark), for many branches at once.

Both implement :class:`dartree.protocols.CorrectionHead` (and its optional ``advance_logits`` and ``prepare_block``)
and score only the ``K`` candidate tokens of a depth: the base logits gathered from the block, the correction from
the ``K`` rows of its output projection (no full-vocabulary product per branch).  Formulas, states, weight names and
the checkpoint fields they read: docs/checkpoints.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dartree.arguments import check_int
from dartree.block import DraftBlock
from dartree.models.drafter import RMSNorm
from dartree.models.kmajor import derived, exact_from, kmajor_copy, kmajor_product, linear, tensor_version
from dartree.protocols import check_candidates, check_depth, check_states, check_tokens
from dartree.timing import trusted_head

__all__ = ["GRUHead", "MarkovHead"]


def _check_hidden(block: DraftBlock) -> None:
    if block.hidden is None:
        raise ValueError("block: the GRU head needs block.hidden (the drafter's H_d); got None")


def _float(x: Tensor) -> Tensor:
    """``x.float()`` (perf: no dispatch when already float32; a sampled round's ops run from a cold cache)."""
    return x if x.dtype == torch.float32 else x.float()


def _candidate_base(block: DraftBlock, candidates: Tensor) -> Tensor:
    """float32 ``[b, gamma, K]``: base logits of every depth's ``candidates [b, gamma, K]``."""
    return torch.gather(_float(block.logits), 2, candidates)


def _base_candidates(block: DraftBlock, depth: int, candidates: Tensor) -> Tensor:
    """float32 ``[b, K]``: base logits of ``candidates`` at ``depth``."""
    return torch.gather(_float(block.logits[:, depth - 1]), 1, candidates)


#: perf: the GRU's input gates are read from a [V, 3G] table when it has at most this many entries
#: (64 MiB in float32); larger vocabularies compute them per step.
GATE_TABLE_LIMIT = 1 << 24


@trusted_head
class GRUHead(nn.Module):
    """Domino correction head: a GRU over the branch's target embeddings + a low-rank residual; state float
    ``[.., G]``.  The arguments are the checkpoint's fields (docs/checkpoints.md, "Config keys"): ``hidden_size``
    ``H``, ``vocab_size`` ``V``, ``gru_hidden_dim`` ``G``, ``emb_dim``, ``prefix_len`` (``pure_draft_prefix_len``),
    ``bias`` (GRU and ``embed_proj`` biases), ``bias_norm`` / ``bias_gate`` (``use_bias_norm`` / ``use_bias_gate``),
    ``norm_eps`` (``rms_norm_eps``); ``embedding``: the target's token embeddings ``[V, H]`` (or :meth:`bind`).
    """

    def __init__(self, hidden_size: int, vocab_size: int, gru_hidden_dim: int, emb_dim: int, prefix_len: int = 1,
                 embedding: Tensor | None = None, *, bias: bool = True, bias_norm: bool = False,
                 bias_gate: bool = False, norm_eps: float = 1e-6) -> None:
        super().__init__()
        for name, value in (("hidden_size", hidden_size), ("vocab_size", vocab_size),
                            ("gru_hidden_dim", gru_hidden_dim), ("emb_dim", emb_dim)):
            check_int(name, value)
        check_int("prefix_len", prefix_len, 0)
        for name, value in (("bias", bias), ("bias_norm", bias_norm), ("bias_gate", bias_gate)):
            if not isinstance(value, bool):
                raise ValueError(f"{name}: expected a bool, got {value!r}")
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.gru_hidden_dim, self.emb_dim, self.prefix_len = gru_hidden_dim, emb_dim, prefix_len
        self.bias = bias
        self.prefix_gru = nn.GRU(hidden_size, gru_hidden_dim, num_layers=1, batch_first=True, bias=bias)
        self.embed_proj = nn.Sequential(
            nn.Linear(hidden_size + gru_hidden_dim, emb_dim, bias=bias), nn.SiLU(),
            nn.Linear(emb_dim, vocab_size, bias=bias),
        )
        self.bias_norm = RMSNorm(gru_hidden_dim, norm_eps) if bias_norm else None
        self.bias_gate = nn.Sequential(
            nn.Linear(hidden_size, emb_dim, bias=False), nn.SiLU(), nn.Linear(emb_dim, 1, bias=True)
        ) if bias_gate else None
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
        flat_h = states.reshape(-1, states.shape[-1])
        # the gate table and W_hh^T (or its K-major copy) from the weights' plan, unless autograd tracks the step
        plan = None if torch.is_grad_enabled() and states.requires_grad else self._plan()
        if plan is not None and plan.table.dtype == states.dtype:
            return self._cell(tokens.reshape(-1), flat_h, plan.table, plan.w_hh(flat_h.shape[0]), plan.b_hh,
                              self._step_buffers(flat_h.shape[0], plan.table)).view(states.shape)
        g = self.prefix_gru
        x = F.embedding(tokens, self.embedding_weight).to(states.dtype)
        h = torch._VF.gru_cell(x.reshape(-1, x.shape[-1]), flat_h, g.weight_ih_l0, g.weight_hh_l0,
                               g.bias_ih_l0 if self.bias else None, g.bias_hh_l0 if self.bias else None)
        return h.view(states.shape)

    @staticmethod
    def _cell(tokens: Tensor, flat_h: Tensor, table: Tensor, w_hh_t: Tensor, b_hh: Tensor | None,
              buffers: tuple[Tensor, ...]) -> Tensor:
        """The GRU cell on ``flat_h [N, G]`` for ``tokens [N]`` from the gate table, ``W_hh^T`` (for one
        state, ``W_hh`` itself: :meth:`_Plan.w_hh`) and ``b_hh``.

        perf: the input gates of every token precomputed (one row per token), read into a reused
        buffer; then exactly torch's GRU cell (aten/src/ATen/native/RNN.cpp, GRUCell) with r and z
        in one op, every intermediate in place in the buffers, one fresh tensor for the result.
        """
        gi, gh, gi_rz, gi_n, gh_rz, gh_n, r, z, gh_1 = buffers
        torch.index_select(table, 0, tokens, out=gi)                                # [N, 3G]
        if flat_h.shape[0] == 1:    # perf: a matrix-vector product (tested: F.linear's bits)
            h = flat_h.reshape(-1)
            torch.mv(w_hh_t, h, out=gh_1) if b_hh is None else torch.addmv(b_hh, w_hh_t, h, out=gh_1)
        elif b_hh is not None:
            torch.addmm(b_hh, flat_h, w_hh_t, out=gh)                               # = F.linear(h, W_hh, b_hh)
        else:
            torch.mm(flat_h, w_hh_t, out=gh)
        gh_rz.add_(gi_rz).sigmoid_()                                                # r, z
        new = gh_n.mul_(r).add_(gi_n).tanh_()                                       # n = tanh(gi_n + r * gh_n)
        return torch.sub(flat_h, new).mul_(z).add_(new)                             # n + z * (h - n)

    def _step_buffers(self, rows: int, table: Tensor) -> tuple[Tensor, ...]:
        """perf: the GRU step's intermediates ``gi, gh [rows, 3G]``, their gate views and ``gh`` flat, allocated once
        per row count (and dtype, device) and reused: never returned to a caller, so reusing them
        cannot alias a state the caller keeps.  Not for concurrent calls on one head from two threads."""
        # inference mode in the key: buffers made in a decode (inference tensors) cannot be written outside it
        key = (rows, table.dtype, table.device, torch.is_inference_mode_enabled())
        buffers = self.__dict__.setdefault("_step_buffer_cache", {})
        found = buffers.get(key)
        if found is None:
            if len(buffers) >= 64:
                buffers.clear()
            size = self.gru_hidden_dim
            gi = torch.empty(rows, 3 * size, dtype=table.dtype, device=table.device)
            gh = torch.empty_like(gi)
            found = (gi, gh, gi[:, : 2 * size], gi[:, 2 * size :], gh[:, : 2 * size], gh[:, 2 * size :],
                     gh[:, :size], gh[:, size : 2 * size], gh.view(-1))
            buffers[key] = found
        return found

    def _gate_table(self, dtype: torch.dtype) -> Tensor | None:
        """``emb @ W_ih^T + b_ih`` ``[V, 3G]`` (the GRU's input gates of every token), or ``None`` when
        it would exceed :data:`GATE_TABLE_LIMIT` entries or the states are not in the weights' dtype."""
        g, emb = self.prefix_gru, self.embedding_weight
        if self.vocab_size * 3 * self.gru_hidden_dim > GATE_TABLE_LIMIT or g.weight_ih_l0.dtype != dtype \
                or g.weight_ih_l0.requires_grad and torch.is_grad_enabled():
            return None
        bias = g.bias_ih_l0 if self.bias else None
        return derived(self, "_gate_table_cache", [emb, g.weight_ih_l0, bias],
                       lambda: F.linear(emb.to(dtype), g.weight_ih_l0, bias))

    def _normed(self, states: Tensor) -> Tensor:
        return states if self.bias_norm is None else self.bias_norm(states)

    def _gate(self, hidden: Tensor) -> Tensor | None:
        """``sigmoid(bias_gate(hidden))`` ``[..., 1]``, or ``None`` without a gate."""
        return None if self.bias_gate is None else torch.sigmoid(self.bias_gate(hidden))

    def full_logits(self, base: Tensor, hidden: Tensor, states: Tensor) -> Tensor:
        """Corrected logits over the whole vocabulary (training and tests; builders use :meth:`logits`).

        Shape:
            base ``[..., V]``, hidden ``[..., H]``, states ``[..., G]`` -> ``[..., V]``.
        """
        hidden = hidden.to(states.dtype)
        correction = self.embed_proj(torch.cat([hidden, self._normed(states)], dim=-1))
        gate = self._gate(hidden)
        return base + (correction if gate is None else gate * correction)

    def _block_terms(self, block: DraftBlock, plan: _Plan | None = None) -> tuple[Tensor, Tensor | None]:
        """``fc1``'s hidden half ``[b, gamma, E]`` and the gate ``[b, gamma, 1]`` (or ``None``) of every depth.

        They depend only on the block, not on the branch: one product per batch row over all its depths
        (``[gamma, H]``, so a row's bits do not depend on the batch it is in, and a sub-block
        ``block.rows(...)`` gets the same values), cached while the same ``block.hidden`` and weights
        (same objects, storage and versions) ask again (:func:`derived`); recomputed, uncached, when
        autograd tracks the weights or from ``plan``'s views of them (:meth:`prepare_block`, once per build).
        """
        hidden = block.hidden

        def build(w_h: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor | None]:
            if hidden.shape[0] == 1:    # perf: the one row's product, without unbind and stack (same bits)
                h = hidden[0] if hidden.dtype == w_h.dtype else hidden[0].to(w_h.dtype)
                return F.linear(h, w_h, bias)[None], None if self.bias_gate is None else self._gate(h)[None]
            rows = [h.to(w_h.dtype) for h in hidden.unbind(0)]                     # [gamma, H] each
            part = torch.stack([F.linear(h, w_h, bias) for h in rows])           # [b, gamma, E]
            gate = None if self.bias_gate is None else torch.stack([self._gate(h) for h in rows])  # [b, gamma, 1]
            return part, gate

        if plan is not None:
            return build(plan.fc1_h, plan.fc1_b)
        fc1 = self.embed_proj[0]
        sources = [hidden, fc1.weight, fc1.bias]
        if self.bias_gate is not None:
            sources += list(self.bias_gate.parameters())
        if torch.is_grad_enabled() and any(w is not None and w.requires_grad for w in sources):
            return build(fc1.weight[:, : self.hidden_size], fc1.bias)
        return derived(self, "_block_terms_cache", sources, lambda: build(fc1.weight[:, : self.hidden_size], fc1.bias))

    # ------------------------------------------------------------------------- protocol
    def initial_state(self, block: DraftBlock) -> Tensor:
        """State after reading the root.  Shape: ``[b, G]``.

        perf: on the CPU a one-row block's root state is kept per root token with the weights' plan
        (:meth:`_plan`: dropped when a weight changes) and returned as a copy: the same bits, as the
        same one-row step computed it.
        """
        plan = self._plan() if block.batch_size == 1 and block.device.type == "cpu" else None
        if plan is None:
            return self._root_state(block)
        key = (int(block.root[0]), torch.is_inference_mode_enabled())
        state = plan.roots.get(key)
        if state is None:
            if len(plan.roots) >= ROOT_CACHE_LIMIT:
                plan.roots.clear()
            state = plan.roots[key] = self._root_state(block)
        return state.clone()

    def _root_state(self, block: DraftBlock) -> Tensor:
        h0 = torch.zeros(block.batch_size, self.gru_hidden_dim, device=block.device,
                         dtype=self.prefix_gru.weight_hh_l0.dtype)
        return self.gru_step(block.root, h0)

    def _plan(self) -> _Plan | None:
        """perf: what a build reads from the weights (gate table, projection tables, ``W_hh^T``, K-major
        copies) resolved once per weight version (one :func:`derived` lookup instead of one each);
        ``None`` where autograd tracks the weights or the gate table does not apply."""
        if torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()):
            return None
        # perf: the parameter dicts read directly (nn.Module.__getattr__ per name is a visible share of a build)
        g = self._modules["prefix_gru"]._parameters
        proj = self._modules["embed_proj"]._modules
        fc1, fc2 = proj["0"]._parameters, proj["2"]._parameters
        biases = [g["bias_ih_l0"], g["bias_hh_l0"], fc1["bias"], fc2["bias"]] if self.bias else []
        sources = [self.embedding_weight, g["weight_ih_l0"], g["weight_hh_l0"], fc1["weight"], fc2["weight"], *biases]
        return derived(self, "_plan_cache", sources, lambda: _Plan.of(self))

    def _logits(self, block: DraftBlock, depth: int, states: Tensor, candidates: Tensor) -> Tensor:
        base = _base_candidates(block, depth, candidates)[:, None, :]            # [b, 1, K]
        if depth <= self.prefix_len:
            return base.expand(-1, states.shape[1], -1).contiguous()
        part, gate = self._block_terms(block)
        part, gate = part[:, depth - 1, None], None if gate is None else gate[:, depth - 1, None]
        w_s, table = self._projection_tables()
        size = self.emb_dim
        rows = F.embedding(candidates, table)                                    # [b, K, E (+ 1)]
        return self._corrected(self._normed(states), w_s, None, part, gate, rows[..., :size].mT,
                               rows[:, None, :, size] if self.bias else None, base)

    @staticmethod
    def _corrected(normed: Tensor, w_s: Tensor, w_s_t: Tensor | None, part: Tensor, gate: Tensor | None,
                   rows_t: Tensor, bias: Tensor | None, base: Tensor) -> Tensor:
        """``base + gate * (fc2 rows . silu(fc1 [hidden; state]) + bias)``: the correction of the K candidates,
        fc1's state half from ``w_s [E, G]`` (``w_s_t``: ``W_s^T`` or its K-major copy, to multiply by; ``None``:
        :func:`linear` picks), its hidden half ``part``.

        Shape:
            normed ``[b, m, G]`` (the states, normed), part ``[b, 1, E]``, gate ``[b, 1, 1]`` or None,
            rows_t ``[b, E, K]``, bias and base ``[b, 1, K]`` -> float32 ``[b, m, K]``.
        """
        if normed.numel() == normed.shape[-1] and not (torch.is_grad_enabled() and (
                normed.requires_grad or w_s.requires_grad)):   # perf: one state, one addmv (tested: the same bits)
            mid = torch.addmv(part.reshape(-1), w_s, normed.reshape(-1)).view(1, 1, -1)
        else:
            mid = (linear(normed, w_s) if w_s_t is None else normed @ w_s_t).add_(part)
        # perf: silu in place, the bias added by baddbmm (tested: the bits of bmm, then + bias)
        mid = F.silu(mid) if mid.requires_grad else torch._C._nn.silu_(mid)
        correction = torch.bmm(mid, rows_t) if bias is None else torch.baddbmm(bias, mid, rows_t)  # [b, m, K]
        if gate is not None:
            correction = gate * correction      # not in place: autograd may need the product
        return _float(correction).add_(base)     # = base + correction (fp addition commutes bit for bit)

    def _projection_tables(self) -> tuple[Tensor, Tensor]:
        """perf: fc1's state half as a contiguous ``[E, G]`` matrix and fc2's rows ``[V, E]`` (with the
        bias as a last column when biased, so one embedding gathers both).  Cached (:func:`derived`)
        unless autograd would need them (then rebuilt per call, differentiable)."""
        fc1, fc2 = self.embed_proj[0], self.embed_proj[2]

        def build() -> tuple[Tensor, Tensor]:
            w_s = fc1.weight[:, self.hidden_size :].contiguous()
            return w_s, (torch.cat([fc2.weight, fc2.bias[:, None]], dim=1) if self.bias else fc2.weight)

        if torch.is_grad_enabled() and (fc1.weight.requires_grad or fc2.weight.requires_grad):
            return build()
        return derived(self, "_projection_cache", [fc1.weight, fc2.weight, fc2.bias if self.bias else None], build)

    def logits(self, block: DraftBlock, depth: int, states: Tensor, candidates: Tensor) -> Tensor:
        """Corrected logits of the K candidates on each of m branches.

        Shape:
            states ``[b, m, G]``, candidates int64 ``[b, K]`` -> float32 ``[b, m, K]``.
        """
        check_depth(depth, block.gamma)
        check_states(block, states, self.gru_hidden_dim)
        check_tokens(block, candidates, "candidates")
        _check_hidden(block)
        return self._logits(block, depth, states, candidates)

    def vocab_logits(self, block: DraftBlock, depth: int, states: Tensor) -> Tensor:
        """Corrected logits of every token on each of m branches: :meth:`logits` with the whole vocabulary as
        candidates (equal to float rounding), without gathering fc2's rows (the protocol's optional method,
        what sampled trees propose from: ``dartree.verify.rejection``).

        Shape:
            states ``[b, m, G]`` -> float32 ``[b, m, V]``.
        """
        check_depth(depth, block.gamma)
        check_states(block, states, self.gru_hidden_dim)
        _check_hidden(block)
        base = _float(block.logits.narrow(1, depth - 1, 1))                        # [b, 1, V]
        if depth <= self.prefix_len:
            return base.expand(-1, states.shape[1], -1).contiguous()
        plan = self._plan() if states.device.type == "cpu" and not torch.is_grad_enabled() else None
        if plan is not None and plan.fc2_t is not None and states.dtype == plan.w_s.dtype:
            return self._plan_vocab_logits(plan, block, depth, states, base)
        # this depth's fc1 term alone (not the block's every depth), and fc2 from its K-major copy on the CPU (the
        # plan's path gives the same bits); a proposal needs no bit-equality with ``logits``
        fc1, fc2 = self.embed_proj[0], self.embed_proj[2]
        h = block.hidden[:, depth - 1, None].to(fc1.weight.dtype)                # [b, 1, H]
        part = F.linear(h, fc1.weight[:, : self.hidden_size], fc1.bias)
        gate = self._gate(h)
        w_s, _ = self._projection_tables()
        mid = F.silu(linear(self._normed(states), w_s).add_(part))
        grad = torch.is_grad_enabled()
        correction = (kmajor_product if mid.device.type == "cpu" and not grad else F.linear)(mid, fc2.weight, fc2.bias)
        if gate is not None:
            correction = gate * correction
        return correction.float().add_(base)

    def _plan_vocab_logits(self, plan: _Plan, block: DraftBlock, depth: int, states: Tensor, base: Tensor) -> Tensor:
        """:meth:`vocab_logits` on the CPU without autograd, bit for bit the same ops, the weights' views and copies
        from the plan (perf: a sampled round makes several of these calls; the lookups were a large share of one),
        a depth's fc1 term kept for the block's later rounds (block reuse asks for the same depths again)."""
        hidden = block.hidden
        key = (hidden, hidden.data_ptr(), tensor_version(hidden))
        held = plan.parts
        if held.get("block") is None or held["block"][0] is not hidden or held["block"][1:] != key[1:]:
            held.clear()
            held["block"] = key                 # a strong reference: no other tensor can take its id meanwhile
        found = held.get(depth)
        if found is None:
            h = hidden.narrow(1, depth - 1, 1)                                       # [b, 1, H]
            h = h if h.dtype == plan.fc1_h.dtype else h.to(plan.fc1_h.dtype)
            found = (F.linear(h, plan.fc1_h, plan.fc1_b), self._gate(h))
            if self.bias_gate is None:          # a gate's weights are not the plan's: computed every call
                held[depth] = found
        part, gate = found
        normed = self._normed(states)                                        # fc1 state half: linear(normed, w_s)
        mid = F.silu((normed @ plan.w_s_t(normed.numel() // normed.shape[-1], normed.dtype)).add_(part), inplace=True)
        wt = plan.fc2_t                                                              # = kmajor_product(mid, fc2...)
        flat = mid.reshape(-1, wt.shape[0])
        correction = (flat @ wt if plan.fc2_b is None else torch.addmm(plan.fc2_b, flat, wt)).view(
            *mid.shape[:-1], wt.shape[1])
        if gate is not None:
            correction = gate * correction
        return _float(correction).add_(base)

    def advance(self, block: DraftBlock, depth: int, states: Tensor, tokens: Tensor) -> Tensor:
        """States after appending ``tokens`` at ``depth``.  Shape: states ``[b, m, G]``, tokens ``[b, m]``."""
        check_depth(depth, block.gamma)
        check_states(block, states, self.gru_hidden_dim)
        check_tokens(block, tokens, "tokens", states.shape[1])
        return self.gru_step(tokens, states)

    def advance_logits(self, block: DraftBlock, depth: int, states: Tensor, tokens: Tensor,
                       candidates: Tensor) -> tuple[Tensor, Tensor]:
        """``advance`` at ``depth`` then ``logits`` at ``depth + 1`` in one call (bit-identical to the two).

        Shape:
            states ``[b, m, G]``, tokens int64 ``[b, m]``, candidates int64 ``[b, K]``
            -> (states ``[b, m, G]``, float32 ``[b, m, K]``).
        """
        check_depth(depth, block.gamma - 1, True)
        check_states(block, states, self.gru_hidden_dim)
        check_tokens(block, tokens, "tokens", states.shape[1])
        check_tokens(block, candidates, "candidates")
        _check_hidden(block)
        new = self.gru_step(tokens, states)
        return new, self._logits(block, depth + 1, new, candidates)

    def prepare_block(self, block: DraftBlock, candidates: Tensor) -> _GRUSteps | None:
        """The protocol's optional per-build preparation (docs/custom-head.md): :class:`_GRUSteps`, or ``None`` (use
        the protocol calls) where autograd tracks the weights or the gate table does not apply.

        Shape: candidates int64 ``[b, gamma, K]`` (``C_d`` at ``[:, d - 1]``).
        """
        check_candidates(block, candidates)
        _check_hidden(block)
        plan = self._plan()
        return None if plan is None else _GRUSteps(self, block, candidates, plan)


def _kmajor_from(weight: Tensor, bias: bool) -> tuple[float, Tensor | None]:
    """(the row count from which ``weight``'s K-major copy gives ``F.linear``'s bits, the copy), or
    ``(inf, None)`` off the CPU or where no probed count does (:func:`dartree.models.kmajor.exact_from`)."""
    start = exact_from(weight.shape[1], weight.shape[0], weight.dtype, bias) if weight.device.type == "cpu" else None
    return (float("inf"), None) if start is None else (start, kmajor_copy(weight))


#: perf: root states a GRU head keeps per root token (at most; then the cache starts over)
ROOT_CACHE_LIMIT = 4096


class _Plan:
    """:meth:`GRUHead._plan`: the weight-derived tensors of a build, and the root states per token."""

    __slots__ = ("table", "w_s", "rows_table", "w_hh_1", "w_hh_t", "b_hh", "hh_from", "hh_copy", "s_from", "s_copy",
                 "w_s_1", "roots", "fc1_h", "fc1_b", "fc2_t", "fc2_b", "parts")

    @classmethod
    def of(cls, head: GRUHead) -> _Plan | None:
        w_hh = head.prefix_gru.weight_hh_l0
        table = head._gate_table(w_hh.dtype)
        if table is None:
            return None
        plan = cls()
        plan.table = table
        plan.w_s, plan.rows_table = head._projection_tables()
        plan.w_hh_1, plan.w_hh_t, plan.b_hh = w_hh, w_hh.t(), head.prefix_gru.bias_hh_l0 if head.bias else None
        # K-major copies and the row counts from which they give F.linear's bits (CPU only)
        plan.hh_from, plan.hh_copy = _kmajor_from(w_hh, head.bias)
        plan.s_from, plan.s_copy = _kmajor_from(plan.w_s, False)
        plan.w_s_1 = plan.w_s.t()
        plan.roots = {}
        # vocab_logits: fc1's hidden half (the view F.linear was given), fc2's K-major copy (CPU), the biases, and
        # the fc1 terms of the block last asked for, per depth
        fc1, fc2 = head.embed_proj[0], head.embed_proj[2]
        plan.fc1_h, plan.fc1_b = fc1.weight[:, : head.hidden_size], fc1.bias
        plan.fc2_t = kmajor_copy(fc2.weight) if fc2.weight.device.type == "cpu" else None
        plan.fc2_b = fc2.bias
        plan.parts = {}
        return plan

    def w_hh(self, rows: int) -> Tensor:
        """``W_hh^T`` for a step of ``rows`` states: its K-major copy where that gives ``F.linear``'s bits;
        for one state ``W_hh`` (:meth:`GRUHead._cell`: a matrix-vector product)."""
        return self.w_hh_1 if rows == 1 else self.hh_copy if rows >= self.hh_from else self.w_hh_t

    def w_s_t(self, rows: int, dtype: torch.dtype) -> Tensor:
        """fc1's state half transposed for ``rows`` states: its K-major copy where that gives ``F.linear``'s bits."""
        return self.s_copy if rows >= self.s_from and dtype == self.w_s.dtype else self.w_s_1


class _GRUSteps:
    """:meth:`GRUHead.prepare_block`'s result, for one build: ``logits`` / ``advance_logits`` without the block and
    the candidates, bit for bit the head's own calls (fp32; tested).  perf: the calls are dispatch-bound on the CPU,
    so what the depths share is made once (base logits, fc1's hidden half, fc2's candidate rows of every corrected
    depth, views per depth; per row count the buffers and weights); a depth runs 10 ops of GRU cell, 6 of correction."""

    def __init__(self, head: GRUHead, block: DraftBlock, candidates: Tensor, plan: _Plan) -> None:
        self.head, self.plan, self.table, self.b_hh, self.norm = head, plan, plan.table, plan.b_hh, head.bias_norm
        self.gamma, self.size, self.prefix = block.gamma, head.gru_hidden_dim, head.prefix_len
        self.base_all = _candidate_base(block, candidates)                       # [b, gamma, K]
        part, gate = head._block_terms(block, plan)                              # [b, gamma, E], [b, gamma, 1]
        base = self.base_all.unsqueeze(2).unbind(1)
        gates = (None,) * block.gamma if gate is None else gate.unsqueeze(2).unbind(1)
        # depth d's (base, part, gate, rows_t, bias): [b, 1, K], [b, 1, E], [b, 1, 1] or None, [b, E, K], [b, 1, K]
        self.terms: list[tuple | None] = [None] * block.gamma
        if self.prefix < block.gamma:
            rows = F.embedding(candidates[:, self.prefix :], plan.rows_table)    # [b, gamma - prefix, K, E (+ 1)]
            rows_t = rows[..., : head.emb_dim].transpose(2, 3).unbind(1)
            bias = rows[..., head.emb_dim].unsqueeze(2).unbind(1) if head.bias else (None,) * len(rows_t)
            for d, part_d in enumerate(part.unsqueeze(2).unbind(1)[self.prefix :], start=self.prefix):
                self.terms[d] = (base[d], part_d, gates[d], rows_t[d - self.prefix], bias[d - self.prefix])
        self.buffers: dict[int, tuple] = {}

    def _found(self, states: Tensor) -> tuple:
        """(the step's buffers, ``W_hh^T``, fc1's state half transposed) for ``states [b, m, G]``'s row count."""
        n = states.shape[0] * states.shape[1]
        found = self.buffers.get(n)
        if found is None:
            found = self.buffers[n] = (self.head._step_buffers(n, self.table), self.plan.w_hh(n),
                                       self.plan.w_s_t(n, states.dtype))
        return found

    def logits(self, depth: int, states: Tensor) -> Tensor:
        """``head.logits(block, depth, states, candidates[:, depth - 1])``."""
        check_depth(depth, self.gamma)
        return self._logits(depth, states, self._found(states))

    def advance_logits(self, depth: int, states: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """``head.advance_logits(block, depth, states, tokens, candidates[:, depth])``."""
        check_depth(depth, self.gamma - 1)
        found = self._found(states)
        b, m, size = states.shape           # perf: views from ints (a torch.Size argument parses slower)
        new = GRUHead._cell(tokens.reshape(-1), states.reshape(b * m, size), self.table, found[1], self.b_hh,
                            found[0]).view(b, m, size)
        return new, self._logits(depth + 1, new, found)

    def _logits(self, depth: int, states: Tensor, found: tuple) -> Tensor:
        """Corrected logits of ``C_depth`` after ``states [b, m, G]``, with ``found = self.buffers[b * m]``."""
        if depth <= self.prefix:
            return self.base_all[:, depth - 1 : depth].expand(-1, states.shape[1], -1).contiguous()
        base, part, gate, rows_t, bias = self.terms[depth - 1]
        return GRUHead._corrected(states if self.norm is None else self.norm(states), self.plan.w_s, found[2], part,
                                  gate, rows_t, bias, base)


@trusted_head
class MarkovHead(nn.Module):
    """DSpark vanilla Markov head: a rank-``markov_rank`` bigram bias ``markov_w2[v] . markov_w1[previous token]``;
    state float32 ``[.., 1]``, the previous token id (so ``vocab_size`` is below 2**24)."""

    def __init__(self, vocab_size: int, markov_rank: int) -> None:
        super().__init__()
        check_int("vocab_size", vocab_size, 1, 2**24 - 1)          # the state holds a token id as float32
        check_int("markov_rank", markov_rank)
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

    def _logits(self, block: DraftBlock, depth: int, previous: Tensor, candidates: Tensor) -> Tensor:
        rows = F.embedding(candidates, self.markov_w2.weight)                      # [b, K, r]
        return self._biased(previous, rows.mT, _base_candidates(block, depth, candidates)[:, None, :])

    def _biased(self, previous: Tensor, rows_t: Tensor, base: Tensor) -> Tensor:
        """``base + markov_w2[candidates] . markov_w1[previous]``.

        Shape: previous int64 ``[b, m]``, rows_t ``[b, r, K]``, base ``[b, 1, K]`` -> float32 ``[b, m, K]``.
        """
        bias = torch.bmm(F.embedding(previous, self.markov_w1.weight), rows_t)    # [b, m, K]
        return _float(bias).add_(base)          # = base + bias, bit for bit

    def prepare_block(self, block: DraftBlock, candidates: Tensor) -> _MarkovSteps:
        """The protocol's optional per-build preparation (see :meth:`GRUHead.prepare_block`): every depth's
        candidate rows of ``markov_w2`` and base logits gathered once.

        Shape: candidates int64 ``[b, gamma, K]`` (``C_d`` at ``[:, d - 1]``).
        """
        check_candidates(block, candidates)
        return _MarkovSteps(self, block, candidates)

    def logits(self, block: DraftBlock, depth: int, states: Tensor, candidates: Tensor) -> Tensor:
        """Shape: states ``[b, m, 1]``, candidates int64 ``[b, K]`` -> float32 ``[b, m, K]``."""
        check_depth(depth, block.gamma)
        check_states(block, states, 1)
        check_tokens(block, candidates, "candidates")
        return self._logits(block, depth, states[..., 0].to(torch.int64), candidates)

    def vocab_logits(self, block: DraftBlock, depth: int, states: Tensor) -> Tensor:
        """:meth:`logits` of every token (the protocol's optional method; see :meth:`GRUHead.vocab_logits`).

        Shape: states ``[b, m, 1]`` -> float32 ``[b, m, V]``.
        """
        check_depth(depth, block.gamma)
        check_states(block, states, 1)
        bias = F.linear(F.embedding(states[..., 0].to(torch.int64), self.markov_w1.weight), self.markov_w2.weight)
        return bias.float().add_(block.logits[:, depth - 1, None, :].float())

    def advance(self, block: DraftBlock, depth: int, states: Tensor, tokens: Tensor) -> Tensor:
        """Shape: states ``[b, m, 1]``, tokens int64 ``[b, m]`` -> ``[b, m, 1]``."""
        check_depth(depth, block.gamma)
        check_states(block, states, 1)
        check_tokens(block, tokens, "tokens", states.shape[1])
        return tokens.to(torch.float32)[..., None]

    def advance_logits(self, block: DraftBlock, depth: int, states: Tensor, tokens: Tensor,
                       candidates: Tensor) -> tuple[Tensor, Tensor]:
        """``advance`` at ``depth`` then ``logits`` at ``depth + 1`` (bit-identical to the two calls):
        the new previous token is ``tokens`` itself, so no float round trip is needed.

        Shape:
            states ``[b, m, 1]``, tokens int64 ``[b, m]``, candidates int64 ``[b, K]``
            -> (states ``[b, m, 1]``, float32 ``[b, m, K]``).
        """
        check_depth(depth, block.gamma - 1, True)
        check_states(block, states, 1)
        check_tokens(block, tokens, "tokens", states.shape[1])
        check_tokens(block, candidates, "candidates")
        return tokens.to(torch.float32)[..., None], self._logits(block, depth + 1, tokens, candidates)


class _MarkovSteps:
    """:meth:`MarkovHead.prepare_block`'s result, for one build: bit for bit the head's own calls."""

    def __init__(self, head: MarkovHead, block: DraftBlock, candidates: Tensor) -> None:
        self.head, self.gamma = head, block.gamma
        self.base = _candidate_base(block, candidates).unsqueeze(2).unbind(1)     # gamma x [b, 1, K]
        self.rows_t = F.embedding(candidates, head.markov_w2.weight).mT.unbind(1)  # gamma x [b, r, K]

    def logits(self, depth: int, states: Tensor) -> Tensor:
        """``head.logits(block, depth, states, candidates[:, depth - 1])``."""
        check_depth(depth, self.gamma)
        return self.head._biased(states[..., 0].to(torch.int64), self.rows_t[depth - 1], self.base[depth - 1])

    def advance_logits(self, depth: int, states: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """``head.advance_logits(block, depth, states, tokens, candidates[:, depth])``."""
        check_depth(depth, self.gamma - 1)
        return tokens.to(torch.float32)[..., None], self.head._biased(tokens, self.rows_t[depth], self.base[depth])
