"""The decoder's head proxy checks what a correction head returns where it enters a builder; a direct
``TreeBuilder.build(block, head)`` checks the same, with the same messages."""

from __future__ import annotations

import pytest
import torch

from dartree import DraftBlock, make_builder
from dartree.builders import BuilderSpec, ChainConfig, TreeBuilder
from dartree.fast import ops
from dartree.models import GRUHead
from dartree.testing import PathHashHead
from dartree.timing import TimedHead

#: how a head reaches the builder: through the decoder's proxy, or as given to a direct build
WRAPS = {"decoder": TimedHead, "direct": lambda head: head}


def block(hidden: int = 8, vocab: int = 12) -> DraftBlock:
    g = torch.Generator().manual_seed(0)
    return DraftBlock(logits=torch.randn(2, 3, vocab, generator=g), root=torch.tensor([1, 2]),
                      hidden=torch.randn(2, 3, hidden, generator=g))


class Edited(PathHashHead):
    """PathHashHead with one method's output replaced by ``fix(output)`` (no fused call: both backends
    then call ``advance`` and ``logits``)."""

    advance_logits = None

    def __init__(self, method: str, fix) -> None:
        super().__init__()
        self.method, self.fix = method, fix

    def initial_state(self, block):
        out = super().initial_state(block)
        return self.fix(out) if self.method == "initial_state" else out

    def logits(self, block, depth, states, candidates):
        out = super().logits(block, depth, states, candidates)
        return self.fix(out) if self.method == "logits" else out

    def advance(self, block, depth, states, tokens):
        out = super().advance(block, depth, states, tokens)
        return self.fix(out) if self.method == "advance" else out


def build(head, backend: str = "ref", blk: DraftBlock | None = None, wrap=TimedHead):
    blk = block() if blk is None else blk
    return make_builder("dartree-pruned", backend, budget=6, width=3, topk=4).build(blk, wrap(head))


@pytest.mark.parametrize("wrap", WRAPS)
@pytest.mark.parametrize("backend", ["ref", "fast"])
@pytest.mark.parametrize("method,fix,message", [
    ("initial_state", lambda s: s.tolist(), r"^head.initial_state: returned list, expected a torch.Tensor"),
    ("advance", lambda s: s.tolist(), r"^head.advance: returned list, expected a torch.Tensor"),
    ("advance", lambda s: torch.cat([s, s], -1), r"^head.advance: returned shape \[\d, \d, 4\], expected "
                                                  r"\[\d, \d, 2\] \(the state width S of initial_state must not"),
    ("advance", lambda s: s[0], r"^head.advance: returned shape"),
    ("initial_state", lambda s: s[None], r"^head.initial_state: returned shape \[1, \d, 2\], expected \[\d, 'S'\]"),
    ("logits", lambda x: x.long(), r"^head.logits: returned torch.int64 logits, expected a floating dtype"),
    ("logits", lambda x: x > 0, r"^head.logits: returned torch.bool logits"),
    ("logits", lambda x: x[:, :, :1], r"^head.logits: returned logits of shape \[\d, 1, 1\], expected \[b, m, K\]"),
    ("logits", lambda x: x.to("meta"), r"^head.logits: returned a tensor on meta, the block is on cpu"),
])
def test_bad_head_output_is_refused(method: str, fix, message: str, backend: str, wrap: str) -> None:
    with pytest.raises(ValueError, match=message):
        build(Edited(method, fix), backend, wrap=WRAPS[wrap])


@pytest.mark.parametrize("wrap", WRAPS)
def test_fused_output_is_checked(wrap: str) -> None:
    class Fused(PathHashHead):
        def advance_logits(self, block, depth, states, tokens, candidates):
            new, logits = super().advance_logits(block, depth, states, tokens, candidates)
            return new[..., :1], logits

    with pytest.raises(ValueError, match=r"^head.advance_logits: returned shape .* must not change"):
        build(Fused(), "fast", wrap=WRAPS[wrap])


