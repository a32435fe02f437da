"""What every decoding entry point checks where user code and user values enter the shared round
(dartree.rounds): a builder's tree, stop tokens given as an iterator, temperatures, meta tensors."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import dartree
from dartree.batch import generate_ar_batch
from dartree.serve import serve
from dartree.testing import OracleDrafter
from tests.verify.helpers import one_thread, tiny_lm  # noqa: F401 (autouse fixture)

V = 128
GAMMA = 4


@pytest.fixture(scope="module")
def model():
    return tiny_lm("qwen3", "sdpa", vocab=V)


class _Rerooted:
    """A builder that hands the decoder a tree whose root token is not the block's root (or a token >= V)."""

    needs_head = False
    name = "rerooted"

    def __init__(self, change: str) -> None:
        self.inner = dartree.make_builder("chain", backend="ref")
        self.change = change

    def build(self, block, head=None):
        tree = self.inner.build(block, head)
        tokens = tree.tokens.clone()
        if self.change == "root":
            tokens[:, 0] = (tokens[:, 0] + 1) % V
        else:
            tokens[:, 1] = V + 3
        return dataclasses.replace(tree, tokens=tokens)


@pytest.mark.parametrize("change", ["root", "token"])
def test_a_tree_that_breaks_the_contract_is_refused_not_decoded(model, change):
    prompt = torch.tensor([[5, 6, 7]])
    decoder = dartree.SpeculativeDecoder(model, OracleDrafter(model, GAMMA), _Rerooted(change))
    match = "root" if change == "root" else "token 131, need 0 <= token < V=128"
    with pytest.raises(ValueError, match=f"builder: .*{match}"):
        decoder.generate(prompt, 6)
    with pytest.raises(ValueError, match=f"builder: .*{match}"):
        decoder.generate_batch([prompt[0], prompt[0, :2]], 6)


def test_a_strategy_registered_from_outside_is_checked_and_dartrees_own_are_trusted(model, monkeypatch):
    from dartree import builders

    monkeypatch.setattr(builders, "_REGISTRY", dict(builders._REGISTRY))
    bad = _Rerooted("token")
    builders.register_builder(builders.BuilderSpec(
        name="user-rerooted", config_cls=builders.ChainConfig, needs_head=False,
        ref=lambda block, head, config: bad.build(block)))
    user = dartree.make_builder("user-rerooted")
    assert not user.trusted and dartree.make_builder("chain", backend="fast").trusted
    decoder = dartree.SpeculativeDecoder(model, OracleDrafter(model, GAMMA), user)
    with pytest.raises(ValueError, match="builder: .*token 131, need 0 <= token < V=128"):
        decoder.generate(torch.tensor([[5, 6, 7]]), 6)


def test_trusted_is_honoured_for_dartrees_own_functions_only(model, monkeypatch):
    """A copy of a built-in spec (``dataclasses.replace``) keeps ``trusted=True``: with functions of its
    own its trees are checked all the same; with dartree's functions it stays trusted."""
    from dartree import builders

    monkeypatch.setattr(builders, "_REGISTRY", dict(builders._REGISTRY))
    bad = _Rerooted("root")
    chain = builders.builder_spec("chain")
    builders.register_builder(dataclasses.replace(chain, name="copy-rerooted", fast=None,
                                                  ref=lambda block, head, config: bad.build(block)))
    builders.register_builder(dataclasses.replace(chain, name="copy-chain"))
    builders.register_builder(dataclasses.replace(chain, name="copy-other-config", config_cls=builders.TreeConfig))
    copy = dartree.make_builder("copy-rerooted")
    assert copy.spec.trusted and not copy.trusted
    assert dartree.make_builder("copy-chain", backend="fast").trusted
    assert not dartree.make_builder("copy-other-config").trusted    # dartree's function, not its config
    decoder = dartree.SpeculativeDecoder(model, OracleDrafter(model, GAMMA), copy)
    with pytest.raises(ValueError, match="builder: .*root: row 0 has root token"):
        decoder.generate(torch.tensor([[5, 6, 7]]), 6)


class _RerootedSubclass(dartree.TreeBuilder):
    """A TreeBuilder subclass on a built-in spec whose ``build`` breaks the tree after the built-in one."""

    def build(self, block, head=None):
        tree = super().build(block, head)
        tokens = tree.tokens.clone()
        tokens[:, 0] = (tokens[:, 0] + 1) % V
        return dataclasses.replace(tree, tokens=tokens)


def test_a_subclass_that_overrides_build_is_checked(model):
    """Trust covers dartree's own functions called by TreeBuilder.build itself: a subclass overriding
    ``build`` on a built-in spec (whose functions are trusted) hands the decoder trees that are checked."""
    inner = dartree.make_builder("chain", backend="fast")
    sub = _RerootedSubclass(inner.spec, "fast", inner.config)
    assert inner.trusted and not sub.trusted
    replaced = dartree.make_builder("chain", backend="fast")
    replaced._fn = lambda block, head, config: _Rerooted("root").build(block)
    assert not replaced.trusted                       # read at every call, not fixed at construction
    for builder in (sub, replaced):
        decoder = dartree.SpeculativeDecoder(model, OracleDrafter(model, GAMMA), builder)
        with pytest.raises(ValueError, match="builder: .*root: row 0 has root token"):
            decoder.generate(torch.tensor([[5, 6, 7]]), 6)


