"""The law at the edges, by seeded chi-square tests at ``ALPHA`` (tests/law/helpers.py) against the target's exact
law: block reuse at positions past the first reused rounds, temperature extremes, proposals with zero mass on
tokens the target samples (and one-hot proposals), a one-hot target, and decoding up to the model's last
position (trees cut to it)."""

from __future__ import annotations

import pytest
import torch

import dartree
from dartree.testing import PathHashHead
from dartree.testing.drafter import SharpDrafter
from dartree.testing.law import chi_square, outcome_counts, target_law
from dartree.verify import GeneratorSampler
from dartree.verify.warp import Warp
from tests.law.helpers import ALPHA, GAMMA, PROMPT, SHARPNESS, V, decoder, target
from tests.verify.helpers import one_thread, tiny_lm  # noqa: F401 (autouse fixture)


class FixedDrafter(SharpDrafter):
    """The same block every round (the sharpened target logits of the first draft after PROMPT): no forward per
    draft, so that one-row decodes stay cheap; any block is a valid proposal.  Records each draft's position
    (the row's context length: the root's position)."""

    def __init__(self, model, gamma):
        super().__init__(model, gamma, SHARPNESS)
        self.positions: list[int] = []
        self._logits = None

    def draft_rows(self, roots):
        self.positions.append(len(self.contexts[0]))
        if self._logits is None:
            self._logits = super().draft_rows(roots).logits
        return dartree.DraftBlock(logits=self._logits, root=roots)


def rank_bins(model, prompt: torch.Tensor, outs: list[list[int]], which: list[list[int]], warp: Warp):
    """Observed and expected counts of each rank (0 = the most likely) of the tokens ``outs[i][j]``, ``j`` in
    ``which[i]``, under the target's warped law after their own prefixes (one forward per sequence)."""
    observed, expected = torch.zeros(V, dtype=torch.float64), torch.zeros(V, dtype=torch.float64)
    with torch.no_grad():
        for out, picks in zip(outs, which, strict=True):
            if not picks:
                continue
            ids = torch.cat([prompt, torch.tensor(out)])[None]
            p = warp.logits(model(ids).logits[0, prompt.shape[0] - 1: -1]).double().softmax(-1)   # [len(out), V]
            for j in picks:
                order = p[j].argsort(descending=True)
                observed[int((order == out[j]).nonzero())] += 1
                expected += p[j][order]
    return observed, expected


@pytest.mark.slow
def test_reused_blocks_keep_the_law_past_the_first_reused_rounds():
    """corrected-sequoia with reuse_depths=1 and a 6-deep block: one row (reuse needs one live row) decodes 12
    tokens, most rounds reusing a block, many the second time or later (the head proposing from its state after
    the tokens committed since the block's root).  Every token committed by a reused round, by the rank of its
    token under the target's law after its own prefix, against the summed exact probabilities of the ranks
    (Pearson; rows of different prefixes make the statistic smaller than a chi-square's in law: the false-alarm
    rate stays below ALPHA)."""
    from dartree.testing.law import chi2_critical

    model, warp, length, draws = target(), Warp(1.0), 12, 150
    drafter = FixedDrafter(model, 6)
    builder = dartree.make_builder("corrected-sequoia", budget=4, topk=2, acceptance=(0.6, 0.3), reuse_depths=1)
    dec = dartree.SpeculativeDecoder(model, drafter, builder, PathHashHead())
    sampler = GeneratorSampler(torch.Generator().manual_seed(13))
    outs, reused, later = [], [], 0
    for _ in range(draws):
        drafter.positions.clear()
        out = dec.generate(PROMPT, length, temperature=1.0, sampler=sampler, verifier="rejection")
        tokens, start, picks, since = out.tokens[0].tolist(), 1, [], 0
        for r in out.rounds:                  # round r's root is token start - 1, at position len(PROMPT) + start - 1
            if PROMPT.shape[0] + start - 1 in drafter.positions:
                since = 0
            else:
                since += 1
                later += since >= 2            # a block's third round or later
                picks += range(start, start + r.committed)
            start += r.committed
        outs.append(tokens)
        reused.append(picks)
    assert later > draws and sum(map(len, reused)) > 4 * draws, (later, sum(map(len, reused)))
    observed, expected = rank_bins(model, PROMPT, outs, reused, warp)
    keep = expected >= 5
    observed = torch.cat([observed[keep], observed[~keep].sum()[None]])
    expected = torch.cat([expected[keep], expected[~keep].sum()[None]])
    statistic = float(((observed - expected) ** 2 / expected).sum())
    assert statistic < chi2_critical(len(expected) - 1, ALPHA), (observed.tolist(), expected.tolist())


