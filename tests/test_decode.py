"""End to end: speculative decoding is lossless (T=0 vs HF generate; T>0 vs AR with a keyed
sampler) for every registry builder, and every stopping rule and bad input behaves as documented."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import dartree
from dartree.block import DraftBlock
from dartree.builders import builder_spec
from dartree.decode import ROUND_STAGES, GenerationResult, SpeculativeDecoder, generate_ar
from dartree.models.target import HFTarget
from dartree.testing import OracleDrafter, PathHashHead
from dartree.verify import GeneratorSampler, KeyedSampler
from tests.verify.helpers import ARCHS, one_thread, tiny_lm  # noqa: F401 (autouse fixture)

V = 128
GAMMA = 4


_MODELS: dict[tuple, torch.nn.Module] = {}


def model_for(arch: str, attn: str, **kw) -> torch.nn.Module:
    key = (arch, attn, tuple(sorted(kw.items())))
    if key not in _MODELS:
        _MODELS[key] = tiny_lm(arch, attn, vocab=V, **kw)
    return _MODELS[key]


def builder_and_head(name: str, backend: str = "ref"):
    fields = {f.name for f in dataclasses.fields(builder_spec(name).config_cls)}
    config = {"topk": 4}
    if "budget" in fields:
        config["budget"] = 8
    if "width" in fields:
        config["width"] = 3
    builder = dartree.make_builder(name, backend=backend, **config)
    return builder, (PathHashHead() if builder.needs_head else None)


@torch.no_grad()
def hf_greedy(model, prompt: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    out = model.generate(prompt, do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens)
    return out[:, prompt.shape[1]:]


def check_stats(result: GenerationResult, gamma: int = GAMMA) -> None:
    assert 1 + sum(r.committed for r in result.rounds) == result.tokens.shape[1]     # the first from the prefill
    for r in result.rounds:
        assert 0 <= r.accepted_length <= gamma and 1 <= r.committed <= r.accepted_length + 1
        assert r.tree_size >= 1 and min(r.draft_s, r.build_s, r.mask_s, r.verify_s, r.commit_s) >= 0
        assert 0 <= r.head_s <= r.build_s and 0 < r.target_s <= r.verify_s
        assert 0 < r.context_s <= r.commit_s
        assert r.overhead_s == pytest.approx(r.total_s - r.draft_s - r.head_s - r.target_s - r.context_s)
    fine, coarse = result.stage_breakdown(), result.stage_seconds()
    assert sum(fine.values()) == pytest.approx(sum(coarse.values()))
    assert fine["head"] + fine["builder"] == pytest.approx(coarse["build"])
    assert fine["target"] + fine["accept"] == pytest.approx(coarse["verify"])
    assert fine["context"] + fine["kv"] == pytest.approx(coarse["commit"])
    assert result.tau == pytest.approx((result.tokens.shape[1] - 1) / max(1, result.num_rounds))


PROMPTS = [(torch.tensor([[7]]), 13), (torch.tensor([[3, 14, 15, 92, 65, 35]]), 9),
           (torch.arange(40, 52)[None], 5)]
NOISE = [(0.3, 0.2), (0.0, 0.0), (0.5, 0.0)]


@pytest.mark.parametrize("name", dartree.BUILDERS)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", ARCHS)
def test_lossless_greedy_every_builder(arch, attn, name):
    model = model_for(arch, attn)
    builder, head = builder_and_head(name)
    for (prompt, length), (demote, drop) in zip(PROMPTS, NOISE, strict=True):
        drafter = OracleDrafter(model, GAMMA, demote=demote, drop=drop, seed=length)
        result = SpeculativeDecoder(model, drafter, builder, head).generate(prompt, length)
        assert result.tokens.tolist() == hf_greedy(model, prompt, length).tolist()
        assert result.stop_reason == "max_new_tokens"
        check_stats(result)


@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("name", dartree.BUILDERS)
def test_lossless_keyed_sampling_every_builder(name, temperature):
    model = model_for("qwen3", "sdpa")
    builder, head = builder_and_head(name)
    prompt = torch.tensor([[11, 22, 33]])
    sampler = KeyedSampler(2024)
    ar = generate_ar(model, prompt, 14, temperature=temperature, sampler=sampler)
    drafter = OracleDrafter(model, GAMMA, demote=0.3, drop=0.1, seed=1, temperature=temperature, sampler=sampler)
    spec = SpeculativeDecoder(model, drafter, builder, head).generate(prompt, 14, temperature=temperature,
                                                                      sampler=sampler)
    assert spec.tokens.tolist() == ar.tokens.tolist()
    assert spec.num_rounds < ar.num_rounds                 # the drafter foresaw some samples
    check_stats(spec)
    # a different seed gives a different sample (the test is not vacuous)
    other = generate_ar(model, prompt, 14, temperature=temperature, sampler=KeyedSampler(7))
    assert other.tokens.tolist() != ar.tokens.tolist()


@pytest.mark.parametrize("name", dartree.BUILDERS)
def test_lossless_fast_backend(name):
    """The fast backend is a drop-in: greedy equals HF generate, keyed sampling equals AR."""
    builder, head = builder_and_head(name, backend="fast")
    model = model_for("llama", "eager")
    prompt = torch.tensor([[8, 6, 7, 5]])
    drafter = OracleDrafter(model, GAMMA, demote=0.3, drop=0.1, seed=6)
    greedy = SpeculativeDecoder(model, drafter, builder, head).generate(prompt, 10)
    assert greedy.tokens.tolist() == hf_greedy(model, prompt, 10).tolist()
    sampler = KeyedSampler(99)
    drafter = OracleDrafter(model, GAMMA, demote=0.3, seed=6, temperature=1.0, sampler=sampler)
    sampled = SpeculativeDecoder(model, drafter, builder, head).generate(prompt, 10, temperature=1.0, sampler=sampler)
    assert sampled.tokens.tolist() == generate_ar(model, prompt, 10, temperature=1.0, sampler=sampler).tokens.tolist()


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", ARCHS)
def test_ar_greedy_equals_hf(arch, attn):
    model = model_for(arch, attn)
    prompt = torch.tensor([[1, 2, 3, 4]])
    ar = generate_ar(model, prompt, 10)
    assert ar.tokens.tolist() == hf_greedy(model, prompt, 10).tolist()
    assert ar.tau == 1.0 and ar.num_rounds == 9           # the first token comes from the prefill
    assert torch.equal(ar.sequence, torch.cat([prompt, ar.tokens], 1))


def test_acceptance_regimes():
    model = model_for("llama", "sdpa")
    prompt = torch.tensor([[5, 6, 7]])
    want = hf_greedy(model, prompt, 16).tolist()
    chain, _ = builder_and_head("chain")
    ddtree, _ = builder_and_head("ddtree")
    full = SpeculativeDecoder(model, OracleDrafter(model, GAMMA), chain).generate(prompt, 16)
    assert [(r.accepted_length, r.committed) for r in full.rounds] == [(4, 5)] * 3     # 16 = 1 + 3 x (4 + 1)
    assert full.tau == GAMMA + 1
    zero = SpeculativeDecoder(model, OracleDrafter(model, GAMMA, drop=1.0), ddtree).generate(prompt, 16)
    assert {r.accepted_length for r in zero.rounds} == {0} and zero.tau == 1.0
    # demoted true tokens: a chain misses them, a tree with two candidates per depth still accepts them
    chain_partial = SpeculativeDecoder(model, OracleDrafter(model, GAMMA, demote=0.5, seed=3), chain).generate(
        prompt, 16)
    tree_partial = SpeculativeDecoder(model, OracleDrafter(model, GAMMA, demote=0.5, seed=3), ddtree).generate(
        prompt, 16)
    assert 1.0 < chain_partial.tau < tree_partial.tau < GAMMA + 1
    for result in (full, zero, chain_partial, tree_partial):
        assert result.tokens.tolist() == want
        check_stats(result)
    assert set(full.stage_seconds()) == {"prefill", "draft", "build", "mask", "verify", "commit"}
    assert set(full.stage_breakdown()) == {"prefill", *ROUND_STAGES}


def test_the_forward_scores_the_root_only_while_walks_are_short(monkeypatch):
    """On the CPU the first round scores every node; later rounds score the root only (the walk then
    scores the nodes it visits) exactly while the mean committed so far is under 1 + n / ROWS_PER_PASS;
    the tokens are AR's either way, greedy and keyed."""
    from dartree.rounds import walk_pays

    model = model_for("llama", "sdpa")
    prompt = torch.tensor([[5, 6, 7]])
    ways = []
    real = HFTarget.forward_tree
    monkeypatch.setattr(HFTarget, "forward_tree", lambda self, inputs, logits="all": ways.append(
        (inputs.input_ids.shape[1], logits)) or real(self, inputs, logits=logits))
    ddtree, _ = builder_and_head("ddtree")
    sampler = KeyedSampler(5)
    cases = [(OracleDrafter(model, GAMMA), {}), (OracleDrafter(model, GAMMA, drop=1.0), {}),
             (OracleDrafter(model, GAMMA, temperature=1.0, sampler=sampler), {"temperature": 1.0, "sampler": sampler}),
             (OracleDrafter(model, GAMMA, drop=1.0, temperature=1.0, sampler=sampler),
              {"temperature": 1.0, "sampler": sampler})]
    seen = set()
    for drafter, kw in cases:
        ways.clear()
        result = SpeculativeDecoder(model, drafter, ddtree).generate(prompt, 16, **kw)
        assert result.tokens.tolist() == generate_ar(model, prompt, 16, **kw).tokens.tolist()
        assert len(ways) == result.num_rounds and ways[0][1] == "all"
        for k, (nodes, way) in enumerate(ways[1:], start=1):
            mean = sum(r.accepted_length + 1 for r in result.rounds[:k]) / k
            assert way == ("root" if walk_pays(nodes, mean) else "all")
            seen.add(way)
    assert seen == {"root", "all"}                                  # both ways were taken


