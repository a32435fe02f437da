import pytest
import torch

from dartree.eval import probes
from dartree.eval.bundles import encode, load_bundle
from dartree.eval.methods import make_decoder, make_method_builder, parse_method
from dartree.eval.probes import replay_settings
from dartree.eval.simulate import ReplayBlocks, depth_counts, recorded_rounds, reference, simulate
from dartree.verify.sampling import KeyedSampler


def test_replayed_rounds_equal_real_decoding(bundle):
    ids = encode(bundle.tokenizer, "def add(a, b):\n    return")
    for temperature in (0.0, 1.0):
        ref = reference(bundle, ids, 12, temperature, seed=3)
        for text in ("chain", "dartree-pruned:budget=6,width=3"):
            method = parse_method(text)
            sampler = KeyedSampler(3) if temperature > 0 else None
            real = make_decoder(bundle, method, "ref").generate(torch.tensor([ids]), 12, temperature, sampler)
            assert torch.equal(real.sequence, ref.sequence)
            head = bundle.heads[method.head] if method.head else None
            sim = simulate(bundle, make_method_builder(method, "ref"), head, ref)
            # The last round's accepted length is cut at the reference's end (real decoding counts past it).
            assert [r.accepted_length for r in sim.rounds][:-1] == [r.accepted_length for r in real.rounds][:-1]
            assert [r.committed for r in sim.rounds] == [r.committed for r in real.rounds]
            assert sim.tau == real.tau


def test_recorded_trees_and_depth_counts(bundle):
    ref = reference(bundle, encode(bundle.tokenizer, "import os\n"), 12)
    rounds = recorded_rounds(bundle, parse_method("dartree-fixed:budget=5"), ref, "ref")
    for r in rounds:
        assert r.tree is not None and len(r.accepted) == r.accepted_length + 1 and r.accepted[0] == 0
        path = r.tree.tokens[0, list(r.accepted[1:])].tolist()
        assert path == ref.sequence[0, r.position + 1: r.position + 1 + r.accepted_length].tolist()
    counts = depth_counts(rounds, 6)
    assert len(counts) == 6 and abs(sum(counts) - sum(r.tree_size for r in rounds) / len(rounds)) < 1e-9


@pytest.fixture(scope="module")
def zoo_bundle():
    torch.set_num_threads(1)
    return load_bundle("pystdlib-tiny")


def test_replay_blocks_drafted_once_give_the_rounds_of_drafting_per_replay(zoo_bundle):
    """The zoo's DFlash drafter: blocks drafted once per reference (one context row a draft), read by every
    setting's replay, give the rounds of replays that draft their own (whose context comes in the chunks
    their rounds commit: the same numbers up to the matmuls' last bits, which decide no round here)."""
    bundle = zoo_bundle
    ids = encode(bundle.tokenizer, "def fibonacci(n):\n    ")
    for temperature in (0.0, 1.0):
        ref = reference(bundle, ids, 24, temperature, seed=5)
        blocks = ReplayBlocks(bundle.drafter, ref)
        assert sorted(blocks.blocks) == list(range(ref.prompt_len, ref.sequence.shape[1] - 1))
        for text in ("chain", "ddtree:budget=8", "dartree-pruned:budget=8,width=4", "corrected-chain"):
            method = parse_method(text)
            head = bundle.heads[method.head] if method.head else None
            builder = make_method_builder(method, "fast")
            own = simulate(bundle, builder, head, ref)
            shared = simulate(bundle, builder, head, ref, blocks=blocks)     # read after the other settings
            assert [(r.position, r.accepted_length, r.committed, r.tree_size) for r in shared.rounds] == \
                   [(r.position, r.accepted_length, r.committed, r.tree_size) for r in own.rounds], text
            assert all(r.draft_s == blocks.seconds[r.position] for r in shared.rounds)


def test_replay_blocks_are_the_same_whoever_read_them_before(bundle, monkeypatch):
    """Blocks drafted once are a pure function of the reference and the position: drafted twice they are
    equal, and a replay reads the same rounds from blocks other settings read before as from fresh ones;
    the tuner's pooled replays equal each setting's replay alone."""
    ref = reference(bundle, encode(bundle.tokenizer, "def add(a, b):\n    return"), 14)
    blocks = ReplayBlocks(bundle.drafter, ref)
    again = ReplayBlocks(bundle.drafter, ref)
    assert all(torch.equal(blocks.blocks[p].logits, again.blocks[p].logits) for p in blocks.blocks)
    texts = ("chain", "ddtree:budget=6", "dartree-pruned:budget=6,width=3", "dartree-pruned:budget=6,width=1")
    for backend in ("ref", "fast"):
        for text in texts:
            method = parse_method(text)
            head = bundle.heads[method.head] if method.head else None
            builder = make_method_builder(method, backend)
            shared = simulate(bundle, builder, head, ref, blocks=blocks)
            fresh = simulate(bundle, builder, head, ref, blocks=ReplayBlocks(bundle.drafter, ref))
            assert [(r.accepted_length, r.committed, r.tree_size) for r in shared.rounds] == \
                   [(r.accepted_length, r.committed, r.tree_size) for r in fresh.rounds], (backend, text)
    assert all(torch.equal(blocks.blocks[p].logits, again.blocks[p].logits) for p in blocks.blocks)  # unchanged
    refs = [reference(bundle, encode(bundle.tokenizer, t), 10) for t in ("import os\n", "x = [")]
    methods = [parse_method(t) for t in ("ddtree:budget=4", "dartree-pruned:budget=6,width=2,beta=-0.5")]
    seen: list[list[tuple]] = []            # per simulate call inside replay_settings: its rounds

    def spy(*args, **kwargs):
        sim = simulate(*args, **kwargs)
        seen.append([(r.position, r.accepted_length, r.committed, r.tree_size) for r in sim.rounds])
        return sim

    monkeypatch.setattr(probes, "simulate", spy)
    pooled = replay_settings(bundle, methods, refs, "ref")
    pooled_rounds, seen[:] = list(seen), []
    for k, (method, stats) in enumerate(zip(methods, pooled, strict=True)):
        (alone,) = replay_settings(bundle, [method], refs, "ref")
        assert (stats.tau, stats.mean_tree_size, stats.tree_sizes) == \
               (alone.tau, alone.mean_tree_size, alone.tree_sizes)
        # per round, not only the means: the pooled loop runs ref-major (ref i, method k at i * len(methods) + k)
        assert [pooled_rounds[i * len(methods) + k] for i in range(len(refs))] == seen, method.label
        seen[:] = []


def test_replay_blocks_of_another_reference_are_refused(bundle):
    a = reference(bundle, encode(bundle.tokenizer, "import os\n"), 8)
    b = reference(bundle, encode(bundle.tokenizer, "import os\n"), 6)
    chain = make_method_builder(parse_method("chain"), "ref")
    with pytest.raises(ValueError, match="blocks: made from another reference"):
        simulate(bundle, chain, None, b, blocks=ReplayBlocks(bundle.drafter, a))
    with pytest.raises(ValueError, match="p: no block at position"):
        ReplayBlocks(bundle.drafter, a).block(0)
