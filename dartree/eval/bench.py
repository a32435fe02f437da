"""The benchmark: methods x datasets x temperatures on one bundle, AR measured in the same run, every row
checked against AR's tokens or the target's law (docs/internals.md, "The benchmark harness")."""

from __future__ import annotations

import dataclasses
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dartree import native
from dartree.arguments import check_int
from dartree.decode import ROUND_STAGES, GenerationResult, generate_ar
from dartree.eval.bundles import Bundle, encode, stop_token_id
from dartree.eval.datasets import load_prompts
from dartree.eval.lawcheck import LawCheck, law_check, pit_values
from dartree.eval.methods import AR, MethodSpec, make_decoder, resolve_backend, sampler_for
from dartree.eval.peers import PEER_PREFIX, PEERS, PeerResult, make_peer, peer_unavailable
from dartree.eval.simulate import reference, timed
from dartree.eval.tune import DEFAULT_BUDGETS, DEFAULT_MIN_SPEEDUP, DEFAULT_WIDTHS, TuneResult, tune
from dartree.models.target import HFTarget
from dartree.rounds import DEFAULT_VERIFIER, SAMPLED_VERIFIERS, VERIFIERS
from dartree.verify.warp import Warp

__all__ = ["BenchConfig", "RunRecord", "Summary", "BenchResult", "run_bench", "summarize", "MODEL_STAGES",
           "acceptance_curve", "run_meta"]

#: The stages that are model forwards; ``overhead`` is the round minus these.
MODEL_STAGES: tuple[str, ...] = ("draft", "head", "target", "context")


@dataclass(frozen=True)
class BenchConfig:
    """What to run.  AR always runs (it is the reference)."""

    methods: tuple[MethodSpec, ...]
    datasets: tuple[str, ...] = ("humaneval",)
    temperatures: tuple[float, ...] = (0.0,)
    num_prompts: int = 4
    max_new_tokens: int = 64
    max_prompt_tokens: int = 256
    prompt_chars: int = 600
    seed: int = 0
    backend: str = "auto"
    warmup: bool = True
    stop_at_eos: bool = False
    calibration_prompts: int = 4          # per dataset, after its evaluation prompts: where ``auto`` is tuned
    tune_budgets: tuple[int, ...] = DEFAULT_BUDGETS
    tune_widths: tuple[int, ...] = DEFAULT_WIDTHS
    tune_min_speedup: float = DEFAULT_MIN_SPEEDUP    # ``auto`` picks a tree only if it beats AR by this factor
    peers: tuple[str, ...] = ()           # PEERS timed at each temperature they run at, rows ``peer:NAME``
    verifier: str | None = None           # T>0 acceptance rule of methods that set none (None: DEFAULT_VERIFIER)
    top_k: int | None = None              # target-side warpers at T>0, for AR and every method alike
    top_p: float | None = None
    min_p: float | None = None
    law_draws: int = 8                    # extra one-round decodes per prompt for a rejection row's law check

    def __post_init__(self) -> None:
        if self.verifier is not None and self.verifier not in VERIFIERS:
            raise ValueError(f"verifier: expected None or one of {VERIFIERS}, got {self.verifier!r}")
        Warp(1.0, self.top_k, self.top_p, self.min_p)         # names a bad top_k / top_p / min_p
        bad = [p for p in self.peers if p not in PEERS]
        if bad or len(set(self.peers)) != len(self.peers):
            raise ValueError(f"peers: each must be one of {PEERS}, once, got {list(self.peers)}")
        if self.peers and self.stop_at_eos:
            raise ValueError("peers: the peers decode exactly max_new_tokens tokens; drop stop_at_eos to compare them")
        if not self.methods:
            raise ValueError("methods: need at least one method")
        if not self.datasets:
            raise ValueError("datasets: need at least one dataset")
        if not self.temperatures or any(not (t >= 0 and t < float("inf")) for t in self.temperatures):
            raise ValueError(f"temperatures: need finite numbers >= 0, got {self.temperatures}")
        for name in ("num_prompts", "max_new_tokens", "max_prompt_tokens", "calibration_prompts"):
            check_int(name, getattr(self, name))
        check_int("law_draws", self.law_draws, 0)
        if isinstance(self.tune_min_speedup, bool) or not self.tune_min_speedup >= 0:
            raise ValueError(f"tune_min_speedup: must be a number >= 0, got {self.tune_min_speedup!r}")

    @property
    def warps(self) -> dict[str, Any]:
        """The target-side warpers at T>0, as the decode calls take them."""
        return {"top_k": self.top_k, "top_p": self.top_p, "min_p": self.min_p}