def test_truncate_exactly_at_max_new_tokens():
    model = model_for("qwen3", "eager")
    prompt = torch.tensor([[9, 8, 7]])
    chain, _ = builder_and_head("chain")
    drafter = OracleDrafter(model, GAMMA)
    result = SpeculativeDecoder(model, drafter, chain).generate(prompt, 8)
    assert result.tokens.tolist() == hf_greedy(model, prompt, 8).tolist()
    # the prefill gives token 1; round 1 commits 4 accepted + bonus; round 2 accepts 4 but only 2 fit
    assert [(r.accepted_length, r.committed) for r in result.rounds] == [(4, 5), (4, 2)]
    # the target and the drafter hold exactly prompt + output minus its last token
    assert drafter.context.tolist() == torch.cat([prompt, result.tokens[:, :-1]], 1).tolist()


def test_stop_token_inside_accepted_path():
    model = model_for("qwen3", "eager")
    prompt = torch.tensor([[9, 8, 7]])
    ref = hf_greedy(model, prompt, 12)[0].tolist()
    chain, _ = builder_and_head("chain")
    for index in (0, 3, 5, 7):              # the prefill's token, inside round 1's path, its bonus, inside round 2
        stop = ref[index]
        first = ref.index(stop)
        result = SpeculativeDecoder(model, OracleDrafter(model, GAMMA), chain).generate(
            prompt, 12, stop_token_ids=[stop, V - 1] if V - 1 not in ref else [stop])
        assert result.tokens[0].tolist() == ref[: first + 1]
        assert result.stop_reason == "stop_token"
        check_stats(result)
        ar = generate_ar(model, prompt, 12, stop_token_ids={stop})
        assert ar.tokens.tolist() == result.tokens.tolist() and ar.stop_reason == "stop_token"
    # a stop token that never appears: decoding runs to max_new_tokens
    absent = next(t for t in range(V) if t not in ref)
    result = SpeculativeDecoder(model, OracleDrafter(model, GAMMA), chain).generate(prompt, 12, stop_token_ids=absent)
    assert result.tokens[0].tolist() == ref and result.stop_reason == "max_new_tokens"


