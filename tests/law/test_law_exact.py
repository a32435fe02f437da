"""Exact laws by enumeration: one round of the rejection verifier on every registered builder's own tree (ref and
fast), with the tiny target's real next-token laws and the real proposals (the drafter's block, or the test
head along the drawn path where the builder has one), equals the target's law, for T in {0.7, 1} with each
warper; and a verifier accepting 5% too often does not, on every one of them.  The same with the proposal at
its own temperature (the Sequoia builders' ``proposal_temperature``), and a verifier told the run's proposal
while the children were drawn from the other does not.

How: :func:`dartree.testing.law.round_law` enumerates every draw without replacement of every node's children and
every acceptance outcome (the verifier's own ``accept_step``), the result continued by the target's exact
sampling to ``depth + 1`` tokens, against the target's joint over those tokens (float64, 1e-12).  No
randomness: these never flake and need no false-alarm rate.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import torch

import dartree
from dartree.builders import SequoiaConfig
from dartree.fast.sequoia import shape_tree
from dartree.testing.drafter import SharpDrafter
from dartree.testing.law import continued, round_law, total_variation
from dartree.verify.rejection import HEAD_DEPTHS, proposal_probs
from tests.law.helpers import GAMMA, PROMPT, SHARPNESS, WARPS, V, biased, builder_and_head, target
from tests.verify.helpers import one_thread  # noqa: F401 (autouse fixture)

ROOT = 0            # the first new token the round starts from (the target's most likely one after PROMPT)


@functools.cache
def _logits() -> dict[tuple[int, ...], torch.Tensor]:
    """The target's next-token logits after PROMPT + ROOT + every path of up to GAMMA tokens (one forward per
    path length)."""
    import itertools

    out = {}
    with torch.no_grad():
        for n in range(GAMMA + 1):
            paths = list(itertools.product(range(V), repeat=n))
            ids = torch.tensor([PROMPT.tolist() + [ROOT] + list(p) for p in paths])
            for p, row in zip(paths, target()(ids).logits[:, -1], strict=True):
                out[p] = row
    return out


@functools.cache
def _target_probs(warp_name: str):
    warp = WARPS[warp_name]
    table = {p: warp.logits(x).double().softmax(-1).numpy() for p, x in _logits().items()}
    return table.__getitem__


@functools.cache
def _block():
    drafter = SharpDrafter(target(), GAMMA, SHARPNESS)
    drafter.start(1)
    drafter.append_rows(None, PROMPT[None], [PROMPT.shape[0]])
    return drafter.draft_rows(torch.tensor([ROOT]))


def _round(name: str, backend: str, warp_name: str, proposal_temperature: float = 1.0):
    """The tree shape the decoder verifies, the proposal at every path (at the run's temperature times
    ``proposal_temperature``), the target at every path."""
    builder, head = builder_and_head(name, backend)
    block, target_warp = _block(), WARPS[warp_name]
    warp = dataclasses.replace(target_warp, temperature=target_warp.temperature * proposal_temperature)
    if isinstance(builder.config, SequoiaConfig):        # under rejection a Sequoia tree is its static shape
        tree = shape_tree(block, builder.config, GAMMA, block.root)
    else:
        tree = builder.build(block, head)
    parents = tree.parents[0, : int(tree.num_nodes[0])].tolist()
    depth = int(tree.depths[0, : int(tree.num_nodes[0])].max())
    head_depths = getattr(builder.config, "head_depths", HEAD_DEPTHS) or GAMMA

    @functools.cache
    def state(path: tuple[int, ...]):
        if not path:
            return head.initial_state(block)[:, None]
        return head.advance(block, len(path), state(path[:-1]), torch.tensor([[path[-1]]]))

    @functools.cache
    def proposal(path: tuple[int, ...]) -> np.ndarray:
        d = len(path) + 1
        if head is not None and d <= head_depths:
            logits = head.logits(block, d, state(path), torch.arange(V)[None])[0, 0]
        else:
            logits = block.logits[0, d - 1]
        return proposal_probs(warp, logits).double().numpy()

    return parents, depth, proposal, _target_probs(warp_name)


CASES = [(n, b) for n in dartree.BUILDERS for b in ("ref", "fast")]


@pytest.mark.parametrize("warp", list(WARPS))
@pytest.mark.parametrize("name,backend", CASES, ids=[f"{n}-{b}" for n, b in CASES])
def test_one_round_on_every_builder_tree_is_exactly_the_target(name, backend, warp):
    parents, depth, proposal, p = _round(name, backend, warp)
    assert len(parents) > 2 and depth >= 2                  # a real tree: the suite's config branches or chains
    law = continued(round_law(parents, p, proposal), p, depth + 1)
    truth = continued({(): 1.0}, p, depth + 1)
    assert abs(sum(law.values()) - 1) < 1e-12
    assert set(law) <= set(truth)
    assert max(abs(law.get(k, 0.0) - v) for k, v in truth.items()) < 1e-12


@pytest.mark.parametrize("warp", ["T1", "T0.7-topk3"])
@pytest.mark.parametrize("name,backend", CASES, ids=[f"{n}-{b}" for n, b in CASES])
def test_accepting_5_percent_too_often_changes_the_exact_law(name, backend, warp):
    """The x1.05 verifier, enumerated exactly: its one-round law is at total variation > 0.5% from the target's
    on every builder's tree (0.6-3.4% measured, the table in the report); the correct one is at 0."""
    parents, depth, proposal, p = _round(name, backend, warp)
    truth = continued({(): 1.0}, p, depth + 1)
    with biased():
        law = continued(round_law(parents, p, proposal), p, depth + 1)
    assert total_variation(law, truth) > 0.005, total_variation(law, truth)


