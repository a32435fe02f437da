"""The compiled host loops of the fast backend: exact candidate selection, the vocabulary normaliser
(against the torch formula and the torch twin), and the checks of direct calls."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dartree import DraftBlock, native
from dartree.fast import twins
from dartree.fast.host_builders import HostCandidates
from dartree.scoring import log_normalize_host, rest_logsumexp

#: tests of the C loops themselves; without the module only test_the_compiled_module_is_built fails, and says why
compiled = pytest.mark.skipif(not native.available(), reason="dartree._native is not built")


def candidates(x: torch.Tensor, topk: int, normalize: str = "candidates") -> HostCandidates:
    return HostCandidates(DraftBlock(logits=x, root=torch.zeros(x.shape[0], dtype=torch.int64)), topk, normalize)


def select(x: torch.Tensor, topk: int) -> tuple[np.ndarray, np.ndarray]:
    c = candidates(x, topk)
    return c.tokens, c.logits


def stable_topk(x: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    values, tokens = torch.sort(x, dim=-1, descending=True, stable=True)
    return tokens[..., :topk], values[..., :topk]


@compiled
@settings(max_examples=60, deadline=None)
@given(vocab=st.integers(1, 5000), topk_frac=st.floats(0, 1), seed=st.integers(0, 2**16),
       kind=st.sampled_from(["normal", "ties", "masked", "zeros"]))
def test_select_equals_a_stable_sort(vocab: int, topk_frac: float, seed: int, kind: str) -> None:
    """Two-stage selection == the reference's stable sort: ties by token id, -inf never before a finite
    logit, any vocabulary size (groups that do not divide V, K close to V)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, vocab, generator=g) * 2
    if kind == "ties":
        x = torch.randint(0, 3, x.shape, generator=g).float()
    if kind == "zeros":  # -0.0 ties with +0.0: token order decides
        x = torch.where(torch.rand(x.shape, generator=g) < 0.5, 0.0, -0.0)
    topk = max(1, int(topk_frac * vocab))
    if kind == "masked":
        masked = torch.rand(x.shape, generator=g) < 0.5
        masked[..., :topk] = False  # keep at least K finite logits per position
        x = x.masked_fill(masked, float("-inf"))
    tokens, values = select(x, topk)
    ref_tokens, ref_values = stable_topk(x, topk)
    assert np.array_equal(tokens, ref_tokens.numpy())
    assert np.array_equal(values.view(np.int32), ref_values.numpy().view(np.int32))  # -0.0 stays -0.0


@compiled
def test_select_on_a_large_vocabulary_with_ties_at_the_boundary() -> None:
    x = torch.zeros(1, 2, 151936)
    x[0, 0, ::7] = 1.0  # 21706 tied maxima: the K smallest ids win
    x[0, 1, 151930:] = 5.0  # the best tokens sit in the tail that no group covers
    tokens, _ = select(x, 64)
    ref, _ = stable_topk(x, 64)
    assert np.array_equal(tokens, ref.numpy())


@compiled
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_select_rejects_nan_and_plus_inf_anywhere(bad: float) -> None:
    for pos in (0, 4095, 4099):  # a group, the last group, the tail
        x = torch.randn(1, 2, 4100)
        x[0, 1, pos] = bad
        with pytest.raises(ValueError, match="NaN or \\+inf"):
            select(x, 8)


def test_rest_logsumexp_is_the_log_sum_exp_of_the_other_tokens() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, 3000, generator=g) * 4
    x[0, 0, 100:200] = float("-inf")
    tokens, _ = stable_topk(x, 16)
    rest = rest_logsumexp(x, tokens)
    exact = torch.logsumexp(x.double().scatter(-1, tokens, float("-inf")), -1)
    torch.testing.assert_close(rest.double(), exact, rtol=0, atol=2e-6)
    far = torch.full((1, 1, 10), -200.0)
    far[..., 0] = 0.0
    assert rest_logsumexp(far, torch.zeros(1, 1, 1, dtype=torch.int64)).item() == float("-inf")  # underflow


@compiled
@pytest.mark.parametrize("vocab_normalize", [True, False])
def test_compiled_candidates_equal_the_twin(vocab_normalize: bool) -> None:
    x = torch.randint(0, 4, (3, 5, 700), generator=torch.Generator().manual_seed(1)).float()
    c = candidates(x, 9, "vocab" if vocab_normalize else "candidates")
    twin = twins.topk_candidates(x, 9, vocab_normalize)
    rest = torch.full((3, 5), float("-inf")) if c.rest is None else torch.from_numpy(c.rest)
    for u, v in zip((c.tokens_t, torch.from_numpy(c.logits), rest, torch.from_numpy(c.log_q)), twin, strict=True):
        assert u.dtype == v.dtype and torch.equal(u, v)