def test_drafter_receives_hidden_states_of_committed_tokens():
    model = model_for("llama", "eager")
    prompt = torch.tensor([[2, 4, 6, 8]])
    ddtree, _ = builder_and_head("ddtree")
    drafter = OracleDrafter(model, GAMMA, demote=0.4, seed=2, target_layer_ids=(1, 0))
    result = SpeculativeDecoder(model, drafter, ddtree).generate(prompt, 11)
    cached = torch.cat([prompt, result.tokens[:, :-1]], 1)
    assert drafter.context.tolist() == cached.tolist()
    got = torch.cat(drafter.context_hidden, dim=1)
    with torch.no_grad():
        full = model(input_ids=cached, output_hidden_states=True).hidden_states
    torch.testing.assert_close(got, torch.cat([full[2], full[1]], -1), atol=1e-5, rtol=1e-5)
    assert len(drafter.context_hidden) == result.num_rounds + 1            # prefill + one per round


def test_static_cache_and_maximum_positions():
    model = model_for("qwen3", "sdpa", max_positions=24)
    prompt = torch.tensor([[1, 3, 5, 7]])
    want = hf_greedy(model, prompt, 20).tolist()                          # 4 + 20 == max positions
    for name in ("ddtree", "dartree-pruned"):
        builder, head = builder_and_head(name)
        for target in (HFTarget(model), HFTarget(model, cache="static", max_cache_len=24)):
            drafter = OracleDrafter(model, 6, demote=0.2, seed=4)
            result = SpeculativeDecoder(target, drafter, builder, head).generate(prompt, 20)
            assert result.tokens.tolist() == want
            check_stats(result, gamma=6)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SpeculativeDecoder(model, OracleDrafter(model, 2), builder_and_head("chain")[0]).generate(prompt, 21)