#: proposals at their own temperature (the run's times this: ``SequoiaConfig.proposal_temperature``)
RATIOS = (0.6, 1.5)
SAMPLED = [("corrected-sequoia", "fast"), ("corrected-sequoia", "ref"), ("sequoia", "fast")]


@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("warp", ["T1", "T0.7-topk3", "T1-minp0.05"])
@pytest.mark.parametrize("name,backend", SAMPLED, ids=[f"{n}-{b}" for n, b in SAMPLED])
def test_a_proposal_at_its_own_temperature_keeps_the_exact_law(name, backend, warp, ratio):
    parents, depth, proposal, p = _round(name, backend, warp, ratio)
    law = continued(round_law(parents, p, proposal), p, depth + 1)
    truth = continued({(): 1.0}, p, depth + 1)
    assert abs(sum(law.values()) - 1) < 1e-12
    assert max(abs(law.get(k, 0.0) - v) for k, v in truth.items()) < 1e-12


@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("warp", ["T1", "T0.7-topk3"])
@pytest.mark.parametrize("name,backend", SAMPLED, ids=[f"{n}-{b}" for n, b in SAMPLED])
def test_testing_draws_at_another_temperature_against_the_runs_proposal_changes_the_exact_law(name, backend, warp,
                                                                                             ratio):
    """The bug the proposal's temperature invites: the children drawn at the proposal's temperature, the verifier
    told the run's ``q``.  Its one-round law is at total variation 0.3-3.7% from the target's (measured: 0.6 and
    1.5 on both warps and builders); the correct one is at 0 (above).  Not under top-p: on this peaked target the
    nucleus of the drafter's and the head's proposals is one token at either temperature (nothing to get wrong)."""
    parents, depth, drawn, p = _round(name, backend, warp, ratio)
    _, _, told, _ = _round(name, backend, warp)
    truth = continued({(): 1.0}, p, depth + 1)
    law = continued(round_law(parents, p, drawn, stored=told), p, depth + 1)
    assert total_variation(law, truth) > 0.002, total_variation(law, truth)