@compiled
def test_select_reports_the_first_row_with_too_few_finite_logits() -> None:
    x = torch.randn(2, 3, 50)
    x[1, 2, 3:] = float("-inf")  # 3 finite logits at row 1, depth 3
    with pytest.raises(ValueError, match="row 1 depth 3 has 3 logits above -inf, fewer than topk=5"):
        select(x, 5)
    x[0, 0, 0] = float("nan")  # a NaN anywhere is reported first
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        select(x, 5)


def test_the_compiled_module_is_built() -> None:
    """CI must test the compiled host loops: ``pip install`` builds them (setup.py) where a C compiler is
    present; without one CPU builds run the tensorized builders, slower and with the same trees."""
    assert native.available(), "dartree._native was not built: run `pip install -e .` with a C compiler"
    with native.disabled():
        assert not native.enabled() and native.lib() is None
    assert native.enabled()


def test_a_stale_build_is_refused() -> None:
    """The module carries the hash of the C source it was built from; one built from another version of
    dartree/_native.c would run loops the Python side no longer expects, so dartree.native drops it."""
    assert not native.stale()  # built from the source beside it (CI builds it fresh)

    class OldBuild:
        SOURCE = "0" * 16

    assert native.stale(OldBuild())
    assert native.stale(object())  # a build without the hash


def _candidates_pair(x: torch.Tensor, topk: int):
    c = candidates(x, topk, "vocab")
    torch_rest = rest_logsumexp(x, c.tokens_t).numpy()
    return c.rest, torch_rest, c.log_q, c.tokens, c.logits


@compiled
@pytest.mark.parametrize("vocab", [1, 7, 8, 9, 100, 4098])
@pytest.mark.parametrize("kind", ["normal", "ties", "masked", "far", "wide"])
def test_compiled_normaliser_equals_the_torch_formula_bit_for_bit(vocab: int, kind: str) -> None:
    """rest_lse of the C loop == rest_logsumexp (the reference's torch ops): the exp2 polynomial, the
    fixed-point sum and the float64 log give the same float32 bits; log q too."""
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(3, 5, vocab, generator=g) * 3
    if kind == "ties":
        x = torch.randint(-2, 2, x.shape, generator=g).float()
    if kind == "masked":
        x[..., 1::3] = float("-inf")
    if kind == "far":  # every rest term below 2**-126: -inf
        x[..., 1:] -= 300.0
    if kind == "wide":
        x = x * 40.0
    topk = max(1, min(vocab - 1, 9)) if vocab > 1 else 1
    if kind == "masked":
        topk = min(topk, 1)
    rest, torch_rest, log_q, tokens, values = _candidates_pair(x, topk)
    if vocab == topk:  # no rest: log q over the candidates alone
        assert rest is None
        torch_rest = None
    else:
        assert np.array_equal(rest.view(np.int32), torch_rest.view(np.int32))
    expected = log_normalize_host(values, torch_rest)
    assert np.array_equal(log_q.view(np.int32), expected.view(np.int32))
    if kind == "far" and vocab > topk:
        assert np.all(rest == -np.inf)


@compiled
def test_compiled_normaliser_is_the_log_sum_exp_of_the_rest() -> None:
    g = torch.Generator().manual_seed(4)
    x = torch.randn(1, 3, 151936, generator=g) * 2
    rest, torch_rest, *_ = _candidates_pair(x, 64)
    assert np.array_equal(rest.view(np.int32), torch_rest.view(np.int32))
    tokens, _ = stable_topk(x, 64)
    exact = torch.logsumexp(x.double().scatter(-1, tokens, float("-inf")), -1)
    torch.testing.assert_close(torch.from_numpy(rest).double(), exact, rtol=0, atol=4e-6)


