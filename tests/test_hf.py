"""dartree inside HF generate (``custom_generate=dartree.hf.generate``): equal to ``model.generate`` greedy token
for token on the zoo and on another architecture, batches, eos, the streamer, and errors by name."""

from __future__ import annotations

import pytest
import torch

import dartree.hf
from dartree import make_builder
from dartree.models import zoo
from dartree.testing import OracleDrafter
from tests.test_decode import GAMMA, model_for
from tests.verify.helpers import one_thread  # noqa: F401 (autouse fixture)


@pytest.fixture(scope="module")
def bundle():
    return zoo.load(zoo.DEFAULT_NAME)


def test_zoo_equals_hf_greedy(bundle):
    ids = torch.as_tensor(bundle.encode("def fibonacci(n):\n    ")).reshape(1, -1)
    want = bundle.target.generate(ids, max_new_tokens=24, do_sample=False)
    for name, head in (("dartree-pruned", bundle.heads["gru"]), ("ddtree", None)):
        got = bundle.target.generate(ids, max_new_tokens=24, do_sample=False, custom_generate=dartree.hf.generate,
                                     drafter=bundle.drafter, builder=make_builder(name, backend="fast", budget=16),
                                     head=head)
        assert got.tolist() == want.tolist()


@pytest.mark.parametrize("arch", ["llama"])
def test_another_architecture_equals_hf_greedy_with_eos_and_batches(arch):
    model = model_for(arch, "sdpa")
    drafter = OracleDrafter(model, GAMMA, demote=0.3, seed=1)
    builder = make_builder("ddtree", budget=8)
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    want = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
    got = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0,
                         custom_generate=dartree.hf.generate, drafter=drafter, builder=builder)
    assert got.tolist() == want.tolist()
    eos = int(want[0, ids.shape[1] + 4])                 # a token greedy decoding reaches: it stops there
    want = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=eos, pad_token_id=0)
    got = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=eos, pad_token_id=0,
                         custom_generate=dartree.hf.generate, drafter=drafter, builder=builder)
    assert got.tolist() == want.tolist()
    # a left-padded batch with its attention mask: each row as HF decodes it
    batch = torch.tensor([[0, 0, 7, 8, 9], [3, 14, 15, 92, 65]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    got = model.generate(batch, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0,
                         custom_generate=dartree.hf.generate, drafter=drafter, builder=builder)
    for r in range(2):
        alone = model.generate(batch[r: r + 1, int((mask[r] == 0).sum()):], max_new_tokens=6, do_sample=False,
                               pad_token_id=0)
        assert got[r, batch.shape[1]:].tolist() == alone[0, alone.shape[1] - 6:].tolist()
    out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0, return_dict_in_generate=True,
                         custom_generate=dartree.hf.generate, drafter=drafter, builder=builder)
    assert out.sequences.shape == (1, ids.shape[1] + 4)


def test_stream_sees_every_token_once_and_sampling_runs():
    model = model_for("llama", "sdpa")
    drafter = OracleDrafter(model, GAMMA, demote=0.3, seed=1)
    builder = make_builder("chain")

    class Collect:
        def __init__(self):
            self.puts, self.ended = [], False

        def put(self, value):
            self.puts.append(value.reshape(-1).tolist())

        def end(self):
            self.ended = True

    streamer = Collect()
    ids = torch.tensor([[3, 14, 15]])
    got = model.generate(ids, max_new_tokens=10, do_sample=False, pad_token_id=0, stream=streamer,
                         custom_generate=dartree.hf.generate, drafter=drafter, builder=builder)
    assert streamer.puts[0] == ids[0].tolist()                      # the prompt first, as HF's loop does
    assert sum(streamer.puts[1:], []) == got[0, 3:].tolist() and streamer.ended
    torch.manual_seed(0)
    sampled = model.generate(ids, max_new_tokens=10, do_sample=True, top_p=0.9, temperature=0.8, pad_token_id=0,
                             custom_generate=dartree.hf.generate, drafter=drafter, builder=builder,
                             verifier="rejection")
    assert sampled.shape == (1, 13)


@pytest.mark.parametrize("kwargs, field", [
    (dict(repetition_penalty=1.3), "logits_processor"),
    (dict(num_beams=2), "num_beams"),
    (dict(do_sample=True, verifier="rejected"), "verifier"),
    (dict(drafter=None), "drafter"),
    (dict(output_scores=True, return_dict_in_generate=True), "output_scores"),
])
def test_errors_name_the_argument(kwargs, field):
    model = model_for("llama", "sdpa")
    args = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, custom_generate=dartree.hf.generate,
                drafter=OracleDrafter(model, GAMMA), builder=make_builder("chain")) | kwargs
    with pytest.raises(ValueError, match=field):
        model.generate(torch.tensor([[3, 14, 15]]), **args)


