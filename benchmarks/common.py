"""What the benchmark suites share: the size grid, draft blocks, the GRU head, the timing call.

Sizes: by default only the smallest configuration of each group runs, so that the CI run
(``pytest benchmarks --benchmark-disable``) takes seconds; ``DARTREE_BENCH=full`` selects the whole
grid of the issue (B in {16, 64, 128}, W in {4, 12, 32}, V in {4096, 151936}, K=64, gamma=16).
``DARTREE_BENCH=goals`` selects only the groups the issue's goal ratios are read from (see
test_bench_builders.py).  ``DARTREE_BENCH_ROUNDS`` sets the timed rounds per benchmark (default 7).
"""

from __future__ import annotations

import functools
import os
import statistics
import time

import torch

from dartree import DraftBlock

FULL = os.environ.get("DARTREE_BENCH", "").lower() == "full"
GOALS = os.environ.get("DARTREE_BENCH", "").lower() == "goals"  # only the groups the ratios need
GAMMA, TOPK = 16, 64
HIDDEN, GRU_HIDDEN, EMB_DIM = 512, 512, 256  # the GRU head's size (Domino layout, see dartree.models.heads)

VOCABS = (4096, 151936) if FULL else (4096,)
BUDGETS = (16, 64, 128) if FULL else (16,)
WIDTHS = (4, 12, 32) if FULL else (4,)
ROUNDS = int(os.environ.get("DARTREE_BENCH_ROUNDS", "7"))  # timed rounds per benchmark (after one warm-up)


@functools.cache
def draft_block(vocab: int, batch: int = 1) -> DraftBlock:
    """A drafter output of realistic spread: logits ~ N(0, 2^2), hidden ~ N(0, 1)."""
    g = torch.Generator().manual_seed(vocab)
    return DraftBlock(logits=torch.randn(batch, GAMMA, vocab, generator=g) * 2.0,
                      root=torch.randint(0, vocab, (batch,), generator=g),
                      hidden=torch.randn(batch, GAMMA, HIDDEN, generator=g))


@functools.cache
def gru_head(vocab: int):
    """A random-weights ``dartree.models.GRUHead`` (H=512, G=512, E=256), no autograd."""
    from dartree.models.heads import GRUHead

    torch.manual_seed(vocab)
    embedding = torch.randn(vocab, HIDDEN) * 0.02
    head = GRUHead(hidden_size=HIDDEN, vocab_size=vocab, gru_hidden_dim=GRU_HIDDEN, emb_dim=EMB_DIM,
                   embedding=embedding)
    return head.requires_grad_(False).eval()


def run(benchmark, fn, *args):
    """Median-friendly timing: one warm-up, then ``ROUNDS`` rounds of one call each."""
    return benchmark.pedantic(fn, args=args, rounds=ROUNDS, iterations=1, warmup_rounds=1)


def interleaved_times(run, keys, inputs, reps: int) -> dict:
    """Seconds of ``run(key, x)`` per key and input, ``reps`` times: each repetition runs every key on one
    input before the next input, in the order of ``keys`` reversed every other repetition, so that a
    machine whose load drifts charges every key alike.  ``{key: [[seconds per repetition] per input]}``."""
    times = {key: [[] for _ in inputs] for key in keys}
    for rep in range(reps):
        order = list(keys) if rep % 2 == 0 else list(reversed(keys))
        for i, x in enumerate(inputs):
            for key in order:
                start = time.perf_counter()
                run(key, x)
                times[key][i].append(time.perf_counter() - start)
    return times


def checked_times(run, keys, inputs, refs, reps: int) -> dict:
    """:func:`interleaved_times` after one untimed pass that warms every key up and checks that its output
    on every input equals the reference (AR's tokens): a benchmark never times a wrong decode."""
    for key in keys:
        for x, ref in zip(inputs, refs, strict=True):
            assert torch.equal(run(key, x).cpu(), ref.cpu()), f"{key}: output differs from AR"
    return interleaved_times(run, keys, inputs, reps)


def paired_ratio(base: list, other: list) -> float:
    """The median over inputs of the median paired ratio ``base time / other time`` (same input, same
    repetition): the figure that stays put on a shared machine."""
    return statistics.median(statistics.median(b / t for b, t in zip(bs, ts, strict=True))
                             for bs, ts in zip(base, other, strict=True))


def print_pairs(names, times: dict, ways: tuple[str, str], headers: tuple[str, str], tokens: int) -> None:
    """One row per method: tokens/s of each of the two ``ways`` (``tokens`` over the summed per-input
    medians of ``times[(name, way)]``) and :func:`paired_ratio` of the first way's times to the second's."""
    first, second = ways
    print(f"{'method':16s} {headers[0]:>15s} {headers[1]:>15s} {'ratio':>7s}")
    for name in names:
        a, b = times[(name, first)], times[(name, second)]
        print(f"{name:16s} {tokens / sum(map(statistics.median, a)):15.1f} "
              f"{tokens / sum(map(statistics.median, b)):15.1f} {paired_ratio(a, b):7.3f}")
