import torch

from dartree.eval.bundles import encode
from dartree.eval.methods import make_decoder, make_method_builder, parse_method
from dartree.eval.simulate import reference, simulate
from dartree.eval.streaming import stream_generate
from dartree.eval.trees import depth_counts, recorded_rounds
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


def test_streaming_reports_every_token_once_per_round(bundle):
    ids = torch.tensor([encode(bundle.tokenizer, "x = 1\n")])
    chunks: list[list[int]] = []
    decoder = make_decoder(bundle, parse_method("ddtree:budget=6"), "ref")
    result = stream_generate(decoder, ids, 17, chunks.append)
    assert sum(chunks, []) == result.tokens[0].tolist()
    assert [len(c) for c in chunks] == [1] + [r.committed for r in result.rounds]   # prefill token, then rounds
