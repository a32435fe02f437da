"""Continuous batching (dartree.serve): requests admitted as rows free up, each row equal to its run alone.
(The batched round itself: tests/test_batch.py; the law of served rows at T>0: tests/law/test_law_rows.py.)"""

from __future__ import annotations

import pytest
import torch

from dartree.decode import SpeculativeDecoder, generate_ar
from dartree.serve import serve
from dartree.testing import OracleDrafter
from dartree.verify import KeyedSampler
from tests.models.conftest import make_drafter, make_target
from tests.test_batch import PROMPTS
from tests.test_decode import GAMMA, builder_and_head, model_for
from tests.verify.helpers import one_thread  # noqa: F401 (autouse fixture)


@pytest.mark.parametrize("kind", ["ar", "oracle", "dflash"])
def test_serve_rows_equal_alone(kind):
    """Continuous batching: 5 requests, 2 in flight, freed slots take the next prompt; each equals its run alone."""
    prompts = [*PROMPTS, torch.tensor([1, 2, 3])]
    sampler = KeyedSampler(8)
    if kind == "dflash":
        model = make_target()
        drafter = make_drafter(model)
    else:
        model = model_for("llama", "sdpa")
        drafter = OracleDrafter(model, GAMMA, demote=0.3, seed=2, temperature=1.0, sampler=sampler)
    builder, head = builder_and_head("ddtree")
    dec = SpeculativeDecoder(model, drafter, builder, head)
    finished = []
    out = serve(model if kind == "ar" else dec, prompts, 2, 9, temperature=1.0, sampler=sampler,
                stop_token_ids=None, on_finish=lambda i, r: finished.append(i))
    assert sorted(finished) == list(range(5)) and out.tokens == 5 * 9 and out.tokens_per_s > 0
    for prompt, row in zip(prompts, out.results, strict=True):
        alone = generate_ar(model, prompt, 9, temperature=1.0, sampler=sampler)
        assert row.tokens.tolist() == alone.tokens.tolist()
    assert out.steps >= 9 * 5 / 2 / (GAMMA + 1)