@dataclass(frozen=True)
class RunRecord:
    """One generation of one prompt by one method."""

    method: str
    dataset: str
    temperature: float
    prompt_id: str
    prompt_tokens: int
    new_tokens: int
    seconds: float
    prefill_s: float
    accepted_lengths: tuple[int, ...]
    committed: tuple[int, ...]
    tree_sizes: tuple[int, ...]
    stage_s: tuple[float, ...]            # summed over rounds, in ROUND_STAGES order
    matches_ar: bool
    first_difference: int = -1            # index of the first token that differs from AR's (-1: none)
    head_calls: int = 0                   # correction-head calls over all rounds (bound pruning lowers it)
    verifier: str = "greedy"              # "rejection": lossless in law, its tokens are not compared with AR's

    @property
    def rounds(self) -> int:
        return len(self.committed)


@dataclass(frozen=True)
class Summary:
    """One method on one (dataset, temperature), pooled over prompts (a Table 1 / Table 2 cell)."""

    method: str
    builder: str
    settings: dict[str, Any]
    backend: str
    dataset: str
    temperature: float
    prompts: int
    tokens: int
    seconds: float
    tokens_per_s: float
    speedup: float
    tau: float
    rounds: int
    mean_tree_size: float
    stage_ms: dict[str, float]            # mean per round, ROUND_STAGES
    round_ms: float
    overhead_ms: float                    # round_ms minus the MODEL_STAGES
    lossless_prompts: int
    acceptance: tuple[float, ...]         # Pr(L >= t) for t = 1..gamma
    verifier: str = "greedy"              # how its rows were verified ("rejection": in law, not compared)
    law: str = ""                         # sampled rows: the distribution check (LawCheck.text) of its row


@dataclass(frozen=True)
class BenchResult:
    """Everything a benchmark produced; ``to_json`` is what ``results.json`` holds."""

    config: BenchConfig
    meta: dict[str, Any]
    records: tuple[RunRecord, ...]
    summaries: tuple[Summary, ...]
    tuning: tuple[TuneResult, ...] = field(default=())
    law_checks: tuple[LawCheck, ...] = field(default=())

    @property
    def lossless(self) -> bool:
        """Every compared output equals AR's and every rejection row passes its distribution check."""
        return all(r.matches_ar for r in self.records) and all(c.passed for c in self.law_checks)

    def to_json(self) -> dict[str, Any]:
        return {
            "meta": self.meta,
            "config": dataclasses.asdict(self.config),
            "lossless": self.lossless,
            "summaries": [dataclasses.asdict(s) for s in self.summaries],
            "tuning": [dataclasses.asdict(t) for t in self.tuning],
            "law_checks": [dataclasses.asdict(c) | {"passed": c.passed} for c in self.law_checks],
            "records": [dataclasses.asdict(r) for r in self.records],
        }


def acceptance_curve(accepted_lengths: Sequence[int], gamma: int) -> tuple[float, ...]:
    """``Pr(L >= t)`` for ``t = 1..gamma`` over rounds (the paper's Figure 5)."""
    n = max(1, len(accepted_lengths))
    return tuple(sum(1 for a in accepted_lengths if a >= t) / n for t in range(1, gamma + 1))