def test_a_direct_build_wraps_a_bare_head_once_and_the_decoders_proxy_not_again() -> None:
    """perf: the decoder's proxy has checked its head, so ``build`` hands it on as it is."""
    seen = []

    def spy(blk, head, config):
        seen.append(head)
        return make_builder("chain").build(blk)

    builder = TreeBuilder(BuilderSpec(name="spy", config_cls=ChainConfig, needs_head=True, ref=spy), "ref",
                          ChainConfig())
    bare, proxy = PathHashHead(), TimedHead(PathHashHead())
    builder.build(block(), bare)
    builder.build(block(), proxy)
    assert type(seen[0]) is not PathHashHead and isinstance(seen[0], TimedHead) and seen[0].head is bare
    assert seen[1] is proxy
    assert hasattr(seen[0], "advance_logits")                    # the fused call stays visible to builders


def test_a_direct_build_gives_the_same_tree_as_through_the_proxy() -> None:
    for backend in ("ref", "fast"):
        builder = make_builder("dartree-pruned", backend, budget=6, width=3, topk=4)
        got, want = builder.build(block(), PathHashHead()), builder.build(block(), TimedHead(PathHashHead()))
        assert got.canonical() == want.canonical() and torch.equal(got.scores, want.scores)


def test_head_on_another_device_and_hidden_width() -> None:
    head = GRUHead(hidden_size=8, vocab_size=12, gru_hidden_dim=4, emb_dim=6)
    head.set_embedding(torch.randn(12, 8))
    build(head)                                                       # fine as it is
    for backend in ("ref", "fast"):     # the fast builders prepare the block before the initial state
        with pytest.raises(ValueError, match=r"^block: hidden has width 5, but GRUHead expects hidden_size=8"):
            build(head, backend, blk=block(hidden=5))
    with pytest.raises(ValueError, match=r"^head: GRUHead's parameters are on meta, the block on cpu"):
        TimedHead(head.to("meta"), "cpu")
    proxy = TimedHead(GRUHead(hidden_size=8, vocab_size=12, gru_hidden_dim=4, emb_dim=6), "cpu")
    proxy.head.to("meta")                                             # moved after the decoder was built
    with pytest.raises(ValueError, match=r"^head: GRUHead's parameters are on meta"):
        make_builder("dartree-pruned", budget=6, width=3, topk=4).build(block(), proxy)


class Prepared(PathHashHead):
    """PathHashHead with a ``prepare_block`` whose result is ``make(self, block, candidates)``."""

    def __init__(self, make) -> None:
        super().__init__()
        self.make = make

    def prepare_block(self, block, candidates):
        return self.make(self, block, candidates)


class Steps:
    def __init__(self, head, block, candidates, fix=lambda x: x) -> None:
        self.head, self.block, self.candidates, self.fix = head, block, candidates, fix

    def logits(self, depth, states):
        return self.fix(self.head.logits(self.block, depth, states, self.candidates[:, depth - 1]))

    def advance_logits(self, depth, states, tokens):
        return self.head.advance_logits(self.block, depth, states, tokens, self.candidates[:, depth])


class InPlace(PathHashHead):
    """PathHashHead that edits an argument in place after each call: ``what`` is "states", "tokens",
    "candidates" or "block" (the drafter's logits); ``calls``: "protocol" (advance and logits), "fused"
    (with advance_logits) or "prepared" (through prepare_block's steps)."""

    def __init__(self, calls: str, what: str = "states") -> None:
        super().__init__()
        self.calls, self.what = calls, what
        if calls == "protocol":
            self.advance_logits = None

    def prepare_block(self, block, candidates):
        return Steps(self, block, candidates) if self.calls == "prepared" else None

    def _edit(self, block, states, tokens=None, candidates=None):
        edited = {"states": states, "tokens": tokens, "candidates": candidates, "block": block.logits}[self.what]
        if edited is not None:
            edited.zero_() if not edited.is_floating_point() else edited.mul_(0.0)

    def logits(self, block, depth, states, candidates):
        out = super().logits(block, depth, states, candidates)
        self._edit(block, states, candidates=candidates)
        return out

    def advance(self, block, depth, states, tokens):
        out = super().advance(block, depth, states, tokens)
        self._edit(block, states, tokens=tokens)
        return out

    def advance_logits(self, block, depth, states, tokens, candidates):
        out = super().advance_logits(block, depth, states, tokens, candidates)
        self._edit(block, states, tokens, candidates)
        return out


