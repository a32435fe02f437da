"""Traversal Verification against recursive rejection on the zoo's own sampled trees, paired and exact.

Each method decodes the prompts at T=1 (one verifier drives the decode, ``--drive``); at every round the
expected accepted length of the *same* sampled tree and target logits is computed exactly under both verifiers
(the only randomness left is the verifier's coins: a recursion over the tree, no sampling), so the tau gain
is measured without the noise of two independent decodes::

    taskset -c 0 .venv/bin/python benchmarks/traversal_gain_zoo.py --prompts 8 --new-tokens 128 \\
        --methods corrected-sequoia:budget=4 corrected-sequoia:budget=16 dartree-pruned:budget=16

Prints per method: rounds, exact tau (1 + expected accepted drafts) under each verifier, their ratio with a
paired standard error, and the decode's own realised tau.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch

import dartree.engine as engine_module
from dartree import SpeculativeDecoder, make_builder
from dartree.eval.bundles import encode, load_bundle
from dartree.eval.datasets import load_prompts
from dartree.eval.methods import parse_method
from dartree.models.target import HFTarget
from dartree.verify import rejection
from dartree.verify.sampling import GeneratorSampler
from dartree.verify.traversal import after_deletion, child_weight, children_of


def expected_traversal(children, tokens, target, proposal) -> float:
    """Exact expected accepted drafts of Traversal Verification on one tree (its walk, every coin averaged)."""

    def visit(u: int, w: float) -> tuple[float, float]:
        """P(a path in u's subtree is accepted), E[drafts below u; accepted]."""
        if w <= 0:
            return 0.0, 0.0
        accepted = below = 0.0
        reach = 1.0
        if children[u]:
            r, s = target(u), proposal(u)
            for c in children[u]:
                a, m = visit(c, child_weight(w, r, s, tokens[c]))
                accepted += reach * a
                below += reach * (m + a)
                reach *= 1.0 - a
                w, r, s = after_deletion(w, r, s, tokens[c])
        accepted += reach * (1.0 if u == 0 else w)
        return accepted, below

    total, below = visit(0, 1.0)
    assert abs(total - 1.0) < 1e-9, total           # the root's path is always accepted
    return below


def expected_rejection(children, tokens, target, proposal) -> float:
    """Exact expected accepted drafts of recursive rejection (verify_rejection) on one tree."""

    def visit(u: int) -> float:
        if not children[u]:
            return 0.0
        r, s = target(u), proposal(u)
        reach, out = 1.0, 0.0
        for c in children[u]:
            a, r_next, s_next = rejection.accept_step(r, s, tokens[c])
            if a > 0:
                out += reach * a * (1.0 + visit(c))
            reach *= 1.0 - a
            r, s = r_next, s_next
        return out

    return visit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", nargs="+", default=["corrected-sequoia:budget=4", "corrected-sequoia:budget=16",
                                                         "dartree-pruned:budget=16"])
    parser.add_argument("--prompts", type=int, default=8, help="prompts per set (HumanEval, stdlib)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--drive", choices=("rejection", "traversal"), default="rejection")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    bundle = load_bundle("pystdlib-tiny")
    target = HFTarget(bundle.target, layer_ids=tuple(bundle.drafter.target_layer_ids))
    prompts = [torch.tensor(encode(bundle.tokenizer, p.text)[-256:])
               for name in ("humaneval", "stdlib") for p in load_prompts(name, args.prompts)]
    pairs: list[tuple[float, float]] = []
    driver = {"rejection": engine_module.verify_rejection, "traversal": engine_module.verify_traversal}[args.drive]

    def spy(sampled, logits, warp, generator):
        tree = sampled.tree
        kids, tokens, vocab = children_of(tree)[0], tree.tokens[0].tolist(), logits.shape[-1]
        cache: dict[int, np.ndarray] = {}

        def p_at(u: int) -> np.ndarray:
            if u not in cache:
                cache[u] = warp.logits(logits[0, u]).double().softmax(-1).numpy()
            return cache[u]

        def q_at(u: int) -> np.ndarray:
            return rejection.proposal_row(*sampled.host_proposals(), 0, int(sampled.row_of[0, u]), vocab)

        pairs.append((expected_rejection(kids, tokens, p_at, q_at), expected_traversal(kids, tokens, p_at, q_at)))
        return driver(sampled, logits, warp, generator)

    setattr(engine_module, f"verify_{args.drive}", spy)
    print(f"T=1, {len(prompts)} prompts x {args.new_tokens} tokens, decoded with {args.drive}; exact tau per round "
          f"(1 + expected accepted drafts) of the same sampled trees under each verifier")
    print(f"{'method':32s} {'rounds':>6s} {'tau rejection':>13s} {'tau traversal':>13s} {'gain':>8s} {'+- se':>7s}"
          f" {'realised tau':>12s}")
    for text in args.methods:
        method = parse_method(text)
        builder = make_builder(method.builder, backend="fast", **method.config)
        head = bundle.heads[method.head] if builder.needs_head else None
        decoder = SpeculativeDecoder(target, bundle.drafter, builder, head)
        generator = torch.Generator().manual_seed(args.seed)
        pairs.clear()
        tokens = rounds = 0
        for prompt in prompts:
            out = decoder.generate(prompt, args.new_tokens, temperature=1.0, sampler=GeneratorSampler(generator),
                                   verifier=args.drive)
            tokens += out.tokens.shape[1] - 1                       # the first token comes from the prefill
            rounds += len(out.rounds)
        rrs, tv = (1.0 + np.array(x) for x in zip(*pairs, strict=True))
        gain = tv.mean() / rrs.mean() - 1.0
        se = (tv - rrs).std(ddof=1) / math.sqrt(len(tv)) / rrs.mean()       # paired: the difference's error
        print(f"{text:32s} {len(tv):6d} {rrs.mean():13.3f} {tv.mean():13.3f} {100 * gain:+7.2f}% {100 * se:6.2f}%"
              f" {tokens / rounds:12.3f}")


if __name__ == "__main__":
    main()
