import pytest

from dartree.eval.methods import AUTO, make_method_builder, parse_method, parse_methods, resolve_backend


def test_parse_settings_head_and_defaults():
    m = parse_method("dartree-pruned:budget=32,width=8,head=markov", {"beta": -0.1, "budget": 99})
    assert m.builder == "dartree-pruned" and m.head == "markov"
    assert m.config == {"budget": 32, "width": 8, "beta": -0.1}        # the method's own budget wins
    assert parse_method("chain", {"budget": 16}).config == {}            # chain has no budget
    assert parse_method("ddtree").head is None and parse_method("corrected-chain").head == "gru"
    auto = parse_method("ddtree:budget=auto")
    assert auto.auto_fields == ("budget",) and auto.config["budget"] == AUTO
    assert make_method_builder(parse_method("ddtree:budget=5"), "ref").config.budget == 5
    assert parse_method("ar").is_ar
    # 'none' spells None for a setting that may be None, and only there
    every = parse_method("corrected-sequoia:head_depths=none,budget=4")
    assert make_method_builder(every, "ref").config.head_depths is None
    assert make_method_builder(parse_method("corrected-sequoia:head_depths=2"), "ref").config.head_depths == 2


@pytest.mark.parametrize("text, match", [
    ("beam", "method: unknown method 'beam'"),
    ("ar:budget=3", "'ar' takes no settings"),
    ("chain:budget=3", "budget: not a setting of 'chain'"),
    ("ddtree:head=gru", "head: builder 'ddtree' uses no correction head"),
    ("ddtree:budget=x", "budget: expected int or 'auto'"),
    ("ddtree:budget=0", "budget: must be an integer >= 1"),
    ("dartree-pruned:beta=0.5", "beta: must be a finite number <= 0"),
    ("ddtree:topk=auto", "topk: 'auto' is allowed only for"),
    ("ddtree:budget", "expected KEY=VALUE"),
    ("ddtree:=3", "expected KEY=VALUE in 'ddtree:=3', got '=3'"),
    ("corrected-sequoia:reuse_depths=none", "reuse_depths: expected int, got 'none'"),
])
def test_bad_methods_name_the_argument(text, match):
    with pytest.raises(ValueError, match=match):
        parse_method(text)


def test_duplicates_backend_and_unresolved_auto():
    with pytest.raises(ValueError, match="repeated"):
        parse_methods(["chain", "chain"])
    with pytest.raises(ValueError, match="backend: must be one of"):
        resolve_backend("chain", "gpu")
    with pytest.raises(ValueError, match="tune it first"):
        make_method_builder(parse_method("ddtree:budget=auto"), "ref")


def test_spaces_around_names_and_settings_are_stripped_and_a_repeated_key_is_an_error():
    m = parse_method("  ddtree : budget = 8 , topk=4 ")
    assert (m.builder, m.config, m.label) == ("ddtree", {"budget": 8, "topk": 4}, "ddtree:budget=8,topk=4")
    assert parse_method(" ar ").is_ar and parse_method("ddtree:").label == "ddtree"
    with pytest.raises(ValueError, match="repeated"):            # the same method written two ways
        parse_methods(["ddtree:budget=8", "ddtree: budget=8"])
    for text in ("ddtree:budget=8,budget=4", "dartree-pruned:head=gru,head=markov", "ddtree:topk=4, topk =4"):
        with pytest.raises(ValueError, match="set twice"):
            parse_method(text)


def test_a_strategy_registered_after_import_is_a_method(monkeypatch):
    import dataclasses

    from dartree import builders

    monkeypatch.setattr(builders, "_REGISTRY", dict(builders._REGISTRY))
    with pytest.raises(ValueError, match=r"unknown method 'my-tree'"):
        parse_method("my-tree:budget=8")
    builders.register_builder(dataclasses.replace(builders.builder_spec("ddtree"), name="my-tree"))
    spec = parse_method("my-tree:budget=8")
    assert spec.builder == "my-tree" and spec.config["budget"] == 8
    assert "my-tree" in builders.registered() and "my-tree" not in builders.BUILDERS


def test_a_method_names_its_drafter():
    """``drafter=lookup`` decodes with prompt lookup instead of the bundle's drafter; a plugin registers its own;
    an unknown name or a bad registration is one error naming it."""
    import pytest

    from dartree.eval.bundles import tiny_random_bundle
    from dartree.eval.methods import DRAFTERS, make_decoder, parse_method, register_drafter
    from dartree.lookup import PromptLookupDrafter

    method = parse_method("chain:drafter=lookup")
    assert method.drafter == "lookup" and method.label == "chain:drafter=lookup"
    bundle = tiny_random_bundle()
    assert isinstance(make_decoder(bundle, method, "ref").drafter, PromptLookupDrafter)
    assert make_decoder(bundle, parse_method("chain"), "ref").drafter is bundle.drafter
    with pytest.raises(ValueError, match="drafter: expected one of"):
        parse_method("chain:drafter=nope")
    with pytest.raises(ValueError, match="factory"):
        register_drafter("mine", 3)
    register_drafter("mine", lambda b: PromptLookupDrafter(50, gamma=2))
    try:
        assert parse_method("ddtree:drafter=mine").drafter == "mine"
    finally:
        del DRAFTERS["mine"]


def test_sampler_for_takes_every_allowed_seed_with_a_stream():
    """``--seed`` allows [0, 2**63): seed * 1_000_003 + stream leaves torch's seed range unless reduced."""
    from dartree.eval.methods import sampler_for
    from dartree.verify.sampling import GeneratorSampler

    big = sampler_for("traversal", 2**63 - 1, stream=5)
    assert isinstance(big, GeneratorSampler)
    assert big.generator.initial_seed() == ((2**63 - 1) * 1_000_003 + 5) % 2**64