def test_sampling_with_generators_is_reproducible():
    model = model_for("qwen3", "sdpa")
    prompt = torch.tensor([[1, 2]])
    dec = SpeculativeDecoder(model, OracleDrafter(model, GAMMA, demote=0.3), builder_and_head("ddtree")[0])
    a = dec.generate(prompt, 6, temperature=1.0, sampler=GeneratorSampler(torch.Generator().manual_seed(5)))
    b = dec.generate(prompt, 6, temperature=1.0, sampler=GeneratorSampler(torch.Generator().manual_seed(5)))
    assert a.tokens.tolist() == b.tokens.tolist()
    torch.manual_seed(9)
    c = dec.generate(prompt, 6, temperature=1.0)                          # default: torch's global generator
    torch.manual_seed(9)
    d = dec.generate(prompt, 6, temperature=1.0)
    assert c.tokens.tolist() == d.tokens.tolist()
    check_stats(c)


def test_bad_inputs():
    model = model_for("llama", "eager", max_positions=16)
    chain, _ = builder_and_head("chain")
    drafter = OracleDrafter(model, GAMMA)
    dec = SpeculativeDecoder(model, drafter, chain)
    ok = torch.tensor([[1, 2, 3]])
    cases = [
        (dict(input_ids=torch.zeros(1, 0, dtype=torch.int64)), "input_ids"),
        (dict(input_ids=torch.zeros(1, 17, dtype=torch.int64)), "input_ids"),
        (dict(input_ids=torch.zeros(2, 3, dtype=torch.int64)), "input_ids"),
        (dict(input_ids=torch.zeros(1, 1, 3, dtype=torch.int64)), "input_ids"),
        (dict(input_ids=torch.zeros(1, 3)), "input_ids"),
        (dict(input_ids=torch.tensor([[1, V]])), "input_ids"),
        (dict(input_ids=torch.tensor([[-1, 2]])), "input_ids"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_new_tokens=True), "max_new_tokens"),
        (dict(max_new_tokens=14), "max_new_tokens"),                       # 3 + 14 > 16 positions
        (dict(temperature=-0.5), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=1.0, sampler="gumbel"), "sampler"),
        (dict(stop_token_ids=[V]), "stop_token_ids"),
        (dict(stop_token_ids=["a"]), "stop_token_ids"),
    ]
    for kwargs, field in cases:
        args = {"input_ids": ok, "max_new_tokens": 5, **kwargs}
        for fn in (dec.generate, lambda **a: generate_ar(model, **a)):
            with pytest.raises(ValueError, match=field):
                fn(**args)
    assert drafter.context.shape == (1, 0)                                 # nothing was started
    # a prompt of exactly the maximum positions is fine with ... no room left: max_new_tokens names it
    with pytest.raises(ValueError, match="max_new_tokens"):
        dec.generate(torch.zeros(1, 16, dtype=torch.int64), 1)
    pruned, head = builder_and_head("dartree-pruned")
    with pytest.raises(ValueError, match="head"):
        SpeculativeDecoder(model, drafter, pruned)
    with pytest.raises(ValueError, match="head"):
        SpeculativeDecoder(model, drafter, chain, PathHashHead())
    with pytest.raises(ValueError, match="builder"):
        SpeculativeDecoder(model, drafter, "chain")
    with pytest.raises(ValueError, match="drafter"):
        SpeculativeDecoder(model, object(), chain)
    with pytest.raises(ValueError, match="target"):
        SpeculativeDecoder(HFTarget(model, layer_ids=(0,)), drafter, chain)
    with pytest.raises(ValueError, match="target"):
        SpeculativeDecoder("llama", drafter, chain)
    wide = OracleDrafter(model, 2)
    wide.draft = lambda root: DraftBlock(logits=torch.zeros(1, 2, V + 1), root=root)
    with pytest.raises(ValueError, match="drafter"):
        SpeculativeDecoder(model, wide, chain).generate(ok, 3)
    with pytest.raises(ValueError, match="gamma"):
        OracleDrafter(model, 0)
    with pytest.raises(ValueError, match="drop"):
        OracleDrafter(model, 2, demote=0.6, drop=0.6)
    with pytest.raises(ValueError, match="sampler"):
        OracleDrafter(model, 2, temperature=1.0, sampler=GeneratorSampler())


