"""Acceptance of sampled trees against the proposal's warp, offline on the zoo (issue 44: tau at T>0).

The sampled builders draw a tree's tokens from a proposal ``q`` (the head's, then the drafter's, logits warped);
any ``q`` is lossless as long as the stored ``q`` is the draws'.  This script asks which ``q`` accepts most:

- ``first``: on the states of one decode driven by the run's own proposal, the exact acceptance of the root's
  first draft, ``sum_x min(p(x), q(x))`` (``p`` the target's warped distribution at the root), for every
  candidate proposal on the same states (a paired comparison, no sampling noise but the states');
- ``tau``: seeded decodes (the engine's tau, the default verifier) with each proposal, interleaved prompt by
  prompt, several seeds.

A proposal is ``T<m>`` (the run's warp with its temperature times ``m``: what the Sequoia builders'
``proposal_temperature=m`` draws from), ``T<m>p<top_p>`` (and top-p ``top_p`` on ``q``, ``p1`` none), or
``mix<m1>,<m2>,<e>`` (``(1 - e) * q(T * m1) + e * q(T * m2)``, first-node figure only).  Figures:
docs/results.md, "The proposal's own temperature at T>0"::

    taskset -c 1 .venv/bin/python benchmarks/proposal_sweep.py --temperature 1 --budget 3 --prompts 16
    taskset -c 1 .venv/bin/python benchmarks/proposal_sweep.py --temperature 0.7 --top-p 0.95 --budget 3

Prompts are the demo's calibration prompts (after its 8 evaluation prompts a dataset).
"""

from __future__ import annotations

import argparse
import statistics

import torch

from dartree.eval.bundles import encode, load_bundle
from dartree.eval.datasets import load_prompts
from dartree.eval.methods import make_decoder, parse_method
from dartree.protocols import head_method
from dartree.verifiers import Rejection, Traversal
from dartree.verify import rejection
from dartree.verify.sampling import GeneratorSampler
from dartree.verify.warp import Warp

FIRST = "T0.5,T0.6,T0.7,T0.8,T0.9,T1,T1.1,T1.2,T1.4,mix0.7,1.5,0.1,mix0.8,2,0.05,mix1,3,0.1"
TAU = "T0.7,T0.85,T1,T1.15"


def parse(spec: str, run: Warp):
    """A proposal spec -> a function of logits ``[..., V]`` to ``q`` float32 ``[..., V]``."""
    if spec.startswith("mix"):
        a, b, e = (float(x) for x in spec[3:].split(","))
        qa, qb = parse(f"T{a}", run), parse(f"T{b}", run)
        return lambda x: (1 - e) * qa(x) + e * qb(x)
    mult, _, top_p = spec[1:].partition("p")
    top_p = run.top_p if not top_p else None if float(top_p) >= 1 else float(top_p)
    warp = Warp(run.temperature * float(mult), run.top_k, top_p, run.min_p)
    return lambda x: rejection.proposal_probs(warp, x)