def _first_difference(tokens: torch.Tensor, ar_tokens: torch.Tensor) -> int:
    """Index of the first token of ``tokens`` that differs from AR's (-1: none)."""
    mine, ref = tokens[0].cpu().tolist(), ar_tokens[0].tolist()
    return next((i for i, (a, b) in enumerate(zip(mine, ref, strict=False)) if a != b),
                -1 if len(mine) == len(ref) else min(len(mine), len(ref)))


def _record(method: str, dataset: str, temperature: float, prompt_id: str, result: GenerationResult,
            seconds: float, ar_tokens: torch.Tensor | None, verifier: str = "greedy") -> RunRecord:
    stage = tuple(result.stage_breakdown()[s] for s in ROUND_STAGES)       # disjoint, sum = round
    first = -1 if ar_tokens is None else _first_difference(result.tokens, ar_tokens)
    return RunRecord(method, dataset, temperature, prompt_id, result.prompt.shape[1], result.tokens.shape[1], seconds,
                     result.prefill_s, tuple(r.accepted_length for r in result.rounds),
                     tuple(r.committed for r in result.rounds), tuple(r.tree_size for r in result.rounds), stage,
                     first == -1, first, sum(r.head_calls for r in result.rounds), verifier)


def _peer_record(label: str, dataset: str, temperature: float, prompt_id: str, prompt_tokens: int,
                 result: PeerResult, seconds: float, ar_tokens: torch.Tensor) -> RunRecord:
    """A peer's decode; at T>0 (HF's own sampling) its tokens are not compared: ``verifier`` ``"sample"``."""
    first = _first_difference(result.tokens, ar_tokens) if temperature == 0 else -1
    committed = result.committed or ()
    return RunRecord(label, dataset, temperature, prompt_id, prompt_tokens, result.tokens.shape[1], seconds, 0.0,
                     tuple(c - 1 for c in committed), committed, (0,) * len(committed), (0.0,) * len(ROUND_STAGES),
                     first == -1, first, verifier="greedy" if temperature == 0 else "sample")


def summarize(records: Sequence[RunRecord], methods: Sequence[MethodSpec], backend: str, gamma: int,
              resolved: dict[tuple[str, float], MethodSpec] | None = None,
              law: Sequence[LawCheck] = ()) -> tuple[Summary, ...]:
    """Pool records per (method, dataset, temperature); speedup against AR of the same cell.  ``resolved``:
    what a method ran as at a temperature; ``law``: the distribution checks of sampled rows."""
    law_text = {(c.method, c.temperature): c.text for c in law}
    cells: dict[tuple[str, str, float], list[RunRecord]] = {}
    for r in records:
        cells.setdefault((r.method, r.dataset, r.temperature), []).append(r)
    by_label = {m.label: m for m in methods}
    out = []
    for (label, dataset, temperature), rs in cells.items():
        tokens = sum(r.new_tokens for r in rs)
        seconds = sum(r.seconds for r in rs)
        rounds = sum(r.rounds for r in rs)
        ar = cells[(AR, dataset, temperature)]
        ar_rate = sum(r.new_tokens for r in ar) / sum(r.seconds for r in ar)
        rate, n = tokens / seconds, max(1, rounds)     # a peer's loop: no stages, tau only where it reports rounds
        spec = None if label.startswith(PEER_PREFIX) else (resolved or {}).get((label, temperature), by_label[label])
        stage_ms = {s: 1000.0 * sum(r.stage_s[i] for r in rs) / n for i, s in enumerate(ROUND_STAGES)}
        out.append(Summary(
            method=label, builder="peer" if spec is None else spec.builder,
            settings={} if spec is None else spec.config,
            backend="-" if spec is None or spec.is_ar else resolve_backend(spec.builder, backend),
            dataset=dataset, temperature=temperature, prompts=len(rs), tokens=tokens, seconds=seconds,
            tokens_per_s=rate, speedup=rate / ar_rate, tau=sum(sum(r.committed) for r in rs) / n,
            rounds=rounds, mean_tree_size=sum(sum(r.tree_sizes) for r in rs) / n, stage_ms=stage_ms,
            round_ms=sum(stage_ms.values()),
            overhead_ms=sum(stage_ms.values()) - sum(stage_ms[st] for st in MODEL_STAGES),
            lossless_prompts=sum(r.matches_ar for r in rs),
            acceptance=() if spec is None or spec.is_ar else
            acceptance_curve([a for r in rs for a in r.accepted_lengths], gamma),
            verifier=rs[0].verifier, law=law_text.get((label, temperature), "")))
    return tuple(out)


