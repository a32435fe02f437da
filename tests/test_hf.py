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
