"""Shared test helpers: hand-made trees and tiny random HF causal LMs (never downloaded)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from dartree.tree import PAD, DraftTree

ARCHS = ("qwen3", "llama")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run fastest on one thread; on oversubscribed shared cores, torch's default
    thread pool makes them ~10x slower.  Import this fixture into a test module to use it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_tree(rows: list[tuple[list[int], list[int]]]) -> DraftTree:
    """A padded batch from (tokens, parents) per row; depths derived, scores decreasing."""
    n = max(len(t) for t, _ in rows)
    b = len(rows)
    tok = torch.full((b, n), PAD)
    par = torch.full((b, n), PAD)
    dep = torch.full((b, n), PAD)
    sc = torch.full((b, n), float("-inf"))
    rk = torch.full((b, n), PAD)
    for r, (t, p) in enumerate(rows):
        d = [0]
        for i in range(1, len(t)):
            d.append(d[p[i]] + 1)
        tok[r, : len(t)] = torch.tensor(t)
        par[r, : len(t)] = torch.tensor(p)
        dep[r, : len(t)] = torch.tensor(d)
        sc[r, : len(t)] = -torch.arange(len(t), dtype=torch.float32)
        rk[r, : len(t)] = torch.tensor([-1] + [0] * (len(t) - 1))
    return DraftTree(tok, par, dep, sc, rk, torch.tensor([len(t) for t, _ in rows]))


def random_tree(sizes: list[int], seed: int, vocab: int | None = None) -> DraftTree:
    """Random parents; tokens distinct per row (node i carries token i, root token 100, or random
    distinct tokens below ``vocab`` when given)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for size in sizes:
        par = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, size)]
        if vocab is None:
            tok = [100] + list(range(1, size))
        else:
            tok = torch.randperm(vocab, generator=g)[:size].tolist()
        rows.append((tok, par))
    return make_tree(rows)


# Row 0: root(10) -> a(11) -> c(13); root -> b(12).  Row 1: root(20) -> d(21); one padding slot.
GOLDEN = make_tree([([10, 11, 12, 13], [-1, 0, 0, 1]), ([20, 21], [-1, 0])])


def tiny_lm(arch: str, attn: str = "eager", vocab: int = 128, max_positions: int = 128, seed: int = 0,
            init: float = 0.02):
    """A 2-layer random causal LM in fp32, eval mode."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                  attn_implementation=attn, initializer_range=init)
    if arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=8, **common))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        raise ValueError(f"arch: expected one of {ARCHS}, got {arch!r}")
    return model.eval()