def test_on_round_streams_every_committed_token_once():
    model = model_for("qwen3", "sdpa")
    prompt = torch.tensor([[5, 6, 7]])
    builder, _ = builder_and_head("ddtree")
    seen = []
    result = SpeculativeDecoder(model, OracleDrafter(model, GAMMA, demote=0.5, seed=1), builder).generate(
        prompt, 13, on_round=lambda stats, tokens: seen.append((stats, list(tokens))))
    assert [stats for stats, _ in seen] == [None, *result.rounds]       # None: the prefill's first token
    assert [t for _, tokens in seen for t in tokens] == result.tokens[0].tolist()
    assert all(len(tokens) == (1 if stats is None else stats.committed) for stats, tokens in seen)


def test_head_time_is_charged_to_the_head_stage():
    model = model_for("qwen3", "sdpa")
    prompt = torch.tensor([[3, 1, 4]])
    calls = []

    class CountingHead(PathHashHead):
        def logits(self, block, depth, states, candidates):
            calls.append(depth)
            return super().logits(block, depth, states, candidates)

    for name, head_cls in (("dartree-pruned", CountingHead), ("ddtree", None)):
        builder, _ = builder_and_head(name)
        head = head_cls() if head_cls else None
        result = SpeculativeDecoder(model, OracleDrafter(model, GAMMA, demote=0.3), builder, head).generate(prompt, 8)
        assert result.tokens.tolist() == hf_greedy(model, prompt, 8).tolist()
        check_stats(result)
        heads = [r.head_s for r in result.rounds]
        assert all(h > 0 for h in heads) if head else all(h == 0 for h in heads)
    assert calls                                        # the builder called the wrapped head


def test_a_block_built_on_another_root_is_rejected():
    """Issue 11 item 1: the tree's root is block.root; a drafter that changes it must not pass silently."""
    model = model_for("qwen3", "eager")
    chain, _ = builder_and_head("chain")
    drafter = OracleDrafter(model, GAMMA)
    honest = drafter.draft
    drafter.draft = lambda root: DraftBlock(logits=honest(root).logits, root=(root + 1) % V)
    with pytest.raises(ValueError, match="root"):
        SpeculativeDecoder(model, drafter, chain).generate(torch.tensor([[1, 2, 3]]), 5)
    drafter.draft = lambda root: DraftBlock(logits=honest(root).logits, root=root.clone())   # equal: fine
    result = SpeculativeDecoder(model, drafter, chain).generate(torch.tensor([[1, 2, 3]]), 5)
    assert result.tokens.tolist() == hf_greedy(model, torch.tensor([[1, 2, 3]]), 5).tolist()


