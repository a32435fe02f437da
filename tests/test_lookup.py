"""The prompt-lookup drafter: HF's matching rule, a usable block, lossless decoding with every builder."""

from __future__ import annotations

import pytest
import torch

from dartree import SpeculativeDecoder, generate_ar, make_builder
from dartree.lookup import PromptLookupDrafter
from dartree.testing import PathHashHead
from tests.test_decode import V, model_for
from tests.verify.helpers import one_thread  # noqa: F401 (autouse fixture)


def test_proposes_the_continuation_of_the_latest_longest_match():
    d = PromptLookupDrafter(50, gamma=3, max_ngram=2)
    assert d.propose([1, 2, 3, 4, 9, 2, 3, 7, 8, 2, 3]) == [7, 8, 2]       # "2 3" twice: the latest wins
    assert d.propose([5, 6, 7, 1, 5, 6]) == [7, 1, 5]
    assert d.propose([1, 2, 3]) == []
    d.append_context(None, torch.tensor([[4, 5, 6, 7, 4, 5]]))
    block = d.draft(torch.tensor([6]))
    assert block.logits.shape == (1, 3, 50) and torch.isfinite(block.logits).all()
    assert block.logits[0].argmax(-1).tolist() == [7, 4, 5]
    torch.testing.assert_close(block.logits[0].softmax(-1).max(-1).values, torch.full((3,), 0.9))
    assert PromptLookupDrafter(50).draft(torch.tensor([1])).logits.std() == 0     # no match: uniform


@pytest.mark.parametrize("name", ["chain", "ddtree", "dartree-pruned"])
def test_decodes_losslessly(name):
    model = model_for("llama", "sdpa")
    builder = make_builder(name, budget=4) if name != "chain" else make_builder(name)
    head = PathHashHead() if builder.needs_head else None
    prompt = torch.tensor([5, 6, 7, 8, 5, 6, 7, 8, 5, 6])
    dec = SpeculativeDecoder(model, PromptLookupDrafter(V, gamma=4), builder, head)
    out = dec.generate(prompt, 16)
    assert out.tokens.tolist() == generate_ar(model, prompt, 16).tokens.tolist()


@pytest.mark.parametrize("kwargs, field", [(dict(vocab_size=1), "vocab_size"), (dict(gamma=0), "gamma"),
                                           (dict(min_ngram=4), "min_ngram"), (dict(hit=1.0), "hit")])
def test_bad_settings_are_named(kwargs, field):
    with pytest.raises(ValueError, match=field):
        PromptLookupDrafter(**({"vocab_size": 10} | kwargs))