def _sampled_tokens(model, ids, seed, **kwargs):
    torch.manual_seed(seed)
    return model.generate(ids, max_new_tokens=6, do_sample=True, pad_token_id=0, **kwargs)[0, ids.shape[1]:]


def test_a_callers_warpers_define_the_distribution():
    """``logits_processor=[TopKLogitsWarper(3)]`` replaces HF's default top-k (50): every sampled token is among
    the target's top 3 at its position, as with HF's own sampler; ``top_p=0`` keeps the top token (greedy), as
    HF's ``TopPLogitsWarper`` does; warpers out of HF's order are refused by name."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )
    model = model_for("llama", "sdpa")
    drafter = OracleDrafter(model, GAMMA, demote=0.3, seed=1)
    ours = dict(custom_generate=dartree.hf.generate, drafter=drafter, builder=make_builder("ddtree", budget=8))
    ids = torch.tensor([[3, 14, 15]])
    for seed in range(6):
        got = _sampled_tokens(model, ids, seed, logits_processor=LogitsProcessorList([TopKLogitsWarper(3)]),
                              temperature=1.5, **ours)
        prefix = torch.cat([ids[0], got])
        with torch.no_grad():
            logits = model(prefix[None]).logits[0, ids.shape[1] - 1: -1]
        top3 = logits.topk(3, dim=-1).indices
        assert (top3 == got[:, None]).any(-1).all(), (seed, got.tolist())
    greedy = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)[0, ids.shape[1]:]
    assert _sampled_tokens(model, ids, 0, top_p=0.0, **ours).tolist() == greedy.tolist()
    assert _sampled_tokens(model, ids, 0, top_p=0.0).tolist() == greedy.tolist()        # HF's own: the same
    after_top_p = LogitsProcessorList([TopPLogitsWarper(0.9), TemperatureLogitsWarper(0.5)])
    with pytest.raises(ValueError, match="logits_processor"):
        _sampled_tokens(model, ids, 0, logits_processor=after_top_p, **ours)


def test_the_warpers_hf_hands_over_reduce_to_one_warp_with_their_law():
    """Each list the reduction accepts gives the distribution HF's own list gives (to float rounding), and
    each it refuses is one a ``Warp`` cannot express."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    from dartree.hf import _warp_options
    from dartree.verify.warp import Warp
    t, k, p, m = TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper
    scores = torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 3
    for procs in ([k(3), t(1.5), k(50)], [t(0.7), k(20), p(0.8), m(0.1)], [k(9), t(2.0), t(0.5), p(0.0)],
                  [p(0.9)], [m(0.3)], []):
        options = _warp_options(procs)
        want = LogitsProcessorList(procs)(None, scores.clone()).softmax(-1)
        torch.testing.assert_close(Warp(**options).probs(scores), want, rtol=1e-5, atol=1e-7)
    for procs in ([p(0.9), t(0.5)], [m(0.1), k(3)], [m(0.1), p(0.9)], [p(0.9), p(0.8)], [p(0.9, min_tokens_to_keep=2)],
                  [k(3, filter_value=-1e4)]):
        with pytest.raises(ValueError, match="logits_processor"):
            _warp_options(procs)


def test_a_builder_made_per_call_does_not_grow_the_model():
    """``builder=make_builder(...)`` inline in every call: the model keeps at most ``KEPT_DECODERS`` decoders
    (it kept one per call); a builder passed again reuses its decoder."""
    model = model_for("llama", "sdpa")
    drafter = OracleDrafter(model, GAMMA, demote=0.3, seed=1)
    ids = torch.tensor([[3, 14, 15]])
    args = dict(max_new_tokens=2, do_sample=False, pad_token_id=0, custom_generate=dartree.hf.generate,
                drafter=drafter)
    for _ in range(12):
        model.generate(ids, builder=make_builder("chain"), **args)
    assert len(model._dartree_decoders) == dartree.hf.KEPT_DECODERS
    kept = make_builder("chain")
    model.generate(ids, builder=kept, **args)
    first = dartree.hf._decoder(model, drafter, kept, None)
    for _ in range(3):
        model.generate(ids, builder=make_builder("chain"), **args)
    assert dartree.hf._decoder(model, drafter, kept, None) is first
