"""The builder contract as one call, :func:`check_builder`: what dartree's own tests check of every strategy
(valid, decodable, within budget, deterministic, ``fast == ref``, lossless at T=0, the target's law at
``temperature > 0``), for yours.  A failure raises ``AssertionError`` naming the check, the builder and the seed.
Usage and each check: docs/extending.md, "Check it the way dartree checks its own".
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from dartree.arguments import check_int, check_number
from dartree.block import DraftBlock
from dartree.builders import TreeBuilder, builder_spec, make_builder, shape_of
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
    for name, default in (("budget", 8), ("topk", 4)):
        if name in fields:
            config.setdefault(name, default)
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


def check_builder(builder: TreeBuilder | str, config: dict[str, Any] | None = None, *, examples: int = 12,
                  seed: int = 0, decode: bool = True, temperature: float = 0.0, draws: int = 2000,
                  alpha: float = 1e-6) -> None:
    """Check ``builder`` (a registered name, or a configured :class:`TreeBuilder`) against the contract in
    docs/extending.md ("Check it the way dartree checks its own"); ``config``: settings for a name (default
    ``budget=8``, ``topk=4`` where the config has them); ``decode=False`` skips the decodes (they need
    transformers' Llama); ``temperature > 0`` adds the law checks at that temperature (``draws`` decodes,
    false-alarm rate ``alpha``, seeded by ``seed``)."""
    from dartree.testing.heads import PathHashHead

    check_number("temperature", temperature, lambda x: 0 <= x < math.inf, "expected a finite number >= 0")
    check_int("draws", draws, 100)
    if not isinstance(alpha, float) or not 0 < alpha < 1:
        raise ValueError(f"alpha: expected a float in (0, 1), got {alpha!r}")

    builders = _configured(builder, config)
    head = PathHashHead() if builders[0].needs_head else None
    budget, topk = (getattr(builders[0].config, name, None) for name in ("budget", "topk"))
    for k in range(examples):
        block = _block(seed + k)
        if topk is not None and topk > block.vocab_size:
            continue
        trees = []
        for b in builders:
            where = f"{b.name} ({b.backend}), example seed {seed + k}"
            tree = _built(b, block, head, where)
            try:
                tree.validate(gamma=block.gamma, budget=budget)
                check_decodable(tree, block, budget)
            except ValueError as e:
                raise AssertionError(f"{where}: the tree breaks the contract: {e}") from None
            again = _built(b, block, head, where)
            if again.canonical() != tree.canonical():
                raise AssertionError(f"{where}: not deterministic (the same block built twice gave two trees)")
            trees.append((b, tree))
        if len(trees) == 2 and trees[0][1].canonical() != trees[1][1].canonical():
            raise AssertionError(f"{builders[0].name}, example seed {seed + k}: fast != ref "
                                 f"({trees[1][1].canonical()} vs {trees[0][1].canonical()})")
    if decode:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)            # tiny models: one thread is ~10x faster than an oversubscribed pool
        try:
            _check_lossless(builders[-1], head, seed)
            if temperature > 0:
                _check_law(builders[-1], head, float(temperature), seed, draws, alpha)
        finally:
            torch.set_num_threads(threads)


def _built(builder: TreeBuilder, block: DraftBlock, head, where: str):
    """``builder.build``, an exception of the builder's own an AssertionError naming the builder and the seed."""
    try:
        return builder.build(block, head)
    except Exception as e:          # noqa: BLE001 (any error of a user's builder is a failed check)
        raise AssertionError(f"{where}: the builder raised {type(e).__name__}: {e}") from e


