"""Replay speculative rounds against a known continuation, without running the target on any tree.

Speculative decoding is lossless: with greedy decoding (or a :class:`~dartree.KeyedSampler` at T>0)
it commits exactly the tokens that :func:`~dartree.generate_ar` produces.  So once that reference
continuation is known, a round is fully determined by the drafter and the builder: the target's pick
at a tree node of depth d on the reference path *is* reference token d+1, and the accepted path is
the longest root path of the tree that spells a prefix of the reference.  :func:`simulate` walks the
rounds that way: draft, build, accept against the reference, append the committed tokens' hidden
states (taken from one causal forward of the whole reference sequence) to the drafter, repeat.

That makes acceptance of many tree configurations cheap (sweeps, the budget tuner, tree pictures):
one AR decode per prompt, then per configuration only the drafter and the builder run; with
:class:`ReplayBlocks` only the builder: the drafter's block at every root position of a reference is
drafted once, in one left-to-right pass, and every replay of that reference reads it.  The trees
and accepted lengths are those real decoding produces, up to floating-point differences between
the target's tree forward and its causal forward in the hidden states handed to the drafter; one
difference by construction: the last round's accepted length cannot run past the reference's end.

Why a replay and not the engine: the engine's verify stage is the target's tree forward, which a replay
exists to skip; what remains of a round (draft, build, accept against known picks) is :func:`simulate`,
the harness's only round loop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from dartree.block import DraftBlock
from dartree.decode import generate_ar
from dartree.eval.bundles import Bundle
from dartree.models.target import HFTarget
from dartree.protocols import CorrectionHead
from dartree.tree import PAD, DraftTree
from dartree.verify.accept import accept_picks
from dartree.verify.sampling import KeyedSampler

__all__ = ["Reference", "ReplayBlocks", "SimulatedRound", "Simulation", "reference", "simulate"]


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
    gamma: int

    @property
    def tau(self) -> float:
        return sum(r.committed for r in self.rounds) / max(1, len(self.rounds))


class ReplayBlocks:
    """The drafter's block at every root position of one reference, drafted once for all its replays.

    perf (both devices): the budget tuner replays some 60 settings (budgets x widths x betas) on each
    calibration reference, and a replay drafting its own blocks ran the drafter once per round of every
    setting, which made drafting most of the tuning's time (figures: docs/results.md, "Measurements behind
    design choices in the code").
    A round's block depends only on the reference up to its root, so one pass drafts a block at every
    position a round can start from (``prompt_len .. end - 2``: at most ``new_tokens - 1`` drafts), and
    the settings' replays only build and accept.

    The pass appends the context one position at a time (the prompt first, then one token a draft), so
    every block is the same whichever replays read it and in whatever order: a pure function of the
    reference and the position.  A replay that drafts its own blocks appends the context in the chunks its
    rounds commit; the drafter's matmuls give other last bits on other row counts, so the two ways agree
    up to floating-point differences, like a replay and real decoding (the module docstring).
    ``seconds[p]`` is the draft's wall time at position ``p``; a held context append computed inside the
    draft (the DFlash drafter's) is one row here and a round's commit (tau rows) in decoding.

    That holds for a drafter whose block is a function of its context and root, as the DFlash drafter's
    is; one with state of its own (the toy ``OracleDrafter`` draws its noise from one stream, draft after
    draft) gets other draws here than drafting round by round, the same for every replay.

    Memory: ``new_tokens - 1`` blocks on the drafter's device (on the zoo 63 x 250 KB of logits; with a
    151,936-token vocabulary in float32, 63 x 9.1 MB = 574 MB); keep one reference's at a time, as
    :func:`dartree.eval.tune.replay_settings` does.
    """

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
                t0 = time.perf_counter()
                self.blocks[p] = drafter.draft(seq[:, p])
                _sync(device)
                self.seconds[p] = time.perf_counter() - t0
            drafter.reset()

    def block(self, p: int) -> tuple[DraftBlock, float]:
        """The block whose root is at position ``p``, and the seconds its draft took."""
        if p not in self.blocks:
            raise ValueError(f"p: no block at position {p}; the reference's rounds start at "
                             f"{self.prompt_len}..{self.prompt_len + len(self.blocks) - 1}")
        return self.blocks[p], self.seconds[p]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)   # stage timing needs the device idle at the boundary


@torch.no_grad()
def reference(bundle: Bundle, prompt: list[int], max_new_tokens: int, temperature: float = 0.0,
              seed: int = 0, label: str = "", warps: dict | None = None) -> Reference:
    """The target's continuation of ``prompt`` (greedy, or keyed sampling with ``seed`` at T>0, under the
    target-side warpers ``warps``: ``top_k`` / ``top_p`` / ``min_p``, as decoding takes them).

    At T>0 a replay of the reference is exact for decoding with ``KeyedSampler(seed)``: on the
    reference path the target's sample at every node is the reference's token.
    """
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

    ``record`` keeps every round's tree (on the CPU) and its accepted node indices.  ``blocks`` (made from
    ``ref``) gives the drafter's blocks, drafted once for every replay of ``ref``; without it the replay
    drafts round by round.  A round's ``draft_s`` is then that block's draft time.
    """
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
    gamma = 0
    while p < end - 1:
        if blocks is None:
            t0 = time.perf_counter()
            block = drafter.draft(seq[:, p])
            _sync(device)
            draft_s = time.perf_counter() - t0
        else:
            block, draft_s = blocks.block(p)
        t1 = time.perf_counter()
        tree = builder.build(block, head)
        _sync(device)
        t2 = time.perf_counter()
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
        rounds.append(SimulatedRound(accepted_length, count, size, draft_s, t2 - t1,
                                     tree.to("cpu") if record else None, kept, p, bonus))
        p += count
    return Simulation(tuple(rounds), gamma)
