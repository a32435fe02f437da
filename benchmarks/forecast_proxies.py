"""Can a prompt tell in advance how well it will be drafted?  Correlations of per-prompt tau with cheap proxies.

The tuner's forecast misses a run on 8 prompts by up to ~25% because tau per prompt ranges 2-13 on the
zoo (``benchmarks/prompt_spread.py``).  A forecast conditioned on the run's own prompts could remove
that spread if something computable from a prompt alone, before decoding it, tracked its tau.  This
script measures that on the bundled zoo, per prompt (``dartree-pruned``, T=0, greedy references):

* ``tau``: the decode's tau over ``--new-tokens`` tokens (replayed against the AR reference,
  :func:`dartree.eval.simulate.simulate`: the rounds real decoding makes);
* ``prompt tau`` (prompt only): the same drafter, head and builder replayed over the prompt's own
  last ``--tail`` tokens, the prompt text standing in for the continuation;
* ``target acc`` (prompt only): the target's teacher-forced top-1 accuracy on those tokens (one
  prefill);
* ``first tau`` (not prompt only, for comparison): tau over the first ``--first`` new tokens.

and prints the Pearson correlation of each with ``tau`` per dataset.  Then, for the split ``dartree
bench`` makes (evaluation = the first ``--eval`` prompts, calibration = the ``n`` after them, for each
``n`` of ``--calibration``), the forecast error a perfect cost model would make: tokens/s at a fixed cost
per round is tokens over rounds, so the error is the evaluation prompts' rounds per prompt over the
calibration prompts' minus one.  One thread::

    taskset -c 0 .venv/bin/python benchmarks/forecast_proxies.py [--prompts 48] [--tail 64] [--first 16]
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch

from dartree import make_builder
from dartree.eval.bundles import encode, load_bundle
from dartree.eval.datasets import count_prompts, load_prompts
from dartree.eval.simulate import Reference, reference, simulate
from dartree.models.target import HFTarget


def pearson(x: list[float], y: list[float]) -> float:
    mx, my = statistics.fmean(x), statistics.fmean(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    sx = math.sqrt(sum((a - mx) ** 2 for a in x))
    sy = math.sqrt(sum((b - my) ** 2 for b in y))
    return sxy / (sx * sy) if sx > 0 and sy > 0 else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=48, help="prompts per dataset (fewer if it has fewer)")
    parser.add_argument("--datasets", nargs="+", default=["humaneval", "stdlib"])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--tail", type=int, default=64, help="prompt tokens the prompt-only proxies read")
    parser.add_argument("--first", type=int, default=16, help="new tokens of the 'first tau' column")
    parser.add_argument("--eval", type=int, default=8, help="evaluation prompts of the split")
    parser.add_argument("--calibration", type=int, nargs="*", default=[8, 16, 24],
                        help="calibration prompt counts of the split")
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--beta", type=float, default=-0.2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    bundle = load_bundle("pystdlib-tiny")
    head = bundle.heads["gru"]
    builder = make_builder("dartree-pruned", backend="fast", budget=args.budget, width=args.width,
                           beta=args.beta)
    target = HFTarget(bundle.target, layer_ids=tuple(bundle.drafter.target_layer_ids))
    names = ("tau", "prompt tau", "target acc", "first tau")
    print(f"dartree-pruned B={args.budget} W={args.width} beta={args.beta:g}, T=0, {args.new_tokens} new tokens; "
          f"proxies over the prompt's last {args.tail} tokens; first tau over {args.first} new tokens")
    for name in args.datasets:
        rows, rounds = [], []
        for prompt in load_prompts(name, min(args.prompts, count_prompts(name))):
            ids = encode(bundle.tokenizer, prompt.text)
            decode = simulate(bundle, builder, head, reference(bundle, ids, args.new_tokens))
            first = simulate(bundle, builder, head, reference(bundle, ids, args.first)).tau
            seq = torch.tensor([ids])
            out = target.prefill(seq)
            target.reset()
            tail = min(args.tail, len(ids) - 2)
            acc = float((out.logits[0, -tail - 1:-1].argmax(-1) == seq[0, -tail:]).float().mean())
            own = Reference(sequence=seq, hidden=out.hidden, prompt_len=len(ids) - tail, ar_seconds=0.0)
            rows.append((decode.tau, simulate(bundle, builder, head, own).tau, acc, first))
            rounds.append(len(decode.rounds))
        columns = list(zip(*rows, strict=True))
        print(f"\n{name}: {len(rows)} prompts; tau {min(columns[0]):.2f}-{max(columns[0]):.2f}, mean "
              f"{statistics.fmean(columns[0]):.2f}")
        for label, column in zip(names[1:], columns[1:], strict=True):
            print(f"  corr(tau, {label:10s}) = {pearson(list(columns[0]), list(column)):+.2f}   "
                  f"(range {min(column):.2f}-{max(column):.2f})")
        evaluation = statistics.fmean(rounds[:args.eval])
        for n in args.calibration:
            calibration = rounds[args.eval: args.eval + n]
            if len(calibration) < n:
                print(f"  {args.eval} + {n}: the dataset has {len(rounds)} prompts")
                continue
            mean = statistics.fmean(calibration)
            print(f"  {args.eval} evaluation + {n} calibration prompts: rounds per prompt {evaluation:.2f} / "
                  f"{mean:.2f}, forecast error {evaluation / mean - 1:+.1%}")


if __name__ == "__main__":
    main()
