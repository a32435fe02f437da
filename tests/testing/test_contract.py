"""The installed builder kit: check_builder on every registered strategy, a third-party builder registered
through the public API passes it, and broken builders fail it (or fail at build) with a clear message."""

from __future__ import annotations

import pytest
import torch

import dartree
from dartree import DraftBlock, make_builder
from dartree.builders import BuilderSpec, TreeConfig, register_builder, registered
from dartree.ref.core import Node, assemble
from dartree.testing import check_builder
from dartree.testing.strategies import blocks, config_for, trees
from tests.verify.helpers import one_thread  # noqa: F401 (autouse fixture)


@pytest.fixture(autouse=True)
def _registry():
    """Strategies registered by a test leave the registry with it."""
    from dartree import builders

    saved = dict(builders._REGISTRY)
    yield
    builders._REGISTRY.clear()
    builders._REGISTRY.update(saved)


@pytest.mark.parametrize("name", registered())
def test_every_registered_builder_meets_the_contract(name):
    check_builder(name, examples=6, decode=name in ("ddtree", "dartree-pruned"))


def test_a_third_party_builder_registers_and_passes():
    """The plugin module of tests/testing/test_plugins.py (a beam builder with a setting of its own)."""
    import sys
    import types

    from tests.testing.test_plugins import PLUGIN

    module = types.ModuleType("beam_plugin")
    sys.modules["beam_plugin"] = module                   # dataclasses look their module up
    try:
        exec(compile(PLUGIN, "beam_plugin", "exec"), module.__dict__)
    finally:
        del sys.modules["beam_plugin"]
    assert "beam" in dartree.BUILDERS                       # live: registered after import
    check_builder("beam", {"budget": 6, "topk": 2, "max_children": 2}, examples=6)


def test_a_builder_over_its_budget_or_with_a_dropped_parent_fails_clearly():
    def greedy_overflow(block, head, config):          # ignores its budget
        return make_builder("ddtree", budget=config.budget + 3, topk=config.topk).build(block)

    register_builder(BuilderSpec("test-overflow", TreeConfig, False, greedy_overflow))
    block = DraftBlock(logits=torch.randn(1, 4, 20), root=torch.tensor([3]))
    with pytest.raises(ValueError, match="budget"):
        make_builder("test-overflow", budget=4, topk=4).build(block)
    with pytest.raises(AssertionError, match="test-overflow"):
        check_builder("test-overflow", {"budget": 4}, decode=False)

    root = Node(3, 0.0, ())
    child = Node(5, -1.0, (0,), root)
    grandchild = Node(6, -2.0, (0, 0), child)
    with pytest.raises(ValueError, match=r"nodes: row 0 has 1 node\(s\) whose parent is not in the tree"):
        assemble([root], [[grandchild]], torch.device("cpu"))


def test_check_builder_refuses_bad_arguments():
    with pytest.raises(ValueError, match="builder"):
        check_builder(3)
    with pytest.raises(ValueError, match="config"):
        check_builder(make_builder("chain"), {"topk": 2})


def test_the_strategies_draw_valid_configs_and_trees():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=10, deadline=None)
    @given(data=st.data())
    def run(data):
        block = data.draw(blocks(max_vocab=40, max_gamma=5))
        for name in ("chain", "ddtree", "dartree-pruned"):
            make_builder(name, **config_for(data.draw, name, block.vocab_size))
        block, tree = data.draw(trees("dartree-pruned", max_vocab=40, max_gamma=5))
        tree.validate(gamma=block.gamma)

    run()


def test_the_decoder_refuses_a_tree_over_the_budget_of_a_builder_of_its_own():
    """A builder that is not a TreeBuilder (a ``build`` and a ``config`` of its own) is checked by the decoder:
    a tree of 7 draft nodes at budget 4 is one ValueError naming the budget, not a longer verify."""
    from dataclasses import dataclass

    from transformers import LlamaConfig, LlamaForCausalLM

    from dartree.decode import SpeculativeDecoder
    from dartree.testing.drafter import OracleDrafter

    @dataclass
    class Config:
        budget: int = 4

    class Overflowing:
        needs_head, config = False, Config()

        def build(self, block, head=None):
            return make_builder("ddtree", budget=7, topk=4).build(block)

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                         attn_implementation="sdpa")).eval()
    decoder = SpeculativeDecoder(model, OracleDrafter(model, 4, demote=0.3, seed=1), Overflowing())
    with pytest.raises(ValueError, match="budget"):
        decoder.generate(torch.tensor([3, 14, 15]), 8)


def test_check_builder_checks_the_law_at_temperature_1():
    check_builder("corrected-sequoia", examples=2, temperature=1.0, draws=1000)


def test_check_builder_checks_the_law_of_a_proposal_at_its_own_temperature():
    """Both law checks with the draws at 1.5x the run's temperature: the enumeration from the proposal the decoder
    draws from, and the seeded decodes."""
    check_builder("corrected-sequoia", {"proposal_temperature": 1.5}, examples=1, temperature=0.7, draws=1000)


def test_check_builder_catches_a_verifier_accepting_5_percent_too_often(monkeypatch):
    """The law check fails with the builder and the seed named: exactly (the enumeration), and by the seeded
    chi-square alone (the enumeration kept on the correct rule, the decode on the biased one)."""
    import functools

    import dartree.testing.law as law
    from dartree.verify import rejection

    def correct(r, s, x):
        return (1.0 if s[x] <= 0 else min(1.0, r[x] / s[x]), *rejection._after_rejection(r, s, x))

    monkeypatch.setattr(rejection, "_accept_probability",
                        lambda r, s, x: 1.0 if s[x] <= 0 else min(1.0, 1.05 * r[x] / s[x]))
    with pytest.raises(AssertionError, match=r"ddtree \(fast\) at T=1, seed 3: one round .*\(exact enumeration\)"):
        check_builder("ddtree", examples=1, seed=3, temperature=1.0, draws=1000)
    monkeypatch.setattr(law, "round_law", functools.partial(law.round_law, step=correct))
    with pytest.raises(AssertionError, match=r"seed 3: decoded outputs do not follow the target's law: chi-square"):
        check_builder("ddtree", examples=1, seed=3, temperature=1.0, draws=2000)


def test_check_builder_names_the_builder_and_seed_of_a_raw_exception():
    def broken(block, head, config):
        raise IndexError("list index out of range")

    register_builder(BuilderSpec("broken", TreeConfig, needs_head=False, ref=broken))
    with pytest.raises(AssertionError, match=r"broken \(ref\), example seed 5: the builder raised IndexError: list"):
        check_builder("broken", seed=5)