def specs(text: str) -> list[str]:
    """``T0.5,T1,mix0.7,1.5,0.1`` -> the specs (a mix keeps its three numbers)."""
    out: list[str] = []
    for part in text.split(","):
        if part[:1].isalpha():
            out.append(part)
        else:
            out[-1] += "," + part
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--budget", type=int, default=3)
    parser.add_argument("--method", default="corrected-sequoia")
    parser.add_argument("--prompts", type=int, default=16, help="calibration prompts a dataset (humaneval, stdlib)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first", default=FIRST, help="proposals of the first-node figure")
    parser.add_argument("--tau", default=TAU, help="proposals decoded for tau ('' for none)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    bundle = load_bundle("pystdlib-tiny")
    prompts = [torch.tensor([encode(bundle.tokenizer, p.text)[-256:]])
               for s in ("humaneval", "stdlib") for p in load_prompts(s, args.prompts, offset=8)]
    decoder = make_decoder(bundle, parse_method(args.method, {"budget": args.budget}), "fast")
    run = Warp(args.temperature, None, args.top_p, None)
    first = specs(args.first)
    proposals = {s: parse(s, run) for s in first}
    active = {"q": None, "roots": None}
    sums = {s: [] for s in first}

    draw = Rejection.draw

    def patched_draw(self, tree, block, head=None, *, head_depths=None, offset=0, root_state=None, **kwargs):
        if active["roots"] is not None and head is not None:
            state = head.initial_state(block) if root_state is None else root_state
            active["roots"].append(head_method(head, "vocab_logits")(block, offset + 1, state[:, None])[:, 0])
        if active["q"] is None:
            return draw(self, tree, block, head, head_depths=head_depths, offset=offset, root_state=root_state,
                        **kwargs)
        return rejection.sample_tree(tree, block, head, active["q"], self.generator, head_depths=head_depths,
                                     offset=offset, root_state=root_state)

    def patched(accept):
        return lambda self, drafted, scored, prefix, rows=None: patched_accept(accept, self, drafted, scored, prefix,
                                                                               rows)

    def patched_accept(accept, self, drafted, scored, prefix, rows=None):
        if active["roots"]:
            logits = active["roots"].pop()
            p = self.warp.probs(scored.logits[:, 0].double()).float()
            for s, f in proposals.items():
                sums[s].append(torch.minimum(p, f(logits)).sum(-1).mean().item())
        return accept(self, drafted, scored, prefix, rows)

    Rejection.draw = patched_draw
    Rejection.accept, Traversal.accept = patched(Rejection.accept), patched(Traversal.accept)
    warpers = {} if args.top_p is None else {"top_p": args.top_p}

    def decode(prompt, seed):
        sampler = GeneratorSampler(torch.Generator().manual_seed(seed))
        return decoder.generate(prompt, args.new_tokens, args.temperature, sampler, **warpers)

    with torch.inference_mode():
        active["roots"] = []
        for i, prompt in enumerate(prompts):
            decode(prompt, 1000 + i)
        active["roots"] = None
        print(f"# first-node acceptance, {len(sums[first[0]])} roots, T={args.temperature} top_p={args.top_p}")
        base = statistics.fmean(sums["T1"]) if "T1" in sums else None
        for s in first:
            mean = statistics.fmean(sums[s])
            print(f"{s:>18}  {mean:.4f}" + (f"  x{mean / base:.3f}" if base else ""))
        taus = specs(args.tau) if args.tau else []
        committed = {s: 0 for s in taus}
        rounds = {s: 0 for s in taus}
        per_seed = {s: [] for s in taus}
        for seed in range(args.seeds):
            c0 = dict(committed)
            r0 = dict(rounds)
            for i, prompt in enumerate(prompts):
                order = taus if (i + seed) % 2 == 0 else taus[::-1]
                for s in order:
                    active["q"] = _as_warp(s, run)
                    out = decode(prompt, 10_000 * seed + i)
                    committed[s] += sum(r.committed for r in out.rounds)
                    rounds[s] += len(out.rounds)
            for s in taus:
                per_seed[s].append((committed[s] - c0[s]) / (rounds[s] - r0[s]))
        active["q"] = None
        if taus:
            print(f"# tau, {args.method} B={args.budget}, {len(prompts)} prompts x {args.seeds} seeds")
            base = committed["T1"] / rounds["T1"] if "T1" in taus else None
            for s in taus:
                tau = committed[s] / rounds[s]
                seeds = " ".join(f"{t:.3f}" for t in per_seed[s])
                print(f"{s:>10}  tau {tau:.3f}" + (f"  x{tau / base:.3f}" if base else "") + f"  seeds: {seeds}")


def _as_warp(spec: str, run: Warp) -> Warp:
    """A temperature spec as the :class:`Warp` :func:`~dartree.verify.rejection.sample_tree` takes."""
    if spec.startswith("mix"):
        raise ValueError(f"--tau: a mix is not a Warp, got {spec!r}")
    mult, _, top_p = spec[1:].partition("p")
    top_p = run.top_p if not top_p else None if float(top_p) >= 1 else float(top_p)
    return Warp(run.temperature * float(mult), run.top_k, top_p, run.min_p)


if __name__ == "__main__":
    main()
