"""Replay speculative rounds against a known continuation (the target's own), without running the target on
any tree: acceptance of many settings cheaply, and the trees of real rounds for pictures (docs/internals.md,
"The benchmark harness")."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from dartree.block import DraftBlock
from dartree.decode import generate_ar
from dartree.eval.bundles import Bundle
from dartree.eval.methods import MethodSpec, make_method_builder
from dartree.models.target import HFTarget
from dartree.protocols import CorrectionHead
from dartree.tree import PAD, DraftTree
from dartree.verify.accept import accept_picks
from dartree.verify.sampling import KeyedSampler

__all__ = ["Reference", "ReplayBlocks", "SimulatedRound", "Simulation", "reference", "simulate", "recorded_rounds",
           "depth_counts"]


@dataclass(frozen=True)
class Reference:
    """A prompt and the target's own continuation of it.

    Shape:
        sequence: int64 ``[1, L + m]`` prompt then the m reference tokens.
        hidden:   float ``[1, L + m, F]`` the target's hidden states (drafter layers) of every token,
                  or ``None`` when the drafter reads none.
    """

    sequence: Tensor
    hidden: Tensor | None
    prompt_len: int
    ar_seconds: float
    label: str = ""           # the prompt set (dataset) it came from, for per-set statistics

    @property
    def new_tokens(self) -> int:
        return self.sequence.shape[1] - self.prompt_len


@dataclass(frozen=True)
class SimulatedRound:
    """One replayed round; ``tree`` and ``accepted`` (node indices, root first) only when recorded.

    position: absolute position of the round's root; bonus: the target's token after the accepted
    path (``PAD`` when the reference ends first).
    """

    accepted_length: int
    committed: int
    tree_size: int
    draft_s: float
    build_s: float
    tree: DraftTree | None = None
    accepted: tuple[int, ...] = ()
    position: int = 0
    bonus: int = PAD


@dataclass(frozen=True)
class Simulation:
    """All rounds of one replayed prompt."""

    rounds: tuple[SimulatedRound, ...]

    @property
    def tau(self) -> float:
        return sum(r.committed for r in self.rounds) / max(1, len(self.rounds))


class ReplayBlocks:
    """The drafter's block at every root position of one reference, drafted once for all its replays (a block
    depends only on the reference up to its root).  perf: drafting per replay was most of the tuner's time.
    Memory: ``new_tokens - 1`` blocks of logits on the drafter's device; keep one reference's at a time."""

    def __init__(self, drafter, ref: Reference) -> None:
        seq, hidden = ref.sequence, ref.hidden
        if seq.shape[0] != 1:
            raise ValueError(f"ref: one sequence expected, got a batch of {seq.shape[0]}")
        device = seq.device
        start, end = ref.prompt_len, seq.shape[1]
        self.prompt_len = start
        self.blocks: dict[int, DraftBlock] = {}
        self.seconds: dict[int, float] = {}
        with torch.no_grad():
            drafter.reset()
            drafter.append_context(None if hidden is None else hidden[:, :start], seq[:, :start])
            for p in range(start, end - 1):
                if p > start:
                    drafter.append_context(None if hidden is None else hidden[:, p - 1: p], seq[:, p - 1: p])
                self.blocks[p], self.seconds[p] = timed(device, lambda p=p: drafter.draft(seq[:, p]))
            drafter.reset()

    def block(self, p: int) -> tuple[DraftBlock, float]:
        """The block whose root is at position ``p``, and the seconds its draft took."""
        if p not in self.blocks:
            raise ValueError(f"p: no block at position {p}; the reference's rounds start at "
                             f"{self.prompt_len}..{self.prompt_len + len(self.blocks) - 1}")
        return self.blocks[p], self.seconds[p]


def timed(device: torch.device, fn):
    """``fn()`` and its wall seconds, from an idle device to its last kernel."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)   # stage timing needs the device idle at both boundaries
    start = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - start


