"""The tuner's measurements on the running machine: the verify-cost probe, the per-round overhead, replays of
settings on calibration references, real decodes beside AR, and :func:`screen_decodes` (acceptance under a
sampled verifier, which no replay gives: its path is a draw)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from dartree.arguments import check_int
from dartree.builders import make_builder
from dartree.decode import GenerationResult, generate_ar
from dartree.eval.bundles import Bundle
from dartree.eval.costmodel import ConfigStats, VerifyCost
from dartree.eval.methods import MethodSpec, make_decoder, resolve_backend, sampler_for
from dartree.eval.simulate import Reference, ReplayBlocks, simulate, timed
from dartree.models.target import HFTarget
from dartree.rounds import DEFAULT_VERIFIER
from dartree.tree import DraftTree
from dartree.verify.sampling import KeyedSampler

__all__ = ["Measurement", "measure_verify_cost", "probe_verify_cost", "measure_overhead", "replay_settings",
           "measure_specs", "screen_decodes", "concrete", "synthetic_tree"]


@dataclass(frozen=True)
class Measurement:
    """Real decodes of one setting (``budget=None``: AR) on the calibration prompts, timed whole."""

    budget: int | None
    width: int | None
    tokens: int
    seconds: float
    rounds: int
    per_label: tuple[tuple[str, int, float], ...] = ()     # (label, tokens, seconds) per calibration set
    beta: float | None = None                             # the depth penalty, when the tuner searched it
    per_prompt: tuple[tuple[str, int, float], ...] = ()    # (label, tokens, seconds) per reference, in order
    verifier: str | None = None       # how it verified at T>0 ("match" / "rejection" / "traversal"; None: greedy or AR)
    builder: str = ""                 # the registry name when ``auto`` searched several ("" otherwise)

    @property
    def is_ar(self) -> bool:
        return self.budget is None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("inf")

    def label_tokens_per_s(self) -> dict[str, float]:
        return {label: t / s if s > 0 else float("inf") for label, t, s in self.per_label}


def synthetic_tree(nodes: int, gamma: int, device: torch.device, rows: int = 1) -> DraftTree:
    """A valid tree of ``nodes`` nodes and depth <= ``gamma`` (w chains of equal length; w minimal),
    repeated in ``rows`` rows."""
    width = max(1, -(-(nodes - 1) // gamma))
    idx = torch.arange(nodes, device=device)
    parents = torch.where(idx > width, idx - width, torch.zeros_like(idx))
    parents[0] = -1
    depths = torch.where(idx > 0, (idx - 1) // width + 1, torch.zeros_like(idx))
    tokens = (idx * 7 + 3) % 97
    ranks = torch.where(idx > 0, (idx - 1) % width, torch.full_like(idx, -1))
    scores = -depths.float()

    def rep(x: torch.Tensor) -> torch.Tensor:
        return x[None].expand(rows, -1).contiguous()

    return DraftTree(rep(tokens), rep(parents), rep(depths), rep(scores), rep(ranks),
                     torch.full((rows,), nodes, dtype=torch.int64, device=device))


@torch.no_grad()
def measure_verify_cost(model: torch.nn.Module, layer_ids: Sequence[int] = (), prefix_len: int = 256,
                        sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128), gamma: int = 15,
                        repeats: int = 5, rows: int = 1, logits: str = "all") -> VerifyCost:
    """Median seconds of tree inputs + tree forward for each tree size in ``sizes`` (root included),
    after a random prefix of ``prefix_len`` tokens.

    ``rows > 1``: one batched forward of ``rows`` trees (a round at concurrency ``rows``).  ``logits="root"``
    scores the roots only and times one LM-head row (``row_s``); ``"walk"`` times both ways, every node in
    ``seconds`` and the root only in ``root_seconds``, plus ``row_s`` (:class:`dartree.rounds.WalkRows`).
    """
    sizes = tuple(sorted(set(int(s) for s in sizes)))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"sizes: need tree sizes >= 1, got {sizes}")
    check_int("repeats", repeats)
    check_int("rows", rows)
    if logits not in ("all", "root", "walk"):
        raise ValueError(f"logits: expected 'all', 'root' or 'walk', got {logits!r}")
    if logits == "walk" and rows != 1:
        raise ValueError(f"logits: 'walk' times single-request rounds; got rows={rows}")
    target = HFTarget(model, layer_ids=tuple(layer_ids))
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, target.vocab_size, (rows, prefix_len), generator=gen).to(target.device)
    target.prefill(list(prefix))
    ways = ("all", "root") if logits == "walk" else (logits,)
    final = None
    trees = [synthetic_tree(n, gamma, target.device, rows) for n in sizes]
    times: dict[tuple[int, str], list[float]] = {(n, way): [] for n in sizes for way in ways}
    # interleaved, every size and way in each repetition: load drifting during the probe charges every size
    # alike (docs/results.md, "Measurements behind design choices in the code")
    for _ in range(repeats + 1):                           # the first repetition warms up and is dropped
        for n, tree in zip(sizes, trees, strict=True):
            for way in ways:
                out, seconds = timed(target.device, lambda: target.forward_tree(target.tree_inputs(tree),  # noqa: B023
                                                                                 logits=way))  # noqa: B023
                final = out.final if out.final is not None else final
                times[(n, way)].append(seconds)
                target.rollback()
    seconds = {way: [statistics.median(times[(n, way)][1:]) for n in sizes] for way in ways}
    row_s = 0.0
    if logits != "all" and final is not None:           # the walk's rows: one LM-head row per accepted node
        row = final[:, 0]
        row_s = statistics.median([timed(target.device, lambda: target.head_logits(row))[1]
                                   for _ in range(repeats + 1)][1:])
    target.reset()
    if logits == "walk":
        return VerifyCost(sizes, tuple(seconds["all"]), prefix_len, row_s, tuple(seconds["root"]))
    return VerifyCost(sizes, tuple(seconds[logits]), prefix_len, row_s)


def probe_verify_cost(bundle: Bundle, prefix_len: int, largest_budget: int, **kwargs) -> VerifyCost:
    """:func:`measure_verify_cost` of ``bundle``'s target for trees up to ``largest_budget`` draft nodes (on the
    CPU both ways, every node and the root only, as single-request decoding chooses between them)."""
    largest = largest_budget + 1
    sizes = sorted({n for n in (1, 2, 4, 8, 16, 32, 64, 128, 256) if n < largest} | {largest})
    kwargs.setdefault("logits", "walk" if HFTarget(bundle.target).scores_rows_apart else "all")
    return measure_verify_cost(bundle.target, bundle.drafter.target_layer_ids, prefix_len, sizes,
                               int(getattr(bundle.drafter, "gamma", 15)), **kwargs)


@torch.no_grad()
def measure_overhead(bundle: Bundle, method: MethodSpec, ref: Reference, backend: str, temperature: float = 0.0,
                     seed: int = 0, warps: dict | None = None) -> float:
    """Mean seconds per round of the acceptance walk and the commit (the stages a replay does not run),
    from one real decode."""
    sampler = KeyedSampler(seed) if temperature > 0 else None
    decoded = make_decoder(bundle, method, backend).generate(ref.sequence[:, : ref.prompt_len],
                                                             max(1, min(ref.new_tokens, 32)), temperature, sampler,
                                                             **(warps or {}))
    return sum(r.commit_s + r.accept_s for r in decoded.rounds) / max(1, decoded.num_rounds)


def replay_settings(bundle: Bundle, methods: Sequence[MethodSpec], refs: Iterable[Reference], backend: str,
                    progress: Callable[[str], None] | None = None) -> list[ConfigStats]:
    """Replay every method of ``methods`` (concrete settings) on every reference; pooled per-round statistics
    per method, in order.  perf: each reference's drafter blocks are drafted once (:class:`ReplayBlocks`)."""
    made = [(make_builder(m.builder, resolve_backend(m.builder, backend), **m.config),
             bundle.heads[m.head] if m.head is not None else None) for m in methods]
    rounds: list[list] = [[] for _ in methods]
    refs = list(refs)
    for i, ref in enumerate(refs):
        if progress is not None:
            progress(f"replaying {len(methods)} settings on calibration prompt {i + 1}/{len(refs)}")
        blocks = ReplayBlocks(bundle.drafter, ref)
        for (builder, head), pooled in zip(made, rounds, strict=True):
            pooled.extend(simulate(bundle, builder, head, ref, blocks=blocks).rounds)
    return [_pooled(r) for r in rounds]