@pytest.mark.parametrize("temperature", [0.05, 25.0])
def test_temperature_extremes_keep_the_law(temperature):
    warp = Warp(temperature)
    counts = outcome_counts(decoder("dartree-pruned", "fast"), PROMPT, 3, 300, temperature=temperature, seed=3,
                            verifier="rejection")
    check = chi_square(counts, target_law(target(), PROMPT, 3, warp), ALPHA)
    assert check.passed, check


class Masked(SharpDrafter):
    """SharpDrafter whose logits keep only ``keep`` tokens (the others at -1e4: probability exactly 0 in
    float32), so that the proposal has no mass on tokens the target samples."""

    def __init__(self, model, gamma, keep):
        super().__init__(model, gamma, SHARPNESS)
        self.keep = torch.tensor(keep)

    def draft_rows(self, roots):
        block = super().draft_rows(roots)
        logits = torch.full_like(block.logits, -1e4)
        logits[..., self.keep] = block.logits[..., self.keep]
        return dartree.DraftBlock(logits=logits, root=block.root)


@pytest.mark.parametrize("name", ["ddtree", "corrected-sequoia"])
@pytest.mark.parametrize("keep", [[0, 3], [2]], ids=["two-tokens", "one-hot"])
def test_proposals_with_zero_mass_keep_the_law(name, keep):
    """q = 0 on most tokens (one-hot q: every node keeps one child, the rest of its shape cut): the residual
    carries them; the head's proposal (corrected-sequoia, depths <= 3) adds its own mass on top of the block's."""
    from tests.law.helpers import builder_and_head

    builder, head = builder_and_head(name, "fast")
    dec = dartree.SpeculativeDecoder(target(), Masked(target(), GAMMA, keep), builder, head)
    counts = outcome_counts(dec, PROMPT, 3, 300, seed=4, verifier="rejection")
    check = chi_square(counts, target_law(target(), PROMPT, 3, Warp(1.0)), ALPHA)
    assert check.passed, check


@pytest.mark.parametrize("verifier", ["rejection", "match"])
@pytest.mark.parametrize("warp", [dict(top_k=1), dict(min_p=1.0)], ids=["top_k=1", "min_p=1"])
def test_a_one_hot_target_gives_its_argmax_sequence_every_time(verifier, warp):
    greedy = decoder("ddtree", "fast").generate(PROMPT, 3).tokens[0].tolist()
    counts = outcome_counts(decoder("dartree-pruned", "fast"), PROMPT, 3, 100, seed=5, verifier=verifier, **warp)
    assert counts == {tuple(greedy): 100}


@pytest.mark.parametrize("name,verifier", [("dartree-pruned", "rejection"), ("corrected-sequoia", "rejection"),
                                           ("ddtree", "match")])
