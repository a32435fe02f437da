"""HFTarget: tree forward == running each root-to-node path alone; hidden-state capture; errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dartree.models.target import HFTarget
from tests.verify.helpers import ARCHS, make_tree, one_thread, random_tree, tiny_lm  # noqa: F401 (autouse fixture)

V = 128


@torch.no_grad()
def path_alone(model, context: torch.Tensor, path: list[int], layer_ids=()):
    """Logits (and captured hidden) at the end of context + path, run causally from scratch."""
    out = model(input_ids=torch.cat([context, torch.tensor([path])], dim=1), output_hidden_states=True)
    hidden = torch.cat([out.hidden_states[i + 1][0, -1] for i in layer_ids]) if layer_ids else None
    return out.logits[0, -1], hidden


@pytest.mark.parametrize("kind", ["dynamic", "static"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", ARCHS)
def test_tree_forward_equals_paths_alone(arch, attn, kind):
    model = tiny_lm(arch, attn, vocab=V)
    layer_ids = (0, 1)
    target = HFTarget(model, layer_ids=layer_ids, cache=kind, max_cache_len=40 if kind == "static" else None)
    # a batch of two trees of different sizes (one padded), sharing the prefix length
    contexts = torch.tensor([[3, 9, 27, 81], [5, 25, 125, 1]])
    tree = random_tree([9, 4], seed=3, vocab=V)
    target.prefill(contexts)
    out = target.forward_tree(target.tree_inputs(tree))
    assert out.logits.shape == (2, 9, V) and out.hidden.shape == (2, 9, 64)
    worst = 0.0
    for r in range(2):
        for i, nodes in enumerate(tree.node_paths(r)):
            path = tree.tokens[r, [0, *nodes]].tolist()
            logits, hidden = path_alone(model, contexts[r:r + 1], path, layer_ids)
            worst = max(worst, float((out.logits[r, i] - logits).abs().max()),
                        float((out.hidden[r, i] - hidden).abs().max()))
    assert worst < 1e-5
    assert torch.isfinite(out.logits).all()               # padding slots never produce NaN


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_prefill_hidden_and_second_round_after_commit(attn):
    model = tiny_lm("qwen3", attn, vocab=V)
    target = HFTarget(model, layer_ids=(1, 0))
    prompt = torch.tensor([[4, 8, 15, 16, 23]])
    out = target.prefill(prompt)
    full = model(input_ids=prompt, output_hidden_states=True)
    torch.testing.assert_close(out.logits, full.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.hidden, torch.cat([full.hidden_states[2], full.hidden_states[1]], -1))
    # round 1: root 42 -> 7 -> 9; commit root + 7; round 2 scores a new tree after the compacted cache
    tree = make_tree([([42, 7, 9], [-1, 0, 1])])
    target.forward_tree(target.tree_inputs(tree))
    target.commit(torch.tensor([[0, 1, -1]]), 2)
    assert target.length == 7
    tree2 = make_tree([([9, 11, 13, 2], [-1, 0, 0, 1])])
    out2 = target.forward_tree(target.tree_inputs(tree2))
    context = torch.cat([prompt, torch.tensor([[42, 7]])], dim=1)
    for i, path in enumerate([[9], [9, 11], [9, 13], [9, 11, 2]]):
        torch.testing.assert_close(out2.logits[0, i], path_alone(model, context, path)[0], atol=1e-5, rtol=1e-5)


def test_empty_prefill_then_tree():
    model = tiny_lm("llama", "sdpa", vocab=V)
    target = HFTarget(model)
    out = target.prefill(torch.zeros(1, 0, dtype=torch.int64))
    assert out.logits.shape == (1, 0, V) and target.length == 0
    tree = make_tree([([42, 7], [-1, 0])])
    logits = target.forward_tree(target.tree_inputs(tree)).logits
    torch.testing.assert_close(logits[0, 1], path_alone(model, torch.zeros(1, 0, dtype=torch.int64), [42, 7])[0],
                               atol=1e-5, rtol=1e-5)


class FakeConfig:
    _attn_implementation = "flash_attention_2"


class FakeModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.config = FakeConfig()


def test_bad_arguments():
    model = tiny_lm("llama", "eager", vocab=V, max_positions=16)
    with pytest.raises(ValueError, match="_attn_implementation"):
        HFTarget(FakeModel())
    with pytest.raises(ValueError, match="model"):
        HFTarget("gpt2")
    with pytest.raises(ValueError, match="layer_ids"):
        HFTarget(model, layer_ids=(2,))
    with pytest.raises(ValueError, match="cache"):
        HFTarget(model, cache="paged")
    sliding = tiny_lm("qwen3", "sdpa", vocab=V)
    sliding.config.use_sliding_window, sliding.config.sliding_window = True, 4
    sliding.config.layer_types = ["sliding_attention", "full_attention"]
    with pytest.raises(ValueError, match="DynamicSlidingWindowLayer"):
        HFTarget(sliding)
    with pytest.raises(ValueError, match="max_cache_len"):
        HFTarget(model, max_cache_len=8)
    with pytest.raises(ValueError, match="max_cache_len"):
        HFTarget(model, cache="static", max_cache_len=0)
    target = HFTarget(model, cache="static", max_cache_len=6)
    with pytest.raises(ValueError, match="input_ids"):
        target.prefill(torch.zeros(1, 7, dtype=torch.int64))
    with pytest.raises(ValueError, match="input_ids"):
        target.prefill(torch.zeros(7, dtype=torch.int64))
    target.prefill(torch.zeros(1, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="accepted"):
        target.commit(torch.tensor([[0]]), 1)                    # nothing pending
    big = make_tree([([1, 2, 3, 4], [-1, 0, 1, 2])])
    with pytest.raises(ValueError, match="tree"):
        target.tree_inputs(big)                                  # 3 + 4 > 6 slots
    assert target.length == 3
    small = make_tree([([1, 2], [-1, 0])])
    target.forward_tree(target.tree_inputs(small))
    with pytest.raises(ValueError, match="pending"):
        target.forward_tree(target.tree_inputs(small))
    with pytest.raises(ValueError, match="pending"):
        target.extend(torch.tensor([[1]]))
    with pytest.raises(ValueError, match="count"):
        target.commit(torch.tensor([[0, 1]]), 3)
    target.commit(torch.tensor([[0, 1]]), 2)
    assert target.length == 5
    dynamic = HFTarget(model)
    dynamic.prefill(torch.zeros(1, 2, dtype=torch.int64))
    stale = dynamic.tree_inputs(small)
    dynamic.extend(torch.tensor([[1]]))
    with pytest.raises(ValueError, match="inputs"):
        dynamic.forward_tree(stale)                              # built for an older cache length
    with pytest.raises(ValueError, match="tree"):
        dynamic.tree_inputs("tree")


def test_bool_mask_under_eager_gives_wrong_logits():
    """Why the eager path gets an additive float mask: eager *adds* the mask to the scores, so a bool
    mask becomes +0/+1 and silently attends everywhere."""
    model = tiny_lm("llama", "eager", vocab=V)
    context = torch.tensor([[3, 1, 4, 1, 5]])
    tree = make_tree([([9, 2, 6], [-1, 0, 0])])
    target = HFTarget(model)
    target.prefill(context)
    inputs = target.tree_inputs(tree)
    right = target.forward_tree(inputs).logits
    target.rollback()
    with torch.no_grad():
        wrong = model(input_ids=inputs.input_ids, position_ids=inputs.position_ids, attention_mask=inputs.mask,
                      cache=target.cache, use_cache=True).logits
    alone = path_alone(model, context, [9, 6])[0]
    assert float((right[0, 2] - alone).abs().max()) < 1e-5
    assert float((wrong[0, 2] - alone).abs().max()) > 1e-3


def test_lm_head_rows_apart_only_when_logits_are_the_head_of_the_last_state():
    """The lazy T=0 LM head is used only after a probe proves logits == head(final state)."""
    from transformers import LlamaForCausalLM

    class Scaled(LlamaForCausalLM):            # logits transformed after the LM head (like soft-capping)
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 2.0
            return out

    plain = tiny_lm("llama", "sdpa", vocab=V)
    scaled = Scaled(plain.config).eval()
    scaled.load_state_dict(plain.state_dict())
    assert HFTarget(plain).scores_rows_apart and not HFTarget(scaled).scores_rows_apart
    target = HFTarget(plain)
    target.prefill(torch.tensor([[3, 4, 5]]))
    tree = make_tree([([6, 7, 8, 9], [-1, 0, 0, 1])])
    root = target.forward_tree(target.tree_inputs(tree), logits="root")
    target.rollback()
    full = target.forward_tree(target.tree_inputs(tree))
    assert root.logits.shape == (1, 1, V) and root.final.shape == (1, 4, plain.config.hidden_size)
    torch.testing.assert_close(target.head_logits(root.final[0]), full.logits[0], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="logits"):
        target.forward_tree(target.tree_inputs(tree), logits="some")
