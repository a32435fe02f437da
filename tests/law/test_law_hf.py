"""``model.generate(do_sample=True, custom_generate=dartree.hf.generate)`` samples what HF's own sampler samples:
HF's defaults included (``top_k=50`` when unset).  On a 128-token model whose next-token laws are wide,
top-k 50 drops ~17% of the mass, so the check can fail: HF's own sampler with ``top_k=0`` (off) puts
tokens outside the top 50.

Per decoded position (2 and 3: the tokens of rounds) the checks are: every token is among the 50 most likely
after its own prefix, and the ranks of the tokens, in 5 bins of 10, follow the target's warped law (Pearson's
test of the summed per-row probabilities of each bin: rows have different prefixes, which makes the statistic
smaller than a chi-square's in law, so the false-alarm rate stays below ``ALPHA``)."""

from __future__ import annotations

import pytest
import torch

import dartree.hf
from dartree import make_builder
from dartree.testing.drafter import SharpDrafter
from dartree.testing.law import chi2_critical
from tests.law.helpers import ALPHA
from tests.verify.helpers import one_thread, tiny_lm  # noqa: F401 (autouse fixture)

ROWS, NEW, TOP = 200, 3, 50
IDS = torch.tensor([[5, 17, 99, 3]])


@pytest.fixture(scope="module")
def model():
    model = tiny_lm("llama", "sdpa", vocab=128, seed=3)
    with torch.no_grad():              # logits of spread ~1.3: ~17% of the mass past the top 50, ranks well apart
        model.lm_head.weight.mul_(10.0)
    model.generation_config.eos_token_id = None      # no row ends early: every position is a sampled token
    return model


def ranks_and_bins(model, sequences: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For decoded positions 2..NEW: each token's rank after its prefix (``[rows, NEW - 1]``), and each row's
    probability of each rank bin under HF's default warp (top-k 50 at T=1) (``[rows, NEW - 1, 5]``)."""
    start = IDS.shape[1]
    with torch.no_grad():
        logits = model(sequences).logits[:, start: start + NEW - 1]                 # predicts positions 2..NEW
    order = logits.argsort(dim=-1, descending=True)
    tokens = sequences[:, start + 1: start + NEW]
    ranks = (order == tokens[..., None]).float().argmax(-1)
    probs = torch.gather(logits.double().softmax(-1), -1, order)[..., :TOP]
    probs = probs / probs.sum(-1, keepdim=True)
    return ranks, probs.reshape(*probs.shape[:-1], 5, TOP // 5).sum(-1)


def check(model, sequences: torch.Tensor, who: str) -> float:
    ranks, bins = ranks_and_bins(model, sequences)
    assert int((ranks >= TOP).sum()) == 0, f"{who}: {int((ranks >= TOP).sum())} tokens outside the top {TOP}"
    observed = torch.stack([((ranks // (TOP // 5)) == b).sum() for b in range(5)]).double()
    expected = bins.sum(dim=(0, 1))
    statistic = float(((observed - expected) ** 2 / expected).sum())
    assert statistic < chi2_critical(4, ALPHA), f"{who}: rank bins {observed.tolist()} vs {expected.tolist()}"
    return statistic


@pytest.mark.slow
@pytest.mark.parametrize("verifier", ["rejection", "match"])
def test_hf_generate_samples_as_hf_does_with_its_default_top_k(model, verifier):
    torch.manual_seed(0)
    ids = IDS.expand(ROWS, -1)
    hf = model.generate(ids, do_sample=True, max_new_tokens=NEW, pad_token_id=0)
    check(model, hf, "HF's own sampler")
    builder = make_builder("dartree-pruned", budget=8, topk=4, width=3)
    from dartree.testing import PathHashHead

    ours = model.generate(ids, do_sample=True, max_new_tokens=NEW, pad_token_id=0, verifier=verifier,
                          custom_generate=dartree.hf.generate, drafter=SharpDrafter(model, 3, 2.0), builder=builder,
                          head=PathHashHead())
    assert ours.shape == (ROWS, IDS.shape[1] + NEW)
    check(model, ours, f"dartree.hf.generate ({verifier})")


def test_the_hf_check_can_fail(model):
    """HF's own sampler without top-k: tokens outside the top 50 (~17% of them on this wide model)."""
    torch.manual_seed(0)
    free = model.generate(IDS.expand(100, -1), do_sample=True, max_new_tokens=NEW, pad_token_id=0, top_k=0)
    with pytest.raises(AssertionError, match="outside the top"):
        check(model, free, "HF without top-k")