def test_decoding_up_to_the_models_last_position_keeps_the_law(name, verifier):
    """max_position_embeddings = prompt + new tokens: the last token's position is the model's last, the trees of
    the last rounds are cut to fit; the law of the 3 tokens holds."""
    model = tiny_lm("llama", "sdpa", vocab=V, max_positions=PROMPT.shape[0] + 3)     # the suite's weights
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)
    counts = outcome_counts(decoder(name, "fast", model=model), PROMPT, 3, 300, seed=6, verifier=verifier)
    check = chi_square(counts, target_law(model, PROMPT, 3, Warp(1.0)), ALPHA)
    assert check.passed, check


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ddtree", "dartree-pruned"])
def test_top_p_past_the_proposals_nucleus_candidates_keeps_the_law(name):
    """V = 300 > NUCLEUS_CANDIDATES (256): the proposal's top-p is taken over its 256 most likely tokens, the
    target's over all 300.  Rounds' tokens (positions 2 and 3) stay in the target's top-p set, and their ranks
    after their own prefixes (bins 0, 1-2, 3-9, 10+) follow the target's law (Pearson on summed per-row
    probabilities: smaller than a chi-square in law, false-alarm rate below ALPHA)."""
    from dartree.testing.law import chi2_critical
    from dartree.verify.rejection import NUCLEUS_CANDIDATES
    from tests.law.helpers import builder_and_head

    vocab, rows, warp = 300, 300, Warp(1.0, top_p=0.9)
    assert vocab > NUCLEUS_CANDIDATES
    model = tiny_lm("llama", "sdpa", vocab=vocab, seed=4)
    with torch.no_grad():                        # wide laws: the top-p set holds tens of tokens
        model.lm_head.weight.mul_(25.0)
    builder, head = builder_and_head(name, "fast")
    dec = dartree.SpeculativeDecoder(model, SharpDrafter(model, GAMMA, 1.5), builder, head)
    out = dec.generate_batch([PROMPT] * rows, 3, 1.0, GeneratorSampler(torch.Generator().manual_seed(8)),
                             verifier="rejection", top_p=0.9)
    seqs = torch.stack([torch.cat([PROMPT, r.tokens[0]]) for r in out])
    with torch.no_grad():
        p = warp.logits(model(seqs).logits[:, PROMPT.shape[0]: -1]).double().softmax(-1)      # [rows, 2, V]
    tokens = seqs[:, PROMPT.shape[0] + 1:]
    assert bool((torch.gather(p, -1, tokens[..., None]) > 0).all())          # inside the top-p set
    order = p.argsort(dim=-1, descending=True)
    ranks = (order == tokens[..., None]).float().argmax(-1)
    edges = [0, 1, 3, 10, vocab]
    sorted_p = torch.gather(p, -1, order)
    expected = torch.stack([sorted_p[..., a:b].sum(-1) for a, b in zip(edges, edges[1:], strict=False)], -1).sum((0, 1))
    observed = torch.stack([((ranks >= a) & (ranks < b)).sum() for a, b in zip(edges, edges[1:], strict=False)])
    statistic = float(((observed - expected) ** 2 / expected).sum())
    assert statistic < chi2_critical(len(edges) - 2, ALPHA), (observed.tolist(), expected.tolist())


@pytest.mark.parametrize("name,verifier", [("dartree-pruned", "rejection"), ("corrected-sequoia", "rejection"),
                                           ("ddtree", "match")])
def test_batch_rows_reaching_the_models_last_position_at_different_rounds_keep_the_law(name, verifier):
    """max_position_embeddings = 5 + 3: rows of the 5-token prompt end at the model's last position (their trees
    cut), rows of the 3-token prompt beside them never reach it; each follows its law."""
    from tests.law.test_law_rows import LONG

    model = tiny_lm("llama", "sdpa", vocab=V, max_positions=LONG.shape[0] + 3)
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)
    rows = decoder(name, "fast", model=model).generate_batch(
        [PROMPT, LONG] * 200, 3, 1.0, GeneratorSampler(torch.Generator().manual_seed(2)), verifier=verifier)
    for parity, prompt in enumerate((PROMPT, LONG)):
        counts: dict = {}
        for r in rows[parity::2]:
            key = tuple(r.tokens[0].tolist())
            counts[key] = counts.get(key, 0) + 1
        check = chi_square(counts, target_law(model, prompt, 3, Warp(1.0)), ALPHA)
        assert check.passed, f"{name} ({verifier}), prompt {parity}: {check}"


def test_outcome_counts_refuses_rows_and_draws_it_cannot_use():
    """rows <= 0 looped forever; a negative draws counted nothing: both now name the argument."""
    for bad in ({"rows": 0}, {"rows": -1}, {"draws": -1}):
        args = {"draws": 10, **bad}
        with pytest.raises(ValueError, match=next(iter(bad))):
            outcome_counts(decoder("dartree-pruned", "fast"), PROMPT, 3, args.pop("draws"), **args)