def run_meta(bundle: Bundle, argv: Sequence[str] | None) -> dict[str, Any]:
    """What a results file records about the run: versions, threads, device, model, command line."""
    return {
        "model": bundle.name,
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(argv) if argv is not None else None,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "machine": f"{platform.system()} {platform.machine()}",
        "processor": platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "device": str(next(bundle.target.parameters()).device),
        # the compiled host loops of the fast backend (dartree.native): off means the tensorized builders ran
        "native_host_loops": native.enabled(),
        # which forward the target ran (dartree.models.lean: "lean" once probed equal to the model's own)
        "target_forward": HFTarget(bundle.target).forward_path,
    }


def _tune_auto(bundle: Bundle, config: BenchConfig, log: Callable[[str], None] | None
               ) -> tuple[dict[tuple[str, float], MethodSpec], list[TuneResult]]:
    """What every method runs as at each temperature, and the tuning behind each ``auto`` method
    (calibrated on the prompts of every dataset after its evaluation prompts)."""
    resolved = {(m.label, t): m for m in config.methods for t in config.temperatures}
    tuning: list[TuneResult] = []
    auto = [m for m in config.methods if m.auto_fields]
    if not auto:
        return resolved, tuning
    calib = [(d, encode(bundle.tokenizer, p.text)[-config.max_prompt_tokens:]) for d in config.datasets
             for p in load_prompts(d, config.calibration_prompts, offset=config.num_prompts,
                                   prompt_chars=config.prompt_chars)]
    for temperature in config.temperatures:
        at = config.warps if temperature > 0 else {}
        refs = [reference(bundle, ids, config.max_new_tokens, temperature, config.seed, label=d, warps=at)
                for d, ids in calib]
        for m in auto:
            # methods that name a verifier keep it; the others are ranked under the run's, else under each
            method = m if temperature == 0 else m.under(config.verifier)
            result = tune(bundle, method, refs, config.backend, config.tune_budgets, config.tune_widths,
                          progress=(lambda s, t=temperature: log(f"tune T={t:g}: {s}")) if log else None,
                          temperature=temperature, seed=config.seed, min_speedup=config.tune_min_speedup, warps=at)
            tuning.append(result)
            resolved[(m.label, temperature)] = result.resolve(m)
    return resolved, tuning


