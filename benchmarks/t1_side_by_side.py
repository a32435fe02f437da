"""Sampled decoding side by side with AR on the zoo, prompt by prompt: tau, speed over AR, time per stage.

Every prompt is decoded by AR and then by each method in turn (one process, one device, the same load), at
the given temperature and top-p, each method with its own verifier; the speed ratio is the methods' summed
decode time (prefill excluded) against AR's over the same prompts::

    taskset -c 0 .venv/bin/python benchmarks/t1_side_by_side.py --prompts 16 \\
        --methods corrected-sequoia:budget=10 ddtree:budget=16 dartree-pruned:budget=16,verifier=match

A method is ``BUILDER[:KEY=VALUE,...]`` with the builder's config fields and ``verifier=match|rejection``
(default rejection); builders that need a head get the zoo's GRU head.  ``--device cuda`` runs it on a GPU.
"""

from __future__ import annotations

import argparse
import time

import torch

from dartree import SpeculativeDecoder, generate_ar, make_builder
from dartree.eval.bundles import encode, load_bundle
from dartree.eval.datasets import load_prompts
from dartree.eval.methods import parse_method
from dartree.models.target import HFTarget
from dartree.verify.sampling import GeneratorSampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", nargs="+", default=["corrected-sequoia:budget=10", "ddtree:budget=16"])
    parser.add_argument("--prompts", type=int, default=8, help="prompts per set (HumanEval, stdlib)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    bundle = load_bundle("pystdlib-tiny").to(torch.device(args.device))
    target = HFTarget(bundle.target, layer_ids=tuple(bundle.drafter.target_layer_ids))
    prompts = [torch.tensor(encode(bundle.tokenizer, p.text)[-256:], device=args.device)
               for name in ("humaneval", "stdlib") for p in load_prompts(name, args.prompts)]
    warp = {"top_p": args.top_p} if args.top_p is not None else {}
    decoders = []
    for text in args.methods:
        method = parse_method(text)
        builder = make_builder(method.builder, backend="fast", **method.config)
        head = bundle.heads[method.head] if builder.needs_head else None
        decoder = SpeculativeDecoder(target, bundle.drafter, builder, head)
        decoders.append((text, decoder, method.verifier or "rejection"))
    generator = torch.Generator(device=args.device).manual_seed(args.seed)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    ar_tokens, ar_seconds = 0, 0.0
    totals = {text: [0, 0, 0.0, {}] for text, _, _ in decoders}          # tokens, rounds, seconds, stages
    for prompt in prompts:
        sync()
        start = time.perf_counter()
        out = generate_ar(target, prompt, args.new_tokens, temperature=args.temperature,
                          sampler=GeneratorSampler(generator), **warp)
        sync()
        ar_seconds += time.perf_counter() - start - out.prefill_s
        ar_tokens += out.tokens.shape[1]
        for text, decoder, verifier in decoders:
            sync()
            start = time.perf_counter()
            out = decoder.generate(prompt, args.new_tokens, temperature=args.temperature,
                                   sampler=GeneratorSampler(generator), verifier=verifier, **warp)
            sync()
            row = totals[text]
            row[0] += out.tokens.shape[1] - 1                  # the first token comes from the prefill
            row[1] += len(out.rounds)
            row[2] += time.perf_counter() - start - out.prefill_s
            for stage, seconds in out.stage_breakdown().items():
                row[3][stage] = row[3].get(stage, 0.0) + seconds
    ar_rate = ar_tokens / ar_seconds
    print(f"{args.device}, T={args.temperature}" + (f", top-p {args.top_p}" if args.top_p else "")
          + f", {len(prompts)} prompts x {args.new_tokens} tokens; AR {1e3 / ar_rate:.2f} ms/token")
    print(f"{'method':44s} {'verifier':9s} {'tau':>5s} {'x AR':>6s} {'ms/round':>8s}  stages (ms/round)")
    for text, _, verifier in decoders:
        tokens, rounds, seconds, stages = totals[text]
        parts = " ".join(f"{k}={v / rounds * 1e3:.2f}" for k, v in stages.items() if k not in ("prefill", "context"))
        print(f"{text:44s} {verifier:9s} {tokens / rounds:5.2f} {tokens / seconds / ar_rate:6.3f} "
              f"{seconds / rounds * 1e3:8.2f}  {parts}")


if __name__ == "__main__":
    main()
