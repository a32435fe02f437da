"""The engine's shape: a verifier chosen once per decode, the draft / build stages behind one component (block
reuse included), stage times as a named record, no backend import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import dartree
from dartree.builders import make_builder, shape_of
from dartree.decode import SpeculativeDecoder
from dartree.drafting import BlockReuse, Drafting
from dartree.engine import Engine
from dartree.rounds import ROUND_STAGES, RoundStats, StageTimes, check_request
from dartree.testing import OracleDrafter, PathHashHead
from dartree.verifiers import Greedy, Match, Rejection, Verifier
from dartree.verify import GeneratorSampler, KeyedSampler
from dartree.verify.rejection import SampledTree
from tests.test_decode import GAMMA, model_for
from tests.verify.helpers import one_thread  # noqa: F401 (autouse fixture)

PROMPT = torch.tensor([3, 14, 15, 92])


def decoder(name: str = "corrected-sequoia", **config) -> SpeculativeDecoder:
    model = model_for("llama", "sdpa")
    builder = make_builder(name, **config)
    head = PathHashHead() if builder.needs_head else None
    return SpeculativeDecoder(model, OracleDrafter(model, GAMMA, demote=0.3, seed=1), builder, head)


@pytest.mark.parametrize(("temperature", "verifier", "kind"),
                         [(0.0, None, Greedy), (1.0, "match", Match), (1.0, "rejection", Rejection)])
def test_the_verifier_is_chosen_once_per_decode(temperature, verifier, kind, monkeypatch):
    """The options pick one verifier object when the engine is made; every round uses that object."""
    import dartree.engine as engine_module

    dec = decoder(budget=6, topk=3)
    made = []
    real = engine_module.make_verifier
    monkeypatch.setattr(engine_module, "make_verifier", lambda *a, **k: made.append(1) or real(*a, **k))
    sampler = GeneratorSampler(torch.Generator().manual_seed(0)) if temperature else None
    req = check_request(dec.target, PROMPT, 12, temperature, sampler, **({"verifier": verifier} if verifier else {}))
    engine = dec.engine(req, single=True)
    chosen = engine.verifier
    assert type(chosen) is kind and isinstance(chosen, Verifier) and chosen.name == (verifier or "greedy")
    engine.admit([req])
    engine.run()
    assert made == [1] and engine.verifier is chosen
    assert engine.result(0).tokens.shape[1] == 12


def test_a_verifier_redraws_only_under_rejection():
    """Only the rejection verifier draws the tree's tokens (in build); the others verify the builder's tree."""
    dec = decoder(budget=6, topk=3)
    sampler = GeneratorSampler(torch.Generator().manual_seed(0))
    for verifier, redraws in (("match", False), ("rejection", True)):
        req = check_request(dec.target, PROMPT, 8, 1.0, sampler, verifier=verifier)
        engine = dec.engine(req, single=True)
        assert engine.verifier.redraws is redraws
        assert (engine.drafting.shape is not None) is redraws        # a Sequoia builder: its static shape
        assert (engine.drafting.reuse is not None) is redraws        # with a head: block reuse
        engine.admit([req])
        engine.clock.lap()
        built = engine.build(engine.draft())                          # the draws are build work
        assert isinstance(built, SampledTree) is redraws
        engine.commit(engine.verify(built))
    assert not Greedy().redraws


def test_the_ar_engine_has_no_drafting_stage():
    dec = decoder(budget=6, topk=3)
    req = check_request(dec.target, PROMPT, 8, 0.0)
    engine = Engine(dec.target, options=req, single=True)
    assert engine.drafting is None and isinstance(engine.verifier, Greedy)
    engine.admit([req])
    engine.run()
    rounds = engine.result(0).rounds
    assert rounds and all(r.draft_s == r.build_s == 0.0 and r.verify_s >= r.target_s for r in rounds)


def test_stage_times_are_a_named_record():
    """A round's stage times: one record whose names are RoundStats' fields; the fine stages sum to the round."""
    assert StageTimes._fields == ("draft_s", "build_s", "mask_s", "verify_s", "commit_s", "head_s", "target_s",
                                  "context_s")
    times = StageTimes(draft_s=1.0, build_s=2.0, mask_s=0.5, verify_s=4.0, commit_s=1.5, head_s=0.5, target_s=3.0,
                       context_s=1.0)
    stats = RoundStats.of(2, 3, 6, times, head_calls=4)
    assert (stats.accepted_length, stats.committed, stats.tree_size, stats.head_calls) == (2, 3, 6, 4)
    assert stats.times == times and stats.total_s == 9.0
    assert sum(getattr(stats, f"{s}_s") for s in ROUND_STAGES) == pytest.approx(stats.total_s)
    dec = decoder(budget=6, topk=3)
    out = dec.generate(PROMPT, 10, temperature=1.0, sampler=GeneratorSampler(torch.Generator().manual_seed(1)))
    for r in out.rounds:
        assert isinstance(r.times, StageTimes) and r.head_s <= r.build_s and r.target_s <= r.verify_s
        assert sum(getattr(r, f"{s}_s") for s in ROUND_STAGES) == pytest.approx(r.total_s)


def test_block_reuse_keeps_one_rows_block_while_enough_depths_are_left():
    head = PathHashHead()
    reuse = BlockReuse(head, depths=2)
    block = decoder().drafter.draft(torch.tensor([7]))                 # gamma 4, one row
    assert reuse.reusable(1) is None                                  # nothing kept
    reuse.keep(block, rows=2)
    assert reuse.block is None                                        # more than one row: never kept
    reuse.keep(block, rows=1)
    assert reuse.reusable(1) is block and reuse.reusable(2) is None and reuse.offset(block) == 0
    reuse.committed([0, 1, -1, -1], [11], rows=1)
    assert reuse.since == [11] and reuse.offset(block) == 1 and reuse.reusable(1) is block
    reuse.committed([0, 2, -1, -1], [12], rows=1)
    assert reuse.reusable(1) is block                                 # 4 - 2 = 2 depths left
    reuse.committed([0, 1, -1, -1], [13], rows=1)
    assert reuse.reusable(1) is None                                  # 1 left: the next round drafts
    want = head.initial_state(block)
    for j, token in enumerate([11, 12]):
        want = head.advance(block, j + 1, want[:, None], torch.tensor([[token]]))[:, 0]
    assert torch.equal(reuse.carried(block, 2), want)
    reuse.committed([0, -1], [14], rows=2)                            # a second row joined
    assert reuse.block is None


def test_drafting_uses_the_static_shape_and_reuse_only_for_a_trusted_sequoia_builder_and_a_head():
    sampler = GeneratorSampler(torch.Generator().manual_seed(0))
    rejection = Rejection(sampler, dartree.verify.warp.Warp(1.0))
    seq = make_builder("corrected-sequoia", budget=6, topk=3)
    assert shape_of(seq) is not None and shape_of(make_builder("dartree-pruned", budget=6)) is None
    assert Drafting(None, seq, PathHashHead(), rejection).reuse is not None
    assert Drafting(None, seq, PathHashHead(), Match(sampler, rejection.warp)).shape is None
    assert Drafting(None, make_builder("sequoia", budget=6, topk=3), None, rejection).reuse is None   # no head
    assert Drafting(None, make_builder("corrected-sequoia", budget=6, topk=3, reuse_depths=0), PathHashHead(),
                    rejection).reuse is None


@pytest.mark.parametrize("name", ["ddtree", "corrected-sequoia"])
def test_the_stages_driven_one_by_one_equal_step(name):
    """draft -> build -> verify -> commit called by hand give what ``step`` gives (a keyed sampler, match)."""
    dec = decoder(name, budget=6, **({"topk": 3} if name == "corrected-sequoia" else {}))
    outs = []
    for by_hand in (False, True):
        req = check_request(dec.target, PROMPT, 14, 1.0, KeyedSampler(3), verifier="match")
        engine = dec.engine(req, single=True)
        engine.admit([req])
        while engine.live:
            if by_hand:
                engine.clock.lap()
                engine.commit(engine.verify(engine.build(engine.draft())))
            else:
                engine.step()
        outs.append(engine.result(0).tokens.tolist())
    assert outs[0] == outs[1]


def test_the_engine_imports_no_backend():
    """Backend dispatch happens in builders.py alone: engine.py, drafting.py and verifiers.py import nothing from
    dartree.fast."""
    root = Path(dartree.__file__).parent
    for name in ("engine.py", "drafting.py", "verifiers.py"):
        tree = ast.parse((root / name).read_text())
        imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in imported if m.startswith("dartree.fast")], name