@torch.no_grad()
def run_bench(bundle: Bundle, config: BenchConfig, argv: Sequence[str] | None = None,
              log: Callable[[str], None] = print, progress: bool = True) -> BenchResult:
    """Run the benchmark described by ``config`` on ``bundle`` (see the module docstring)."""
    from tqdm import tqdm

    gamma = int(getattr(bundle.drafter, "gamma", 0)) or 16
    stop = stop_token_id(bundle) if config.stop_at_eos else None
    stops = None if stop is None else [stop]
    limit = config.max_prompt_tokens
    device = next(bundle.target.parameters()).device
    prompts = {d: [(p.id, torch.tensor([encode(bundle.tokenizer, p.text)[-limit:]], dtype=torch.int64, device=device))
                   for p in load_prompts(d, config.num_prompts, prompt_chars=config.prompt_chars)]
               for d in config.datasets}

    # Resolve budget=auto / width=auto at each temperature on calibration prompts of every dataset,
    # disjoint from the evaluation prompts: a tree, or plain AR when none is forecast to beat it.
    resolved, tuning = _tune_auto(bundle, config, log if progress else None)
    for t in tuning:
        log(f"tune T={t.temperature:g}: {t.method} -> {t.choice_text} "
            f"{t.forecast_text(config.num_prompts * len(config.datasets))}")
    compared = [m for m in config.methods if not (m.is_ar and m.label == AR)]
    decoders = {(m.label, t): None if resolved[(m.label, t)].is_ar
                else make_decoder(bundle, resolved[(m.label, t)], config.backend)
                for m in compared for t in config.temperatures}

    def verifier_of(label: str, temperature: float) -> str:
        """How ``label`` verifies at ``temperature`` (``match`` for AR: its tokens are compared, not law-tested)."""
        return (MethodSpec(AR) if label == AR else resolved[(label, temperature)]).verifier_at(temperature,
                                                                                              config.verifier)

    def run(label: str, ids: torch.Tensor, max_new: int, temperature: float,
            tuned_at: float | None = None, draw: int = 0, keyed: bool = False) -> GenerationResult:
        verifier = verifier_of(label, temperature if tuned_at is None else tuned_at) if temperature > 0 else "greedy"
        decoder = None if label == AR else decoders[(label, temperature if tuned_at is None else tuned_at)]
        if decoder is None:
            # AR (and a method resolved to it) is timed with the generator sampler, the draw a user's AR gets
            # (the keyed one hashes the whole vocabulary a token); ``keyed``: the untimed run match rows equal
            ar_sampler = "match" if keyed else DEFAULT_VERIFIER
            sampler = sampler_for(ar_sampler, config.seed, draw, ids.device) if temperature > 0 else None
            return generate_ar(bundle.target, ids, max_new, temperature, sampler, stop_token_ids=stops, **config.warps)
        sampler = sampler_for(verifier, config.seed, draw, ids.device) if temperature > 0 else None
        return decoder.generate(ids, max_new, temperature, sampler, stop_token_ids=stops,
                                verifier=None if temperature == 0 else verifier, **config.warps)

    peers: dict[float, dict] = {t: {} for t in config.temperatures}     # per temperature: label -> decoder
    for name in config.peers:
        for t in config.temperatures:
            warp = Warp(t, config.top_k, config.top_p, config.min_p) if t > 0 else None
            reason = peer_unavailable(name, bundle, warp)
            if reason is None:
                peers[t][PEER_PREFIX + name] = make_peer(name, bundle, warp=warp, seed=config.seed)
            else:
                log(f"peer {name} at T={t:g}: skipped: {reason}")

    if config.warmup:                          # first calls allocate caches and pick kernels: untimed
        first = next(iter(prompts.values()))[0][1]
        for label, tuned_at in [(AR, None), *decoders]:
            run(label, first, min(8, config.max_new_tokens), 0.0, tuned_at)
        for peer in (p for at in peers.values() for p in at.values()):
            peer(first, min(8, config.max_new_tokens))

    records: list[RunRecord] = []
    # PIT values of the tokens of sampled rows and their impossible tokens, per (method, temperature)
    pit: dict[tuple[str, float], tuple[list[float], list[int]]] = {}
    jitter = torch.Generator().manual_seed((config.seed * 1_000_003 + 12_345) % 2**64)

    def law_add(label: str, temperature: float, sequence: torch.Tensor, first: int) -> None:
        """Test ``sequence[0, first:]``: the tokens after the first new one (which the prefill drew)."""
        warp = Warp(temperature, config.top_k, config.top_p, config.min_p)
        u, bad = pit_values(bundle.target, sequence, min(first, sequence.shape[1]), warp, jitter)
        cell = pit.setdefault((label, temperature), ([], []))
        cell[0].extend(u)
        cell[1].append(bad)

    runs = len(config.temperatures) * (1 + len(compared)) + sum(map(len, peers.values()))
    total = len(config.datasets) * config.num_prompts * runs
    bar = tqdm(total=total, desc="bench", disable=not progress, file=sys.stderr)
    for dataset in config.datasets:
        for temperature in config.temperatures:
            for draw, (prompt_id, ids) in enumerate(prompts[dataset]):
                ar, seconds = timed(device, lambda: run(AR, ids, config.max_new_tokens, temperature,  # noqa: B023
                                                        draw=draw))  # noqa: B023
                ar_tokens, keyed_tokens = ar.tokens.cpu(), None
                records.append(_record(AR, dataset, temperature, prompt_id, ar, seconds, None))
                bar.update(1)
                # the methods in order on even prompts, reversed on odd ones (AR stays first, the peers last), so
                # that no compared method always runs after the same decode or at the same point of a prompt's drift
                for m in compared if draw % 2 == 0 else compared[::-1]:
                    res, seconds = timed(device, lambda: run(m.label, ids, config.max_new_tokens,  # noqa: B023
                                                             temperature, draw=draw))  # noqa: B023
                    verifier = verifier_of(m.label, temperature)
                    against = ar_tokens
                    if temperature > 0 and verifier == "match" and decoders[(m.label, temperature)] is not None:
                        if keyed_tokens is None:      # AR with the keyed sampler, untimed: what matching equals
                            keyed_tokens = run(AR, ids, config.max_new_tokens, temperature, keyed=True).tokens.cpu()
                        against = keyed_tokens
                    # rejection is lossless in law, not token for token: its tokens are not compared with AR's,
                    # they are tested against the target's law at their prefixes (untimed, after the decode)
                    records.append(_record(m.label, dataset, temperature, prompt_id, res, seconds,
                                           None if verifier in SAMPLED_VERIFIERS else against, verifier))
                    if verifier in SAMPLED_VERIFIERS:
                        law_add(m.label, temperature, res.sequence, ids.shape[1] + 1)
                    bar.set_postfix_str(f"{dataset} T={temperature:g} {m.label}", refresh=False)
                    bar.update(1)
                for label, peer in peers[temperature].items():
                    out, seconds = timed(device, lambda: peer(ids, config.max_new_tokens))  # noqa: B023
                    records.append(_peer_record(label, dataset, temperature, prompt_id, ids.shape[1], out, seconds,
                                                ar_tokens))
                    bar.update(1)
    bar.close()
    # the verifier's first token of extra one-round decodes per prompt (untimed): a law check of every round's
    # start, which a bug in the first draw of a round (or of a decode) moves most
    cells = list(pit)
    if cells and config.law_draws and progress:
        log(f"law check: {config.law_draws} one-round decodes per prompt of {len(cells)} sampled rows (untimed)")
    for label, temperature in cells:
        for dataset in config.datasets:
            for draw, (_, ids) in enumerate(prompts[dataset]):
                for extra in range(config.law_draws):
                    res = run(label, ids, 2, temperature, draw=(1 + extra) * 7919 + draw)
                    law_add(label, temperature, res.sequence, ids.shape[1] + 1)
    checks = tuple(law_check(label, t, u, sum(bad)) for (label, t), (u, bad) in pit.items())
    for c in checks:
        if progress:
            log(f"law check T={c.temperature:g} {c.method}: {c.text} (chi-square {c.statistic:.1f}, df {c.df}; "
                f"false-alarm rate {c.alpha:g})")
    summaries = summarize(records, (MethodSpec(AR, label=AR), *config.methods), config.backend, gamma, resolved, checks)
    return BenchResult(config=config, meta=run_meta(bundle, argv), records=tuple(records), summaries=summaries,
                       tuning=tuple(tuning), law_checks=checks)