class _ZeroingDrafter(OracleDrafter):
    """An OracleDrafter that zeroes the tokens it is handed after reading them."""

    def append_context(self, hidden_states, tokens):
        super().append_context(hidden_states, tokens.clone())
        tokens.zero_()


def test_the_callers_prompt_is_not_shared_with_the_drafter_or_the_result(model):
    """The decoder hands the drafter, the target and the result a copy of ``input_ids``: a drafter editing
    its ``tokens`` argument in place zeroed the caller's prompt, and later calls decoded another one."""
    prompt = torch.tensor([[5, 6, 7]])
    want = dartree.SpeculativeDecoder(model, OracleDrafter(model, GAMMA), dartree.make_builder("chain")).generate(
        prompt.clone(), 6).tokens
    decoder = dartree.SpeculativeDecoder(model, _ZeroingDrafter(model, GAMMA), dartree.make_builder("chain"))
    first = decoder.generate(prompt, 6)
    assert prompt.tolist() == [[5, 6, 7]] == first.prompt.tolist() and first.prompt.data_ptr() != prompt.data_ptr()
    assert torch.equal(decoder.generate(prompt, 6).tokens, want) and torch.equal(first.tokens, want)
    ar = dartree.generate_ar(model, prompt, 4)
    assert ar.prompt.data_ptr() != prompt.data_ptr()


def test_stop_tokens_from_an_iterator_reach_every_row(model):
    prompts = [torch.tensor([5, 6, 7]), torch.tensor([9, 8]), torch.tensor([3, 1, 4, 1])]
    free = dartree.generate_ar(model, prompts[1], 12).tokens[0].tolist()
    stop = free[4]                                    # stops row 1 at its 5th token (or earlier)
    want = [dartree.generate_ar(model, p, 12, stop_token_ids=[stop]).tokens for p in prompts]
    decoder = dartree.SpeculativeDecoder(model, OracleDrafter(model, GAMMA), dartree.make_builder("chain"))
    runs = {
        "generate_batch": decoder.generate_batch(prompts, 12, stop_token_ids=iter([stop])),
        "generate_ar_batch": generate_ar_batch(model, prompts, 12, stop_token_ids=(t for t in [stop])),
        "serve": serve(decoder, prompts, 2, 12, stop_token_ids=iter([stop])).results,
    }
    for name, results in runs.items():
        assert [r.tokens.tolist() for r in results] == [w.tolist() for w in want], name
        assert results[1].stop_reason == "stop_token", name


def test_a_request_that_ends_at_its_first_token_finishes_at_admission(model):
    prompts = [torch.tensor([5, 6, 7]), torch.tensor([9, 8])]
    first = dartree.generate_ar(model, prompts[0], 1).tokens[0, 0].item()
    decoder = dartree.SpeculativeDecoder(model, OracleDrafter(model, GAMMA), dartree.make_builder("chain"))
    seen = []
    out = serve(decoder, prompts, 1, 6, stop_token_ids=[first], on_finish=lambda q, r: seen.append(q))
    assert out.results[0].tokens.tolist() == [[first]] and out.results[0].rounds == ()
    assert out.results[0].stop_reason == "stop_token" and sorted(seen) == [0, 1]
    one = decoder.generate_batch(prompts, 1)
    assert [r.tokens.shape[1] for r in one] == [1, 1] and all(r.rounds == () for r in one)


@pytest.mark.parametrize("temperature", [1e-300, 1e-7, -1.0, float("nan")])
def test_temperatures_that_would_overflow_are_refused(model, temperature):
    decoder = dartree.SpeculativeDecoder(model, OracleDrafter(model, GAMMA), dartree.make_builder("chain"))
    for call in (lambda: decoder.generate(torch.tensor([5, 6]), 4, temperature=temperature),
                 lambda: dartree.generate_ar(model, torch.tensor([5, 6]), 4, temperature=temperature),
                 lambda: decoder.generate_batch([torch.tensor([5, 6])], 4, temperature=temperature)):
        with pytest.raises(ValueError, match="temperature"):
            call()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_sampler_without_sample_is_refused_at_any_temperature(model, temperature):
    """Greedy decoding ignores the sampler, but an object that is not one is a mistake all the same."""
    decoder = dartree.SpeculativeDecoder(model, OracleDrafter(model, GAMMA), dartree.make_builder("chain"))
    for call in (lambda: decoder.generate(torch.tensor([5, 6]), 4, temperature=temperature, sampler=42),
                 lambda: dartree.generate_ar(model, torch.tensor([5, 6]), 4, temperature=temperature, sampler="keyed"),
                 lambda: decoder.generate_batch([torch.tensor([5, 6])], 4, temperature=temperature, sampler=object())):
        with pytest.raises(ValueError, match=r"^sampler: expected None, a GeneratorSampler, a KeyedSampler"):
            call()
    greedy = decoder.generate(torch.tensor([5, 6]), 4, sampler=dartree.KeyedSampler(0))    # a real one: unused at T=0
    assert torch.equal(greedy.tokens, decoder.generate(torch.tensor([5, 6]), 4).tokens)


def test_meta_input_ids_are_one_clear_error(model):
    with pytest.raises(ValueError, match="input_ids: .*meta"):
        dartree.generate_ar(model, torch.zeros(1, 3, dtype=torch.int64, device="meta"), 4)
    with pytest.raises(ValueError, match=r"prompts\[0\]: input_ids: .*meta"):
        generate_ar_batch(model, [torch.zeros(3, dtype=torch.int64, device="meta")], 4)
