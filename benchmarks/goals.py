"""The issue's goal ratios, measured side by side: every pair of a ratio timed in interleaved rounds.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.goals [ROUNDS]

pytest-benchmark times one group after the other, so on a shared machine a change of load between
two groups shows up in their ratio.  Here the calls of a ratio alternate round by round (one thread,
after one warm-up call each) and the ratio is taken between medians.  Same configurations as the
``DARTREE_BENCH=goals`` groups of ``test_bench_builders.py``.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from benchmarks.common import TOPK, draft_block, gru_head
from benchmarks.host_ddtree import build_ddtree
from benchmarks.test_bench_builders import ddtree_block
from dartree import make_builder
from dartree.testing import PathHashHead
from dartree.timing import TimedHead


def interleaved(calls: dict, rounds: int) -> dict[str, float]:
    """Median seconds of each call, the calls alternating round by round."""
    for fn in calls.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def build(name: str, backend: str, head=None, vocab: int = 4096, **cfg):
    builder = make_builder(name, backend=backend, topk=TOPK, **cfg)
    block = draft_block(vocab)
    return lambda: builder.build(block, head)


def main(rounds: int) -> None:
    torch.set_num_threads(1)
    rows = []

    def report(text: str, num: float, den: float, goal: str) -> None:
        rows.append(f"| {text} | {num * 1e3:.2f} / {den * 1e3:.2f} ms | {num / den:.2f}x | {goal} |")
        print(rows[-1], flush=True)

    for vocab in (4096, 151936):
        block = ddtree_block(vocab)
        fast = make_builder("ddtree", backend="fast", budget=64, topk=TOPK)
        m = interleaved({"host": lambda b=block: build_ddtree(b.logits[0], 64, TOPK),
                         "fast": lambda b=block, f=fast: f.build(b).ancestor_mask()}, rounds)
        report(f"ddtree build + mask V={vocab}: host / fast", m["host"], m["fast"], ">= 1.5x")
    for head_name, head in (("GRU H=512", gru_head(4096)), ("PathHashHead", PathHashHead())):
        timed = TimedHead(head)
        m = interleaved({"heap": build("sequential-heap", "fast", head, budget=64),
                         "w4": build("dartree-pruned", "fast", head, budget=64, width=4),
                         "w12": build("dartree-pruned", "fast", head, budget=64, width=12),
                         "w32": build("dartree-pruned", "fast", head, budget=64, width=32),
                         "ref12": build("dartree-pruned", "ref", head, budget=64, width=12)}, rounds)
        gru = head_name.startswith("GRU")
        report(f"{head_name}: sequential-heap / dartree-pruned W=12", m["heap"], m["w12"],
               ">= 2.2x" if gru else ">= 3x")
        report(f"{head_name}: dartree-pruned W=32 / W=4", m["w32"], m["w4"], "<= 1.5x" if gru else "<= 1.2x")
        report(f"{head_name}: dartree-pruned ref / fast (W=12)", m["ref12"], m["w12"], ">= 3x")
        if gru:
            fn = build("dartree-pruned", "fast", timed, budget=64, width=12)
            fn()
            timed.seconds, total = 0.0, 0.0
            for _ in range(rounds):
                start = time.perf_counter()
                fn()
                total += time.perf_counter() - start
            outside = 1 - timed.seconds / total
            rows.append(f"| GRU: dartree-pruned W=12, time outside head calls | | {outside:.1%} | <= 25% |")
            print(rows[-1], flush=True)
    m = interleaved({"chain": build("chain", "fast"), "ref": build("chain", "ref")}, rounds)
    rows.append(f"| chain V=4096 fast (ref) | {m['chain'] * 1e3:.3f} ({m['ref'] * 1e3:.2f}) ms | | cheap |")
    print(rows[-1], flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 15)