def test_duck_typed_integers_and_stop_tokens():
    """Issue 11 item 8: anything operator.index accepts; numpy / tensor stop tokens."""
    np = pytest.importorskip("numpy")
    model = model_for("qwen3", "eager")
    prompt = torch.tensor([[9, 8, 7]])
    ref = hf_greedy(model, prompt, 12)[0].tolist()
    chain, _ = builder_and_head("chain")
    dec = SpeculativeDecoder(model, OracleDrafter(model, GAMMA), chain)
    for n in (np.int64(6), np.int32(6), torch.tensor(6)):
        assert dec.generate(prompt, n).tokens[0].tolist() == ref[:6]
        assert generate_ar(model, prompt, n).tokens[0].tolist() == ref[:6]
    stop = ref[4]
    for stops in (np.int64(stop), torch.tensor(stop), torch.tensor([stop]), np.array([stop, V - 1]),
                  [np.int64(stop)], (torch.tensor(stop),)):
        result = dec.generate(prompt, 12, stop_token_ids=stops)
        assert result.tokens[0].tolist() == ref[: ref.index(stop) + 1] and result.stop_reason == "stop_token"
    for bad, field in ((np.float64(3.0), "max_new_tokens"), (torch.tensor(True), "max_new_tokens"),
                       (torch.tensor([3, 4]), "max_new_tokens")):
        with pytest.raises(ValueError, match=field):
            dec.generate(prompt, bad)
    for bad in (torch.tensor([1.5]), np.array([V]), [torch.tensor([1, 2])], 2.0, object()):
        with pytest.raises(ValueError, match="stop_token_ids"):
            dec.generate(prompt, 5, stop_token_ids=bad)


def test_protocols_are_checked_at_the_boundary():
    """Issue 11 item 8: a head without the methods, a head returning a list, a non-causal model."""
    from transformers import BertConfig, BertModel

    model = model_for("qwen3", "eager")
    pruned, _ = builder_and_head("dartree-pruned")
    drafter = OracleDrafter(model, GAMMA)
    with pytest.raises(ValueError, match=r"head: object is missing \['initial_state', 'logits', 'advance'\]"):
        SpeculativeDecoder(model, drafter, pruned, object())

    class ListHead(PathHashHead):
        def logits(self, block, depth, states, candidates):
            return super().logits(block, depth, states, candidates).tolist()

    with pytest.raises(ValueError, match="head.logits: returned list"):
        SpeculativeDecoder(model, drafter, pruned, ListHead()).generate(torch.tensor([[1, 2]]), 4)
    bert = BertModel(BertConfig(vocab_size=V, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=32)).eval()
    for make in (lambda: HFTarget(bert), lambda: SpeculativeDecoder(bert, drafter, pruned, PathHashHead())):
        with pytest.raises(ValueError, match="model: BertModel has no language-model head"):
            make()


def test_head_calls_are_counted_per_round():
    model = model_for("qwen3", "sdpa")
    prompt = torch.tensor([[3, 1, 4]])
    builder, head = builder_and_head("dartree-pruned")
    calls = []

    class Counting(PathHashHead):
        def initial_state(self, *args):
            calls.append("initial_state")
            return super().initial_state(*args)

        def logits(self, *args):
            calls.append("logits")
            return super().logits(*args)

        def advance(self, *args):
            calls.append("advance")
            return super().advance(*args)

    result = SpeculativeDecoder(model, OracleDrafter(model, GAMMA, demote=0.4, seed=1), builder,
                                Counting()).generate(prompt, 9)
    assert all(r.head_calls >= 2 for r in result.rounds)               # initial_state + one call per depth at least
    assert len(calls) == sum(r.head_calls for r in result.rounds)
    chain, _ = builder_and_head("chain")
    plain = SpeculativeDecoder(model, OracleDrafter(model, GAMMA), chain).generate(prompt, 9)
    assert all(r.head_calls == 0 for r in plain.rounds)


def test_a_drafter_with_a_smaller_vocabulary_is_refused_by_name():
    """The target's tokens become the drafter's context: a drafter of fewer tokens would index past its
    embedding (an IndexError inside the drafter); the decoder refuses it at construction."""
    model = model_for("qwen3", "sdpa")
    drafter = OracleDrafter(model, GAMMA)
    chain, _ = builder_and_head("chain")
    drafter.vocab_size = V - 1
    with pytest.raises(ValueError, match=rf"drafter: its vocabulary \({V - 1} tokens\) is smaller than the target's"):
        SpeculativeDecoder(model, drafter, chain)
    drafter.vocab_size = V + 5                      # a larger vocabulary is fine (the block check covers drafts)
    SpeculativeDecoder(model, drafter, chain)
