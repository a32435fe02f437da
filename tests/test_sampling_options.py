"""``sampling=dartree.Sampling(...)``: every entry point decodes the same tokens with the object as with the
individual keywords (T=0, T=1 with a seeded GeneratorSampler, T=1 with a KeyedSampler); the object and a
keyword together, and a bad value, are ValueErrors naming them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import dartree
import dartree.hf
from dartree import GeneratorSampler, KeyedSampler, Sampling, SpeculativeDecoder, generate_ar, make_builder
from dartree.batch import generate_ar_batch
from dartree.serve import serve
from dartree.testing import OracleDrafter
from tests.test_decode import GAMMA, V, model_for
from tests.verify.helpers import one_thread  # noqa: F401 (autouse fixture)

PROMPTS = [torch.tensor([3, 14, 15]), torch.tensor([7]), torch.tensor([9, 2, 6, 5])]
NEW = 6


def model():
    return model_for("llama", "sdpa")


def decoder() -> SpeculativeDecoder:
    return SpeculativeDecoder(model(), OracleDrafter(model(), GAMMA, demote=0.3, seed=1), make_builder("chain"))


def tokens(results) -> list[list[int]]:
    return [r.tokens[0].tolist() for r in results]


#: entry point -> run(**sampling options) -> the tokens of each prompt; ``ar``: takes no verifier keyword
ENTRY_POINTS = {
    "generate": (lambda **o: tokens([decoder().generate(PROMPTS[0], NEW, **o)]), False),
    "generate_batch": (lambda **o: tokens(decoder().generate_batch(PROMPTS, NEW, **o)), False),
    "generate_ar": (lambda **o: tokens([generate_ar(model(), PROMPTS[0], NEW, **o)]), True),
    "generate_ar_batch": (lambda **o: tokens(generate_ar_batch(model(), PROMPTS, NEW, **o)), True),
    "serve": (lambda **o: tokens(serve(decoder(), PROMPTS, 2, NEW, **o).results), False),
    "serve(ar)": (lambda **o: tokens(serve(model(), PROMPTS, 2, NEW, **o).results), True),
}

#: each call gets fresh options: a GeneratorSampler's generator advances as it draws
OPTIONS = {
    "greedy": lambda: dict(stop_token_ids=[5]),
    "generator": lambda: dict(temperature=1.0, top_k=20, sampler=GeneratorSampler(torch.Generator().manual_seed(7))),
    "keyed": lambda: dict(temperature=0.9, top_p=0.9, min_p=0.01, sampler=KeyedSampler(3), verifier="match"),
}


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_the_object_decodes_as_the_keywords(entry, options):
    run, ar = ENTRY_POINTS[entry]

    def fresh() -> dict:
        o = OPTIONS[options]()
        return {k: v for k, v in o.items() if not (ar and k == "verifier")}     # AR takes no verifier keyword

    by_keywords = run(**fresh())
    assert by_keywords == run(sampling=Sampling(**fresh()))
    if options != "greedy" and entry == "generate":     # not vacuous: greedy decodes otherwise
        assert by_keywords != run()


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_the_object_and_a_keyword_together_are_refused(entry):
    run, _ = ENTRY_POINTS[entry]
    with pytest.raises(ValueError, match=r"^sampling: given together with the keyword\(s\) temperature, top_k;"):
        run(sampling=Sampling(temperature=1.0), temperature=0.5, top_k=3)
    with pytest.raises(ValueError, match=r"^sampling: given together with the keyword\(s\) stop_token_ids;"):
        run(sampling=Sampling(), stop_token_ids=[1])
    with pytest.raises(ValueError, match=r"^sampling: expected None or a dartree.Sampling, got dict"):
        run(sampling={"temperature": 1.0})
    # a keyword at its default is not given: the object decides
    assert run(sampling=Sampling(), temperature=0.0) == run()


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-1.0), r"^temperature: expected 0 \(greedy\) or a finite number >= 1e-06, got -1.0"),
    (dict(top_k=0), r"^top_k: expected None \(off\) or an int >= 1, got 0"),
    (dict(top_p=1.5), r"^top_p: expected None \(off\) or a number with 0 <= top_p <= 1, got 1.5"),
    (dict(min_p="a"), r"^min_p: expected None \(off\) or a number with 0 <= min_p <= 1"),
    (dict(sampler="gumbel"), r"^sampler: expected None, a GeneratorSampler, a KeyedSampler or any object"),
    (dict(verifier="rejected"), r"^verifier: expected None \(the default, 'traversal'\) or one of \('match', "),
    (dict(temperature=1.0, sampler=KeyedSampler(1), verifier="rejection"), r"^sampler: verifier 'rejection' draws"),
    (dict(stop_token_ids=[-1, 2]), r"^stop_token_ids: each must be an integer >= 0, got \['-1'\]"),
    (dict(stop_token_ids=2.0), r"^stop_token_ids: expected an integer or an iterable of integers, got float"),
])
def test_a_bad_value_is_refused_when_the_object_is_made(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Sampling(**kwargs)


def test_the_call_checks_the_stop_tokens_against_the_vocabulary():
    sampling = Sampling(stop_token_ids=[V])                      # the object knows no vocabulary
    for run, _ in ENTRY_POINTS.values():
        with pytest.raises(ValueError, match=rf"^stop_token_ids: each must be an integer in \[0, {V}\), got \['{V}'\]"):
            run(sampling=sampling)


def test_the_object_is_frozen_keyword_only_and_normalised():
    import numpy as np

    s = Sampling(temperature=np.float32(0.5), top_k=torch.tensor(4), top_p=1, stop_token_ids=iter([3, 3, 4]))
    assert (s.temperature, s.top_k, s.top_p, s.stop_token_ids) == (0.5, 4, 1.0, frozenset({3, 4}))
    assert type(s.temperature) is float and type(s.top_k) is int
    assert s.warp == dartree.verify.warp.Warp(0.5, 4, 1.0) and Sampling().warp is None
    assert Sampling() == Sampling(temperature=0, stop_token_ids=[]) and hash(Sampling()) == hash(Sampling())
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.temperature = 1.0
    with pytest.raises(TypeError):
        Sampling(1.0)
    assert dartree.Sampling is Sampling and "Sampling" in dartree.__all__


def _hf(ids, **kwargs):
    m = model()
    return m.generate(ids, max_new_tokens=NEW, pad_token_id=0, custom_generate=dartree.hf.generate,
                      drafter=OracleDrafter(m, GAMMA, demote=0.3, seed=1), builder=make_builder("chain"), **kwargs)


def test_hf_generate_takes_the_object_for_hfs_warpers():
    ids = torch.tensor([[3, 14, 15]])
    assert _hf(ids, do_sample=False).tolist() == _hf(ids, do_sample=False, sampling=Sampling()).tolist()
    keyed = dict(sampler=KeyedSampler(3), verifier="match")
    hf = _hf(ids, do_sample=True, temperature=0.9, top_k=20, top_p=0.9, **keyed)
    ours = _hf(ids, do_sample=False, sampling=Sampling(temperature=0.9, top_k=20, top_p=0.9, **keyed))
    assert hf.tolist() == ours.tolist()
    assert ours[0, 3:].tolist() == decoder().generate(ids, NEW, temperature=0.9, top_k=20, top_p=0.9, **keyed).tokens[
        0].tolist()
    batch = torch.tensor([[0, 3, 14, 15], [9, 2, 6, 5]])          # left-padded rows: generate_batch
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    assert _hf(batch, attention_mask=mask, do_sample=True, temperature=0.9, top_k=20, **keyed).tolist() == \
        _hf(batch, attention_mask=mask, do_sample=False, sampling=Sampling(temperature=0.9, top_k=20, **keyed)).tolist()
    with pytest.raises(ValueError, match=r"^sampling: given together with do_sample=True"):
        _hf(ids, do_sample=True, sampling=Sampling(temperature=1.0))
    with pytest.raises(ValueError, match=r"^sampling: given together with the keyword\(s\) sampler;"):
        _hf(ids, do_sample=False, sampling=Sampling(temperature=1.0), sampler=KeyedSampler(1))
