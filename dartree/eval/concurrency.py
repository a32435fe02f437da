"""Serving benchmark: aggregate throughput with C requests in flight against batched AR (the paper's Table 4
setting; docs/internals.md, "The benchmark harness")."""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

import torch

from dartree.eval.bench import BenchConfig
from dartree.eval.bundles import Bundle, encode, stop_token_id
from dartree.eval.costmodel import VerifyCost, pick_best, score_at_concurrency
from dartree.eval.datasets import load_prompts
from dartree.eval.methods import AR, MethodSpec, make_decoder, resolve_backend, sampler_for
from dartree.eval.probes import probe_verify_cost, replay_settings
from dartree.eval.report import markdown_table
from dartree.eval.simulate import reference
from dartree.models.target import HFTarget
from dartree.rounds import DEFAULT_VERIFIER, SAMPLED_VERIFIERS
from dartree.serve import ServeResult, serve

__all__ = ["ConcurrencyRow", "check_methods", "run_concurrency", "concurrency_markdown"]


@dataclass(frozen=True)
class ConcurrencyRow:
    """One method served at one concurrency."""

    method: str
    backend: str
    concurrency: int
    prompts: int
    tokens: int
    seconds: float
    tokens_per_s: float
    speedup: float                 # over batched AR at the same concurrency
    tau: float                     # committed tokens per row-round
    steps: int                     # batched rounds
    lossless_prompts: int
    settings: str = ""             # the settings chosen for an 'auto' method at this C
    verifier: str = "greedy"       # greedy (T=0), match, rejection, traversal (sampled: not compared), '-' (AR)

    @property
    def token_checked(self) -> bool:
        """Whether the row's tokens are compared with AR's (greedy and match; sampled trees have the law only)."""
        return self.verifier not in SAMPLED_VERIFIERS


def check_methods(methods: Sequence[MethodSpec]) -> None:
    """``ValueError`` for a method that asks for ``beta=auto`` or for the method ``auto``: the concurrency tuner
    searches budget and width per level, not beta nor the builder."""
    for m in methods:
        if m.is_auto:
            raise ValueError(f"method: {m.label!r} is not searched per concurrency level (the concurrency tuner "
                             "searches one builder's budget and width); name a builder, e.g. "
                             "dartree-pruned:budget=auto")
        if "beta" in m.auto_fields:
            raise ValueError(f"beta: 'auto' is not searched per concurrency level ({m.label!r}); give a number "
                             f"(`dartree tune --method {m.builder}:beta=auto` tunes it for single requests)")