@pytest.mark.parametrize("wrap", WRAPS)
@pytest.mark.parametrize("backend", ["ref", "fast"])
@pytest.mark.parametrize("calls", ["protocol", "fused", "prepared"])
@pytest.mark.parametrize("what", ["states", "tokens", "candidates", "block"])
def test_a_head_editing_its_arguments_in_place_cannot_change_the_tree(wrap: str, backend: str, calls: str,
                                                                      what: str) -> None:
    """A user head gets copies of the builder's states, tokens, candidates and block: zeroing its states
    used to change the states kept for other branches, and so the tree (both backends); zeroing the tokens
    made the fast builder's tree repeat a sibling token (a trusted builder's tree outside the contract)."""
    g = torch.Generator().manual_seed(3)
    blk = DraftBlock(logits=torch.randn(1, 8, 40, generator=g), root=torch.tensor([5]))
    logits = blk.logits.clone()
    builder = make_builder("dartree-pruned", backend, budget=12, width=4, topk=6)
    want = builder.build(blk, PathHashHead())
    got = builder.build(blk, WRAPS[wrap](InPlace(calls, what)))
    got.validate(8, 12)
    assert torch.equal(blk.logits, logits)          # the caller's block (the decoder's) is not the head's
    if what != "block":   # the head reads its edited copy of the block in its next calls: its outputs change
        assert got.canonical() == want.canonical() and torch.equal(got.scores, want.scores)


@pytest.mark.parametrize("timed", [False, True])
@pytest.mark.parametrize("make, match", [
    (lambda h, b, c: object(), r"prepare_block: returned object, which lacks \['logits', 'advance_logits'\]"),
    (lambda h, b, c: Steps(h, b, c, fix=lambda x: x[:, :, :1]), r"prepare_block\(\.\.\.\)\.logits: returned"),
    (lambda h, b, c: Steps(h, b, c, fix=lambda x: "scores"), r"prepare_block\(\.\.\.\)\.logits: returned str"),
])
def test_what_prepare_block_returns_is_checked_where_it_enters(make, match, timed):
    head = Prepared(make)
    for kernels in ("host", "torch"):
        with ops.force_backend(kernels), pytest.raises(ValueError, match=match):
            make_builder("dartree-pruned", backend="fast", budget=4, width=2, topk=3).build(
                block(), TimedHead(head) if timed else head)


class NarrowGRU(GRUHead):
    """A user's GRUHead subclass whose prepared ``logits`` drop all candidates but the first."""

    def prepare_block(self, block, candidates):
        return Steps(self, block, candidates, fix=lambda x: x[:, :, :1])


def test_only_the_bundled_head_classes_skip_the_checks_of_prepared_calls():
    """The proxy trusts dartree's own GRUHead / MarkovHead (exact classes); a subclass is user code."""
    from dartree.models import MarkovHead

    gru, narrow = (cls(hidden_size=8, vocab_size=12, gru_hidden_dim=4, emb_dim=6) for cls in (GRUHead, NarrowGRU))
    assert all(TimedHead(h)._trusted for h in (gru, MarkovHead(12, 3)))
    assert not any(TimedHead(h)._trusted for h in (narrow, PathHashHead()))
    narrow.set_embedding(torch.randn(12, 8))
    with pytest.raises(ValueError, match=r"prepare_block\(\.\.\.\)\.logits: returned logits of shape"):
        make_builder("dartree-pruned", backend="fast", budget=4, width=2, topk=3).build(block(), TimedHead(narrow))


def test_a_prepare_block_that_declines_gives_the_protocol_calls():
    """``None`` from prepare_block: the builder makes the protocol calls (same tree as without it)."""
    declining, plain = Prepared(lambda h, b, c: None), PathHashHead()
    builder = make_builder("dartree-pruned", backend="fast", budget=5, width=2, topk=3)
    got, want = builder.build(block(), TimedHead(declining)), builder.build(block(), plain)
    assert got.canonical() == want.canonical() and torch.equal(got.scores, want.scores)
    steps = Prepared(lambda h, b, c: Steps(h, b, c))
    assert builder.build(block(), TimedHead(steps)).canonical() == want.canonical()
