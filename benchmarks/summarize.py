"""Summarise a pytest-benchmark JSON of this suite: medians per group and provider, and the goal ratios.

    .venv/bin/python benchmarks/summarize.py run.json
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

PROVIDERS = ("ref", "fast", "host")


def load(path: str) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """group -> provider -> median seconds, and group -> provider -> head share (GRU groups)."""
    with open(path) as f:
        data = json.load(f)
    med: dict[str, dict[str, float]] = defaultdict(dict)
    share: dict[str, dict[str, float]] = defaultdict(dict)
    for bench in data["benchmarks"]:
        provider = bench["params"]["provider"]
        med[bench["group"]][provider] = bench["stats"]["median"]
        if "head_share" in bench.get("extra_info", {}):
            share[bench["group"]][provider] = bench["extra_info"]["head_share"]
    return med, share


def main(path: str) -> None:
    groups, share = load(path)
    print(f"{'group':58s}" + "".join(f" {p + ' ms':>9s}" for p in PROVIDERS) + f" {'ref/fast':>8s}")
    for group in sorted(groups):
        row = groups[group]
        cells = "".join(f" {row[p] * 1e3:9.2f}" if p in row else f" {'':9s}" for p in PROVIDERS)
        ratio = f" {row['ref'] / row['fast']:8.2f}" if "ref" in row and "fast" in row else ""
        print(f"{group:58s}{cells}{ratio}")

    def get(group: str, provider: str = "fast") -> float | None:
        return groups.get(group, {}).get(provider)

    def line(text: str, value: float | None, goal: str) -> None:
        print(f"  {text:62s} {'n/a' if value is None else f'{value:6.2f}x':>8s}   goal {goal}")

    print("\nGoal ratios (medians of this run):")
    for vocab in (4096, 151936):
        group = f"ddtree+mask V={vocab} B=64 gamma=15"
        host, fast = get(group, "host"), get(group)
        line(f"ddtree+mask V={vocab}: host / fast", host / fast if host and fast else None, ">= 1.5x")
    for head in ("", " head=path-hash"):
        name = "GRU" if not head else "PathHashHead"
        heap = get(f"build sequential-heap V=4096 B=64{head}")
        w4, w12, w32 = (get(f"build dartree-pruned V=4096 B=64 W={w}{head}") for w in (4, 12, 32))
        ref12 = get(f"build dartree-pruned V=4096 B=64 W=12{head}", "ref")
        line(f"{name}: sequential-heap / dartree-pruned W=12", heap / w12 if heap and w12 else None,
             ">= 2.2x" if not head else ">= 3x")
        line(f"{name}: dartree-pruned W=32 / W=4", w32 / w4 if w32 and w4 else None,
             "<= 1.5x" if not head else "<= 1.2x")
        line(f"{name}: dartree-pruned ref / fast (W=12)", ref12 / w12 if ref12 and w12 else None, ">= 3x")
    gru_share = share.get("build dartree-pruned V=4096 B=64 W=12", {}).get("fast")
    if gru_share is not None:
        print(f"  {'GRU: dartree-pruned W=12 fast, time outside head calls':62s} {1 - gru_share:7.1%}   goal <= 25%")
    chain = get("build chain V=4096")
    if chain:
        print(f"  {'chain V=4096 fast':62s} {chain * 1e3:6.3f} ms")


if __name__ == "__main__":
    main(sys.argv[1])
