"""Whole decodes of several variants of dartree side by side, interleaved prompt by prompt.

A variant is a source tree (its ``dartree/`` importable from PATH, with its own built ``_native``
module), optionally with environment settings and host loops turned off.  Each variant runs in its
own worker process (so two checkouts never share a module), every worker on the same pinned core;
the driver asks them in turn, one decode at a time, alternating the order every repetition, and checks
that every variant's tokens are equal (at T=0 also equal to AR's)::

    cp -r <other checkout> /tmp/base && (cd /tmp/base && python setup.py build_ext --inplace)
    taskset -c 0 .venv/bin/python benchmarks/side_by_side.py --variant main=/tmp/base --variant new=. \\
        [--methods chain,ddtree,...] [--prompts 4] [--reps 5]
    taskset -c 0 .venv/bin/python benchmarks/side_by_side.py --variant c=. --variant tensor=.:DARTREE_NATIVE=0

``off=MODULE+MODULE`` makes ``dartree.native`` report the compiled loops as absent inside those modules only
(``fast.ops``: CPU builds take the tensorized builders).  Methods are ``dartree bench``'s
(``NAME[:KEY=VALUE,...]``, budget 16 unless set; ``@T1`` samples at temperature 1 with a ``KeyedSampler``,
``@S1`` at temperature 1 with a ``GeneratorSampler`` seeded afresh for every decode: the default verifier,
traversal, on sampled trees; equal tokens across variants then mean the same draws; ``@S0.7p0.95``: at temperature
0.7 with top-p 0.95, the same sampler; ``p`` works after ``@T`` too).
Reported per method and variant: tokens/s and the median over prompts of the median paired time ratio
against the first variant (first / this: above 1, this variant is faster), then each speculative
method's time per round by stage (ms, summed over the timed decodes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

DEFAULT_METHODS = "ar,chain,ddtree,corrected-chain,dartree-fixed,dartree-pruned,corrected-sequoia@T1"
SETS = ("humaneval", "stdlib", "packages")


def worker(methods: list[str], prompts_per_set: int, new_tokens: int, off: list[str]) -> None:
    """Serve decodes on stdin/stdout: a line ``method_index prompt_index`` in, one JSON line out."""
    import importlib
    import types

    import torch

    from dartree import native
    from dartree.eval.bundles import encode, load_bundle
    from dartree.eval.datasets import load_prompts
    from dartree.eval.methods import make_decoder, parse_method
    from dartree.verify.sampling import GeneratorSampler, KeyedSampler

    def sampler(keyed: bool):
        return KeyedSampler(7) if keyed else GeneratorSampler(torch.Generator().manual_seed(7))

    torch.set_num_threads(1)
    for name in off:                       # those modules run their numpy loops
        module = importlib.import_module(f"dartree.{name}")
        module.native = types.SimpleNamespace(lib=lambda: None, enabled=lambda: False)
    bundle = load_bundle("pystdlib-tiny")
    prompts = [torch.tensor([encode(bundle.tokenizer, p.text)[-256:]])
               for s in SETS for p in load_prompts(s, prompts_per_set)]
    runs = []
    for text in methods:
        keyed = "@S" not in text
        spec, _, temp = text.partition("@T" if keyed else "@S")
        temp, _, top_p = temp.partition("p")
        temperature, warpers = float(temp or 0), {"top_p": float(top_p)} if top_p else {}
        method = parse_method(spec, {"budget": 16})
        if method.is_ar:
            from dartree import generate_ar
            from dartree.models.target import HFTarget

            target = HFTarget(bundle.target, layer_ids=tuple(bundle.drafter.target_layer_ids))
            runs.append(lambda p, g=target, t=temperature, k=keyed, w=warpers: generate_ar(g, p, new_tokens, t,
                                                                                          sampler(k), **w))
        else:
            decoder = make_decoder(bundle, method, "fast")
            runs.append(lambda p, d=decoder, t=temperature, k=keyed, w=warpers: d.generate(p, new_tokens, t, sampler(k),
                                                                                           **w))
    loops = "off" if not native.enabled() else f"on except in {'+'.join(off)}" if off else "on"
    print(json.dumps({"ready": len(prompts), "loops": loops}), flush=True)
    with torch.inference_mode():
        for line in sys.stdin:
            m, i = map(int, line.split())
            start = time.perf_counter()
            out = runs[m](prompts[i])
            seconds = time.perf_counter() - start
            print(json.dumps({"seconds": seconds, "tokens": out.tokens.reshape(-1).tolist(),
                              "rounds": len(out.rounds), "stages": out.stage_breakdown()}), flush=True)


def start(spec: str, argv: list[str]) -> tuple[str, subprocess.Popen]:
    """``NAME=PATH[:KEY=VALUE...]`` -> (name, its worker process)."""
    name, _, rest = spec.partition("=")
    path, *settings = rest.split(":")
    env = dict(os.environ, PYTHONPATH=os.path.abspath(path))
    off = []
    for setting in settings:
        key, _, value = setting.partition("=")
        if key == "off":
            off = value.split("+")
        else:
            env[key] = value
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--off", ",".join(off), *argv]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                            cwd="/tmp")          # not the source tree: PYTHONPATH decides which dartree
    return name, proc


def ask(proc: subprocess.Popen, m: int, i: int) -> dict:
    proc.stdin.write(f"{m} {i}\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", action="append", default=[], help="NAME=PATH[:KEY=VALUE...] (twice or more)")
    parser.add_argument("--methods", default=DEFAULT_METHODS, help="comma-separated, or ;-separated")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per set (HumanEval, stdlib, packages)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--off", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    # methods are separated by ";" where one has a config of several fields (``chain:budget=4,topk=2;ar``)
    methods = args.methods.split(";" if ";" in args.methods else ",")
    common = ["--methods", args.methods, "--prompts", str(args.prompts), "--new-tokens", str(args.new_tokens)]
    if args.worker:
        worker(methods, args.prompts, args.new_tokens, [m for m in args.off.split(",") if m])
        return
    if len(args.variant) < 2:
        parser.error("--variant: give at least two")
    workers = dict(start(spec, common) for spec in args.variant)
    names = list(workers)
    info = {n: json.loads(p.stdout.readline()) for n, p in workers.items()}
    count = info[names[0]]["ready"]
    times = {(m, n, i): [] for m in range(len(methods)) for n in names for i in range(count)}
    stages = {(m, n): {} for m in range(len(methods)) for n in names}     # stage -> seconds, and "rounds"

    ar: dict[int, list[int]] = {}                 # AR's tokens per prompt (when "ar" is the first method)
    for rep in range(args.reps + 1):              # repetition 0 warms up and checks the outputs
        order = names if rep % 2 else names[::-1]
        for i in range(count):
            for m, method in enumerate(methods):
                outs = {n: ask(workers[n], m, i) for n in order}
                if len({json.dumps(o["tokens"]) for o in outs.values()}) != 1:
                    raise SystemExit(f"{method}: prompt {i}: the variants' outputs differ")
                if m == 0 and method == "ar":
                    ar[i] = outs[names[0]]["tokens"]
                elif "@" not in method and i in ar and outs[names[0]]["tokens"] != ar[i]:
                    raise SystemExit(f"{method}: prompt {i}: differs from AR")
                if rep:
                    for n in names:
                        times[(m, n, i)].append(outs[n]["seconds"])
                        row = stages[(m, n)]
                        row["rounds"] = row.get("rounds", 0) + outs[n]["rounds"]
                        for k, v in outs[n]["stages"].items():
                            row[k] = row.get(k, 0.0) + v
    for p in workers.values():
        p.stdin.close()
        p.wait()
    base = names[0]
    print(f"{count} prompts x {args.new_tokens} tokens, {args.reps} interleaved repetitions, one thread; "
          f"ratio = median over prompts of the median paired time {base} / variant; "
          + ", ".join(f"{n}: compiled loops {info[n]['loops']}" for n in names))
    print(f"{'method':<28}" + "".join(f"{n + ' tok/s':>16}" for n in names)
          + "".join(f"{base + '/' + n:>16}" for n in names[1:]))
    for m, method in enumerate(methods):
        rates = [args.new_tokens * count * args.reps / sum(sum(times[(m, n, i)]) for i in range(count))
                 for n in names]
        ratios = [statistics.median(statistics.median(b / x for b, x in zip(times[(m, base, i)], times[(m, n, i)],
                                                                          strict=True)) for i in range(count))
                  for n in names[1:]]
        print(f"{method:<28}" + "".join(f"{r:>16.1f}" for r in rates) + "".join(f"{r:>16.3f}" for r in ratios))
    print("ms per round by stage (prefill excluded; outside = all but target)")
    for m, method in enumerate(methods):
        for n in names:
            row = dict(stages[(m, n)])
            rounds = row.pop("rounds", 0)
            row.pop("prefill", None)
            if not rounds or "draft" not in row:
                continue
            outside = sum(v for k, v in row.items() if k != "target")
            print(f"{method:<28} {n:<8} " + " ".join(f"{k}={v / rounds * 1e3:.3f}" for k, v in row.items())
                  + f"  outside={outside / rounds * 1e3:.3f}  rounds={rounds}")


if __name__ == "__main__":
    main()
