"""dartree's decoding loops against the peers' own, on the same zoo models and prompts (T=0).

Groups (provider axis):

* ``loop ar``: HF ``generate`` (greedy) vs :func:`dartree.generate_ar`;
* ``loop speculative``: z-lab's released ``dflash_generate`` (the zoo drafter exported with
  ``save_drafter`` and loaded by ``dflash.DFlashDraftModel``), HF prompt lookup
  (``generate(prompt_lookup_num_tokens=5)``), and dartree's ``chain``, ``ddtree`` (B=16) and
  ``dartree-pruned`` (B=16, W=12, GRU head).

Each benchmark decodes the same prompts and asserts that its tokens equal dartree's AR output,
so a provider that is fast because it decodes something else fails.  ``dflash`` is an optional
extra (``pip install --no-deps dflash==0.1.0``); without it that provider is skipped and says
why.  By default two prompts x 32 tokens (seconds, for the CI run under ``--benchmark-disable``);
``DARTREE_BENCH=full``: six prompts (HumanEval, stdlib, held-out packages) x 64 tokens.  The
side-by-side table of ``dartree bench --peers`` is the one docs/results.md quotes.
"""

from __future__ import annotations

import functools

import pytest
import torch

from benchmarks.common import FULL, run

NEW_TOKENS = 64 if FULL else 32
PROMPTS_PER_SET = 2 if FULL else 1
SETS = ("humaneval", "stdlib", "packages") if FULL else ("humaneval", "stdlib")


@functools.cache
def zoo():
    from dartree.eval.bundles import encode, load_bundle
    from dartree.eval.datasets import load_prompts
    from dartree.models import zoo as zoo_models

    if "pystdlib-tiny" not in zoo_models.available():
        pytest.skip("the bundled zoo weights are not installed")
    bundle = load_bundle("pystdlib-tiny")
    prompts = [torch.tensor([encode(bundle.tokenizer, p.text)[-256:]])
               for name in SETS for p in load_prompts(name, PROMPTS_PER_SET)]
    return bundle, prompts


@functools.cache
def references() -> list[torch.Tensor]:
    from dartree import generate_ar

    bundle, prompts = zoo()
    return [generate_ar(bundle.target, p, NEW_TOKENS).tokens for p in prompts]


def decoder(provider: str):
    from dartree import SpeculativeDecoder, generate_ar, make_builder
    from dartree.eval.peers import make_peer, peer_unavailable

    bundle, _ = zoo()
    peers = {"hf-generate": "hf-generate", "dflash": "dflash", "hf-prompt-lookup": "hf-prompt-lookup"}
    if provider in peers:
        reason = peer_unavailable(peers[provider], bundle)
        if reason is not None:
            pytest.skip(f"{provider}: {reason}")
        peer = make_peer(peers[provider], bundle)
        return lambda ids, n: peer(ids, n).tokens
    if provider == "dartree-ar":
        return lambda ids, n: generate_ar(bundle.target, ids, n).tokens
    name, settings, head = {
        "dartree-chain": ("chain", {}, None),
        "dartree-ddtree": ("ddtree", {"budget": 16}, None),
        "dartree-pruned": ("dartree-pruned", {"budget": 16, "width": 12}, "gru"),
    }[provider]
    spec = SpeculativeDecoder(bundle.target, bundle.drafter, make_builder(name, backend="fast", **settings),
                              head=None if head is None else bundle.heads[head])
    return lambda ids, n: spec.generate(ids, n).tokens


def decode_all(fn) -> list[torch.Tensor]:
    _, prompts = zoo()
    return [fn(p, NEW_TOKENS) for p in prompts]


def check_and_time(benchmark, provider: str, group: str) -> None:
    fn = decoder(provider)
    benchmark.group = f"{group} x {NEW_TOKENS} tokens"
    out = run(benchmark, decode_all, fn)
    for got, want in zip(out, references(), strict=True):
        assert torch.equal(got.cpu(), want.cpu()), f"{provider}: output differs from AR"


@pytest.mark.parametrize("provider", ["hf-generate", "dartree-ar"])
def test_loop_ar(benchmark, provider: str) -> None:
    with torch.no_grad():
        check_and_time(benchmark, provider, "loop ar")


@pytest.mark.parametrize("provider", ["dflash", "hf-prompt-lookup", "dartree-chain", "dartree-ddtree",
                                      "dartree-pruned"])
def test_loop_speculative(benchmark, provider: str) -> None:
    with torch.no_grad():
        check_and_time(benchmark, provider, "loop speculative")