@pytest.mark.parametrize("bad", ["out of range", "cycle", "3-cycle", "count"])
def test_ancestor_mask_rejects_broken_parents(bad: str) -> None:
    from dartree.structure import ancestor_mask

    parents = torch.tensor([[-1, 0, 1, 2]])
    num_nodes = torch.tensor([4])
    if bad == "out of range":
        parents[0, 2] = 7
    if bad == "cycle":
        parents[0, 1], parents[0, 2] = 2, 1
    if bad == "3-cycle":      # never settles: was an IndexError
        parents[0, 1:] = torch.tensor([2, 3, 1])
    if bad == "count":
        num_nodes = torch.tensor([5])
    with pytest.raises(ValueError, match="parents: row 0 node|num_nodes: row 0"):
        ancestor_mask(parents, num_nodes)


@compiled
def test_compiled_best_first_refuses_more_nodes_than_the_trie() -> None:
    lib = native.lib()
    b, gamma, k, n = 1, 2, 2, 8  # the trie holds 1 + 2 + 4 = 7 nodes with the root
    lq = np.log(np.full((b, gamma, k), 0.5, dtype=np.float32))
    tokens = np.zeros((b, gamma, k), dtype=np.int64)
    outs = [np.empty((b, n), dtype=np.int64) for _ in range(4)]
    with pytest.raises(ValueError, match="larger than the trie"):
        lib.best_first(lq, b, gamma, k, None, n, tokens, np.zeros(b, dtype=np.int64), *outs,
                       np.empty((b, n), dtype=np.float32))


@compiled
def test_compiled_calls_check_their_buffers() -> None:
    lib = native.lib()
    x = np.zeros((2, 10), dtype=np.float32)

    def call(logits, tokens):
        return lib.candidates(logits, 2, 10, 3, 0, tokens, np.empty(6, dtype=np.float32), None,
                              np.empty(6, dtype=np.float32))

    with pytest.raises(ValueError, match="tokens: expected 6 items"):
        call(x, np.empty(5, dtype=np.int64))
    with pytest.raises(ValueError, match="logits: expected"):
        call(x.astype(np.float64), np.empty(6, dtype=np.int64))


@compiled
def test_compiled_calls_refuse_sizes_and_indices_they_cannot_trust() -> None:
    """Direct calls with made-up sizes or indices are errors, never out-of-bounds memory."""
    lib = native.lib()
    x = np.zeros((1, 8), dtype=np.float32)
    i64, f32 = (lambda n: np.empty(n, dtype=np.int64)), (lambda n: np.empty(n, dtype=np.float32))
    with pytest.raises(ValueError, match="the sizes overflow"):
        lib.candidates(x, 1 << 62, 4, 4, 0, i64(4), f32(4), None, f32(4))
    widths = np.array([1, -1], dtype=np.int64)
    with pytest.raises(ValueError, match="every width must be >= 0"):
        lib.select_tree(1, 2, widths, 0, i64(1), i64(1), i64(1), f32(1), None, i64(1), i64(1), i64(1), i64(1),
                        i64(1), f32(1))
    parents = np.array([0, 7], dtype=np.int64)  # depth 2's parent column 7 of a depth of width 1
    with pytest.raises(ValueError, match="outside the previous depth"):
        lib.select_tree(1, 2, np.array([1, 1], dtype=np.int64), 2, parents, np.zeros(2, np.int64), i64(2),
                        np.zeros(2, np.float32), None, np.zeros(1, np.int64), i64(3), i64(3), i64(3), i64(3), f32(3))
    with pytest.raises(ValueError, match="fewer than n_out"):  # rank -1: a filler, never selected
        lib.select_tree(1, 2, np.array([1, 1], dtype=np.int64), 2, np.zeros(2, np.int64), np.array([0, -1]), i64(2),
                        np.zeros(2, np.float32), None, np.zeros(1, np.int64), i64(3), i64(3), i64(3), i64(3), f32(3))

    lq = np.zeros((1, 2, 2), dtype=np.float32)
    order = np.array([[[0, 5], [1, 0]]], dtype=np.int64)
    with pytest.raises(ValueError, match="rank outside"):
        lib.best_first(lq, 1, 2, 2, order, 3, np.zeros((1, 2, 2), np.int64), np.zeros(1, np.int64), i64(3), i64(3),
                       i64(3), i64(3), f32(3))
    int32_widths = np.array([1, 1], dtype=np.int32)  # a refused buffer is released, not kept exported
    for _ in range(3):
        with pytest.raises(ValueError, match="widths: expected"):
            lib.select_tree(1, 2, int32_widths, 1, i64(2), i64(2), i64(2), f32(2), None, i64(1), i64(2), i64(2),
                            i64(2), i64(2), f32(2))
    int32_widths.resize(4, refcheck=True)  # raises if a buffer export were still held