def _llama(vocab: int):
    """A tiny seeded Llama target of ``vocab`` tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                        attn_implementation="sdpa")).eval()


def _check_lossless(builder: TreeBuilder, head, seed: int) -> None:
    from dartree.decode import SpeculativeDecoder, generate_ar
    from dartree.testing.drafter import OracleDrafter

    model = _llama(64)
    decoder = SpeculativeDecoder(model, OracleDrafter(model, 4, demote=0.3, seed=1), builder, head)
    for prompt in (torch.tensor([3, 14, 15]), torch.tensor([9, 2, 6, 5, 35, 8, 9, 7])):
        try:
            got = decoder.generate(prompt, 12).tokens
        except Exception as e:      # noqa: BLE001
            raise AssertionError(f"{builder.name} ({builder.backend}), seed {seed}: greedy decoding raised "
                                 f"{type(e).__name__}: {e}") from e
        want = generate_ar(model, prompt, 12).tokens
        if not torch.equal(got, want):
            raise AssertionError(f"{builder.name} ({builder.backend}): decoding is not lossless: "
                                 f"{got.tolist()} != greedy AR {want.tolist()}")


_LAW_PROMPT = (1, 2, 3)


def _check_law(builder: TreeBuilder, head, temperature: float, seed: int, draws: int, alpha: float) -> None:
    from dartree.decode import SpeculativeDecoder
    from dartree.testing.drafter import SharpDrafter
    from dartree.testing.law import chi_square, continued, outcome_counts, round_law, target_law
    from dartree.verify.rejection import HEAD_DEPTHS, proposal_probs
    from dartree.verify.warp import Warp

    where = f"{builder.name} ({builder.backend}) at T={temperature:g}, seed {seed}"
    model, warp, gamma = _llama(6), Warp(temperature), 3
    with torch.no_grad():           # peaked next-token laws, and a tail
        model.lm_head.weight.mul_(30.0)
    prompt = torch.tensor(_LAW_PROMPT)
    # exact: one round on the builder's own tree after the prompt and its most likely next token
    drafter = SharpDrafter(model, gamma)
    drafter.start(1)
    drafter.append_rows(None, prompt[None], [prompt.shape[0]])
    with torch.no_grad():
        root = int(model(prompt[None]).logits[0, -1].argmax())
    block = drafter.draft_rows(torch.tensor([root]))
    shape = shape_of(builder)          # a static shape is what the decoder verifies (its tokens are drawn)
    tree = _built(builder, block, head, where) if shape is None else shape(block, gamma, block.root)
    count = int(tree.num_nodes[0])
    parents, depth = tree.parents[0, :count].tolist(), int(tree.depths[0, :count].max())
    head_depths = getattr(builder.config, "head_depths", HEAD_DEPTHS) or gamma
    # the draws' warp: the run's temperature times the builder's proposal_temperature (a Sequoia config's)
    drawn = Warp(temperature * getattr(builder.config, "proposal_temperature", 1.0))
    memo: dict = {}

    def p(path: tuple[int, ...]):
        if ("p", path) not in memo:
            with torch.no_grad():
                logits = model(torch.tensor([[*_LAW_PROMPT, root, *path]])).logits[0, -1]
            memo["p", path] = warp.logits(logits).double().softmax(-1).numpy()
        return memo["p", path]

    def state(path: tuple[int, ...]):
        if ("s", path) not in memo:
            memo["s", path] = head.initial_state(block)[:, None] if not path else \
                head.advance(block, len(path), state(path[:-1]), torch.tensor([[path[-1]]]))
        return memo["s", path]

    def q(path: tuple[int, ...]):
        d = len(path) + 1
        if head is not None and d <= head_depths:
            logits = head.logits(block, d, state(path), torch.arange(6)[None])[0, 0]
        else:
            logits = block.logits[0, d - 1]
        return proposal_probs(drawn, logits).double().numpy()

    law = continued(round_law(parents, p, q), p, depth + 1)
    truth = continued({(): 1.0}, p, depth + 1)
    worst = max(abs(law.get(k, 0.0) - truth.get(k, 0.0)) for k in set(law) | set(truth))
    if worst > 1e-9:
        raise AssertionError(f"{where}: one round of the rejection verifier on the builder's tree is not the "
                             f"target's law: an outcome's probability is off by {worst:.3g} (exact enumeration)")
    # statistically: the real decode, rows of generate_batch
    decoder = SpeculativeDecoder(model, SharpDrafter(model, gamma), builder, head)
    try:
        counts = outcome_counts(decoder, prompt, 3, draws, temperature=temperature, seed=seed, verifier="rejection")
    except Exception as e:          # noqa: BLE001
        raise AssertionError(f"{where}: decoding with the rejection verifier raised {type(e).__name__}: {e}") from e
    check = chi_square(counts, target_law(model, prompt, 3, warp), alpha)
    if not check.passed:
        raise AssertionError(f"{where}: decoded outputs do not follow the target's law: {check}")