@torch.no_grad()
def run_concurrency(bundle: Bundle, config: BenchConfig, levels: Sequence[int], progress: bool = True,
                    log: Callable[[str], None] = print) -> list[ConcurrencyRow]:
    """Serve ``config.num_prompts`` prompts of its first dataset at its first temperature at every concurrency
    in ``levels``; ``auto`` settings are tuned per level on the ``max(levels)`` prompts after those."""
    from tqdm import tqdm

    if not levels or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in levels):
        raise ValueError(f"concurrency: expected integers >= 1, got {list(levels)}")
    check_methods(config.methods)
    dataset, temperature, seed, backend = config.datasets[0], config.temperatures[0], config.seed, config.backend
    max_new_tokens, tune_budgets, verifier = config.max_new_tokens, config.tune_budgets, config.verifier
    device = next(bundle.target.parameters()).device

    def encoded(offset: int, count: int) -> list[torch.Tensor]:
        return [torch.tensor(encode(bundle.tokenizer, p.text)[-config.max_prompt_tokens:], dtype=torch.int64,
                             device=device)
                for p in load_prompts(dataset, count, offset=offset, prompt_chars=config.prompt_chars)]

    prompts = encoded(0, config.num_prompts)
    stop = stop_token_id(bundle) if config.stop_at_eos else None
    timed = [m for m in config.methods if not m.is_ar]
    fixed = [m for m in timed if not m.auto_fields]
    decoders = {m.label: make_decoder(bundle, m, backend) for m in fixed}
    calibration = encoded(config.num_prompts, max(levels)) if len(fixed) < len(timed) else []
    calibration_new = min(32, max_new_tokens)
    replays: dict[str, dict] = {}            # per method: single-request replays of every candidate (any C)
    verify_costs: dict[int, VerifyCost] = {}
    warps = config.warps if temperature > 0 else {}

    def verifier_of(spec: MethodSpec | None) -> str | None:
        """The acceptance rule of ``spec`` (``None``: AR, and every method at T=0)."""
        return None if temperature == 0 or spec is None else spec.verifier_at(temperature, verifier)

    def run(engine, spec: MethodSpec | None, ps: Sequence[torch.Tensor], c: int, max_new: int,
            on_finish=None, keyed: bool = False) -> ServeResult:
        rule = verifier_of(spec)
        # AR is timed with the generator sampler, the draw a user's AR gets (the keyed one hashes the whole
        # vocabulary a token); ``keyed``: the untimed AR serve that match rows equal token for token
        drawn = rule if spec is not None else "match" if keyed else DEFAULT_VERIFIER
        sampler = sampler_for(drawn, seed) if temperature > 0 else None
        return serve(engine, ps, c, max_new, temperature, sampler, None if stop is None else [stop], on_finish,
                     verifier=rule, **warps)

    def candidates(m: MethodSpec) -> list[MethodSpec]:
        # an unset budget or width is searched with the 'auto' ones, as the single-request tuner does
        grids = {k: v for k, v in (("budget", tune_budgets), ("width", config.tune_widths)) if k in m.searched}
        return [m.with_settings(**dict(zip(grids, values, strict=True))) for values in product(*grids.values())]

    def tuned(m: MethodSpec, c: int) -> MethodSpec:
        """The candidate setting of ``m`` with the best modelled throughput at concurrency ``c``
        (:func:`dartree.eval.tune.score_at_concurrency`)."""
        cands = candidates(m)
        if m.label not in replays:       # tau and tree sizes: per-request, measured once for every C
            refs = [reference(bundle, x.tolist(), calibration_new, temperature, seed) for x in calibration]
            stats = replay_settings(bundle, cands, refs, backend)
            replays[m.label] = {(x.config["budget"], x.config.get("width")): s
                                for x, s in zip(cands, stats, strict=True)}
        if c not in verify_costs:        # the batched target forward over c trees of n nodes
            greedy_cpu = temperature == 0 and HFTarget(bundle.target).scores_rows_apart
            prefix = int(sum(x.shape[0] for x in calibration) / len(calibration)) + calibration_new // 2
            verify_costs[c] = probe_verify_cost(bundle, prefix, max(tune_budgets), repeats=3, rows=c,
                                                logits="root" if greedy_cpu else "all")
        # the batch's drafter forward and commit: one short batched run of the smallest candidate
        probe = min(cands, key=lambda x: (x.config["budget"], x.config.get("width") or 0))
        served = run(make_decoder(bundle, probe, backend), probe, calibration[:c], c, calibration_new)
        rounds = [r for res in served.results for r in res.rounds]
        draft_s = statistics.median(r.draft_s for r in rounds)
        commit_s = statistics.median(r.commit_s for r in rounds)   # mask_s is inside the verify probe
        # batched heads make building c trees cheaper than c single builds: scale by the probe's ratio
        single = replays[m.label][(probe.config["budget"], probe.config.get("width"))].build_s
        scale = statistics.median(r.build_s for r in rounds) / single if single > 0 else float(c)
        scored = score_at_concurrency(replays[m.label], verify_costs[c], c, draft_s, commit_s, max(scale, 1e-3))
        best = pick_best(scored)
        choice = next(x for x in cands if x.config["budget"] == best.budget and x.config.get("width") == best.width)
        log(f"tune C={c}: {m.label} -> {choice.config} (modelled {best.tokens_per_s:.1f} tok/s: tau {best.tau:.2f}, "
            f"round {best.round_s * 1e3:.1f} ms of which verify {best.verify_s * 1e3:.1f} ms)")
        return choice

    if config.warmup:          # first calls allocate caches and pick kernels: untimed
        for spec, engine in ((None, bundle.target), *((m, decoders[m.label]) for m in fixed)):
            run(engine, spec, prompts[:2], 2, min(8, max_new_tokens))
    rows: list[ConcurrencyRow] = []
    bar = tqdm(total=len(levels) * (1 + len(timed)) * len(prompts), desc="serve", disable=not progress,
               file=sys.stderr)
    for c in levels:
        ar = keyed_ar = None
        for spec in (None, *timed):
            label = AR if spec is None else spec.label
            chosen = ""
            if spec is None:
                engine = bundle.target
            elif spec.auto_fields:
                best = tuned(spec, c)
                chosen = ",".join(f"{k}={v}" for k, v in sorted(best.config.items()) if k in spec.searched)
                engine = make_decoder(bundle, best, backend)
                if config.warmup:     # as every fixed decoder was: first calls allocate buffers, untimed
                    run(engine, spec, prompts[:2], 2, min(8, max_new_tokens))
            else:
                engine = decoders[label]
            bar.set_postfix_str(f"C={c} {label}", refresh=False)
            out = run(engine, spec, prompts, c, max_new_tokens, on_finish=lambda _i, _r: bar.update(1))
            ar = ar or out
            rule = verifier_of(spec)
            against = ar
            if rule == "match":          # AR with the keyed sampler, untimed: what matching equals
                keyed_ar = keyed_ar or run(bundle.target, None, prompts, c, max_new_tokens, keyed=True)
                against = keyed_ar
            same = sum(a.tokens.tolist() == b.tokens.tolist()
                       for a, b in zip(against.results, out.results, strict=True))
            rounds = sum(r.num_rounds for r in out.results)
            rows.append(ConcurrencyRow(
                method=label, backend="-" if spec is None else resolve_backend(spec.builder, backend),
                concurrency=c, prompts=len(prompts), tokens=out.tokens, seconds=out.seconds,
                tokens_per_s=out.tokens_per_s, speedup=out.tokens_per_s / ar.tokens_per_s,
                tau=out.tokens / max(1, rounds), steps=out.steps, lossless_prompts=same, settings=chosen,
                verifier=rule or ("greedy" if temperature == 0 else "-")))
    bar.close()
    return rows


def concurrency_markdown(rows: Sequence[ConcurrencyRow], meta: dict[str, Any] | None = None) -> str:
    """Speedup over batched AR per method (rows) and concurrency (columns), then the raw figures."""
    levels = sorted({r.concurrency for r in rows})
    cell = {(r.method, r.concurrency): r for r in rows}
    speedups = [[m, *(f"{cell[m, c].speedup:.2f}x" if (m, c) in cell else "-" for c in levels)]
                for m in dict.fromkeys(r.method for r in rows)]
    raw = [[r.method, r.concurrency, f"{r.tokens_per_s:.1f}", f"{r.speedup:.2f}x", f"{r.tau:.2f}", r.steps,
            f"{r.lossless_prompts}/{r.prompts}" if r.token_checked else "law (rejection)", r.settings or "-"]
           for r in rows]
    head = [" ".join(f"{k}: {v}" for k, v in meta.items()), ""] if meta else []
    return "\n".join([*head, markdown_table(["method", *(f"C={c}" for c in levels)], speedups), "",
                      markdown_table(["method", "C", "tokens/s", "speedup", "tau", "steps", "lossless", "auto chose"],
                                     raw)]) + "\n"

