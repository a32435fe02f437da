"""The builder contract as one call: what dartree's own tests check of every strategy, for yours.

    from dartree.testing import check_builder

    def test_my_builder():                      # pytest: one line
        check_builder("my-builder")             # a registered name, or a TreeBuilder

Checked on ``examples`` seeded random blocks (ties included, awkward vocabularies, batch 1-3), with dartree's
deterministic test head where the builder needs one:

* the tree is valid (:meth:`DraftTree.validate`: root, parents before children, depths, distinct siblings,
  prefix-closed by construction, scores never rising along a path) and decodable
  (:func:`dartree.tree.check_decodable`), with at most ``1 + budget`` nodes when the config has a budget;
* the build is deterministic (the same block twice gives the same tree);
* ``fast == ref`` node for node (canonical forms) when the strategy has both backends;
* decoding with it is lossless: on a tiny random Llama with a drafter that proposes the target's own
  continuation with noise, the output equals greedy AR token for token.

A failure raises ``AssertionError`` naming the check, the example's seed and what differed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from dartree.block import DraftBlock
from dartree.builders import TreeBuilder, builder_spec, make_builder
from dartree.tree import check_decodable

__all__ = ["check_builder"]

_VOCABS = (2, 7, 111, 300)


def _configured(builder: TreeBuilder | str, config: dict[str, Any] | None) -> list[TreeBuilder]:
    """The builder(s) to check: a name gives its ref backend (and fast when registered), with ``config``."""
    if isinstance(builder, TreeBuilder):
        if config:
            raise ValueError("config: give settings with a builder name, not with a TreeBuilder (it has its own)")
        return [builder]
    if not isinstance(builder, str):
        raise ValueError(f"builder: expected a registered name or a TreeBuilder, got {type(builder).__name__}")
    spec = builder_spec(builder)
    config = dict(config or {})
    fields = {f.name for f in dataclasses.fields(spec.config_cls)}
    if "budget" in fields:
        config.setdefault("budget", 8)
    if "topk" in fields:
        config.setdefault("topk", 4)
    made = [make_builder(builder, "ref", **config)]
    if spec.fast is not None:
        made.append(make_builder(builder, "fast", **config))
    return made


def _block(seed: int) -> DraftBlock:
    g = torch.Generator().manual_seed(seed)
    batch = int(torch.randint(1, 4, (1,), generator=g))
    gamma = int(torch.randint(1, 7, (1,), generator=g))
    vocab = _VOCABS[seed % len(_VOCABS)]
    if seed % 2:                                   # ties, in candidates and scores
        logits = torch.randint(0, 4, (batch, gamma, vocab), generator=g).float()
    else:
        logits = torch.randn(batch, gamma, vocab, generator=g) * 2.0
    return DraftBlock(logits=logits, root=torch.randint(0, vocab, (batch,), generator=g))


def _fits(builder: TreeBuilder, block: DraftBlock) -> bool:
    topk = getattr(builder.config, "topk", None)
    return topk is None or topk <= block.vocab_size


def check_builder(builder: TreeBuilder | str, config: dict[str, Any] | None = None, *, examples: int = 12,
                  seed: int = 0, decode: bool = True) -> None:
    """Check ``builder`` (a registered name, or a configured :class:`TreeBuilder`) against the contract in
    the module docstring; ``config``: settings for a name (default ``budget=8``, ``topk=4`` where the config
    has them); ``decode=False`` skips the lossless decode (it needs transformers' Llama)."""
    from dartree.testing.heads import PathHashHead

    builders = _configured(builder, config)
    head = PathHashHead() if builders[0].needs_head else None
    budget = getattr(builders[0].config, "budget", None)
    for k in range(examples):
        block = _block(seed + k)
        if not _fits(builders[0], block):
            continue
        trees = []
        for b in builders:
            where = f"{b.name} ({b.backend}), example seed {seed + k}"
            try:
                tree = b.build(block, head)
                tree.validate(gamma=block.gamma, budget=budget)
                check_decodable(tree, block, budget)
            except ValueError as e:
                raise AssertionError(f"{where}: the tree breaks the contract: {e}") from None
            again = b.build(block, head)
            if again.canonical() != tree.canonical():
                raise AssertionError(f"{where}: not deterministic (the same block built twice gave two trees)")
            trees.append((b, tree))
        if len(trees) == 2 and trees[0][1].canonical() != trees[1][1].canonical():
            raise AssertionError(f"{builders[0].name}, example seed {seed + k}: fast != ref "
                                 f"({trees[1][1].canonical()} vs {trees[0][1].canonical()})")
    if decode:
        _check_lossless(builders[-1], head)


def _check_lossless(builder: TreeBuilder, head) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from dartree.decode import SpeculativeDecoder, generate_ar
    from dartree.testing.drafter import OracleDrafter

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                         attn_implementation="sdpa")).eval()
    decoder = SpeculativeDecoder(model, OracleDrafter(model, 4, demote=0.3, seed=1), builder, head)
    for prompt in (torch.tensor([3, 14, 15]), torch.tensor([9, 2, 6, 5, 35, 8, 9, 7])):
        got = decoder.generate(prompt, 12).tokens
        want = generate_ar(model, prompt, 12).tokens
        if not torch.equal(got, want):
            raise AssertionError(f"{builder.name} ({builder.backend}): decoding is not lossless: "
                                 f"{got.tolist()} != greedy AR {want.tolist()}")