@torch.no_grad()
def reference(bundle: Bundle, prompt: list[int], max_new_tokens: int, temperature: float = 0.0,
              seed: int = 0, label: str = "", warps: dict | None = None) -> Reference:
    """The target's continuation of ``prompt`` (greedy, or keyed sampling with ``seed`` at T>0 under the
    warpers ``warps``); a replay of it is exact for decoding with ``KeyedSampler(seed)``."""
    target = HFTarget(bundle.target, layer_ids=tuple(bundle.drafter.target_layer_ids))
    ids = torch.tensor([prompt], dtype=torch.int64, device=target.device)
    sampler = KeyedSampler(seed) if temperature > 0 else None
    start = time.perf_counter()            # timed as the benchmark's AR: no hidden-state capture
    result = generate_ar(HFTarget(bundle.target), ids, max_new_tokens, temperature=temperature, sampler=sampler,
                         **(warps or {}))
    ar_seconds = time.perf_counter() - start
    sequence = result.sequence
    hidden = target.prefill(sequence).hidden
    target.reset()
    return Reference(sequence=sequence, hidden=hidden, prompt_len=len(prompt), ar_seconds=ar_seconds, label=label)


@torch.no_grad()
def simulate(bundle: Bundle, builder, head: CorrectionHead | None, ref: Reference, record: bool = False,
             blocks: ReplayBlocks | None = None) -> Simulation:
    """Replay the rounds of decoding ``ref`` with ``builder`` (and ``head``); see the module docstring.
    ``record`` keeps every round's tree (on the CPU) and accepted nodes; ``blocks`` (made from ``ref``) gives
    the drafter's blocks, else the replay drafts round by round.  Why not the engine's stages:
    docs/internals.md, "The benchmark harness" (Replays)."""
    drafter = bundle.drafter
    seq = ref.sequence
    device = seq.device
    end = seq.shape[1]
    hidden = ref.hidden
    p = ref.prompt_len             # position of the current root: the first new token (the prefill's)
    if blocks is not None and (blocks.prompt_len != p or len(blocks.blocks) != max(0, end - 1 - p)):
        raise ValueError(f"blocks: made from another reference ({len(blocks.blocks)} blocks from position "
                         f"{blocks.prompt_len}; this one starts rounds at {p}..{end - 2})")
    if blocks is None:
        drafter.reset()
        drafter.append_context(None if hidden is None else hidden[:, :p], seq[:, :p])
    rounds: list[SimulatedRound] = []
    while p < end - 1:
        block, draft_s = timed(device, lambda: drafter.draft(seq[:, p])) if blocks is None else blocks.block(p)  # noqa: B023
        tree, build_s = timed(device, lambda: builder.build(block, head))  # noqa: B023
        gamma = block.gamma
        # The target's pick at a node of depth d is reference token p + 1 + d (PAD past the end).
        truth = torch.full((gamma + 1,), PAD, dtype=torch.int64, device=device)
        future = seq[0, p + 1: p + 2 + gamma]
        truth[: future.shape[0]] = future
        result = accept_picks(tree, truth[tree.depths.clamp(min=0)])
        accepted_length = int(result.accepted_length[0])    # one sync per round, on purpose: the walk needs it
        count = min(accepted_length + 1, end - 1 - p)
        if blocks is None:
            drafter.append_context(None if hidden is None else hidden[:, p: p + count], seq[:, p: p + count])
        size = int(tree.num_nodes[0]) - 1
        kept = tuple(int(i) for i in result.accepted[0, : accepted_length + 1]) if record else ()
        bonus = int(truth[accepted_length]) if record else PAD
        rounds.append(SimulatedRound(accepted_length, count, size, draft_s, build_s,
                                     tree.to("cpu") if record else None, kept, p, bonus))
        p += count
    return Simulation(tuple(rounds))


def recorded_rounds(bundle: Bundle, method: MethodSpec, ref: Reference, backend: str) -> tuple[SimulatedRound, ...]:
    """Every round of decoding ``ref`` with ``method``, each with its tree and accepted node indices."""
    head = bundle.heads[method.head] if method.head is not None else None
    return simulate(bundle, make_method_builder(method, backend), head, ref, record=True).rounds


def depth_counts(rounds: Sequence[SimulatedRound], gamma: int) -> list[float]:
    """Mean number of draft nodes at depth 1..gamma per tree over ``rounds`` (the paper's Figure 7)."""
    if not rounds:
        raise ValueError("rounds: need at least one recorded round")
    totals = [0.0] * gamma
    for r in rounds:
        if r.tree is None:
            raise ValueError("rounds: recorded rounds needed (simulate(..., record=True))")
        n = int(r.tree.num_nodes[0])
        for d in r.tree.depths[0, 1:n].tolist():
            totals[d - 1] += 1
    return [t / len(rounds) for t in totals]