def _pooled(rounds: Sequence, decoded: bool = False) -> ConfigStats:
    """Per-round means of replayed rounds, or of decoded ones (their verify and overhead times measured)."""
    n = max(1, len(rounds))

    def mean(*stages: str) -> float:
        return sum(getattr(r, s) for r in rounds for s in stages) / n

    return ConfigStats(
        tau=mean("committed"), mean_tree_size=mean("tree_size"),
        draft_s=mean("draft_s", "context_s") if decoded else mean("draft_s"),
        build_s=mean("head_s", "builder_s") if decoded else mean("build_s"),
        tree_sizes=tuple(r.tree_size for r in rounds),
        verify_s=mean("mask_s", "target_s") if decoded else None,
        overhead_s=mean("accept_s", "kv_s") if decoded else None)


@torch.no_grad()
def measure_specs(bundle: Bundle, specs: Sequence[tuple[MethodSpec, str | None, float | None]],
                  refs: Sequence[Reference], backend: str, temperature: float = 0.0, seed: int = 0,
                  labels: Sequence[str] | None = None, builders: bool = False,
                  warps: dict | None = None) -> tuple[Measurement, ...]:
    """Decode every reference's prompt for real with AR and with each ``(method, verifier, searched beta)``,
    timed whole after one untimed warm-up, the order rotated from prompt to prompt so that drifting load
    penalises none more.  ``builders``: record each builder (``auto`` compares several).  Returns AR's
    measurement first, then one per spec, in order.
    """
    warps = warps or {}
    labels = list(labels) if labels is not None else [r.label for r in refs]
    if len(labels) != len(refs):
        raise ValueError(f"labels: need one per reference ({len(refs)}), got {len(labels)}")
    # per run: (builder, budget, width, verifier), the searched beta, and how it decodes
    runs: list[tuple[tuple, float | None, Callable[..., GenerationResult]]] = [(("", None, None, None), None, (
        lambda ids, n, t, smp: generate_ar(bundle.target, ids, n, t, smp, **(warps if t > 0 else {}))))]
    for spec, verifier, beta in specs:
        decoder = make_decoder(bundle, spec, backend)
        key = (spec.builder if builders else "", spec.config.get("budget"), spec.config.get("width"),
               verifier if temperature > 0 else None)
        runs.append((key, beta, lambda ids, n, t, smp, d=decoder, v=verifier: d.generate(
            ids, n, t, smp, verifier=v if t > 0 else None, **(warps if t > 0 else {}))))
    first = refs[0].sequence[:, : refs[0].prompt_len]
    for _, _, run in runs:                   # first calls allocate caches and pick kernels: untimed
        run(first, max(1, min(8, refs[0].new_tokens)), 0.0, None)
    rows: list[list[tuple[str, int, float, int]]] = [[] for _ in runs]     # per run: (label, tokens, s, rounds)
    for i, (ref, label) in enumerate(zip(refs, labels, strict=True)):
        ids = ref.sequence[:, : ref.prompt_len]
        for j in [*range(i % len(runs), len(runs)), *range(i % len(runs))]:
            # AR (no verifier) draws with the generator sampler, as a user's AR does (the keyed one costs more)
            rule = runs[j][0][3] or DEFAULT_VERIFIER
            sampler = sampler_for(rule, seed, i, ids.device) if temperature > 0 else None
            start = time.perf_counter()
            result = runs[j][2](ids, ref.new_tokens, temperature, sampler)
            rows[j].append((label, result.tokens.shape[1], time.perf_counter() - start, max(1, result.num_rounds)))
    out = []
    for ((builder, budget, width, verifier), beta, _), done in zip(runs, rows, strict=True):
        per_label: dict[str, tuple[int, float]] = {}
        for label, tokens, seconds, _ in done:
            t, s = per_label.get(label, (0, 0.0))
            per_label[label] = (t + tokens, s + seconds)
        out.append(Measurement(budget, width, sum(t for t, _ in per_label.values()),
                               sum(s for _, s in per_label.values()), sum(r[3] for r in done),
                               tuple((label, t, s) for label, (t, s) in per_label.items()), beta,
                               tuple(r[:3] for r in done), verifier, builder))
    return tuple(out)


@torch.no_grad()
def screen_decodes(bundle: Bundle, methods: Sequence[MethodSpec], refs: Sequence[Reference], backend: str,
                   temperature: float, seed: int = 0, verifier: str = "rejection",
                   warps: dict | None = None) -> list[ConfigStats]:
    """Acceptance and per-round times of every method (concrete settings) under ``verifier``, from real
    decodes of every reference's prompt, pooled per method, in order."""
    out = []
    for method in methods:
        decoder = make_decoder(bundle, method, backend)
        rounds = []
        for i, ref in enumerate(refs):
            ids = ref.sequence[:, : ref.prompt_len]
            sampler = sampler_for(verifier, seed, 7 + i, ids.device)
            rounds.extend(decoder.generate(ids, ref.new_tokens, temperature, sampler, verifier=verifier,
                                           **(warps or {})).rounds)
        out.append(_pooled(rounds, decoded=True))
    return out


def concrete(method: MethodSpec, budget: int, width: int | None, beta: float | None = None) -> MethodSpec:
    """``method`` with these settings (``width`` / ``beta`` only where not ``None``)."""
    extra = ({"width": width} if width is not None else {}) | ({"beta": beta} if beta is not None else {})
    return method.with_settings(budget=budget, **extra)
