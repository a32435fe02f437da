"""Summarise a pytest-benchmark JSON of this suite: ref / fast medians per group, and the issue's ratios.

    .venv/bin/python benchmarks/summarize.py .benchmarks/run.json
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def medians(path: str) -> dict[str, dict[str, float]]:
    """group -> provider -> median seconds."""
    with open(path) as f:
        data = json.load(f)
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for bench in data["benchmarks"]:
        out[bench["group"]][bench["params"]["provider"]] = bench["stats"]["median"]
    return out


def main(path: str) -> None:
    groups = medians(path)
    print(f"{'group':58s} {'ref ms':>9s} {'fast ms':>9s} {'ref/fast':>8s}")
    for group in sorted(groups):
        ref, fast = groups[group].get("ref"), groups[group].get("fast")
        ratio = f"{ref / fast:8.2f}" if ref and fast else ""
        print(f"{group:58s} {ref * 1e3 if ref else float('nan'):9.2f} {fast * 1e3 if fast else float('nan'):9.2f} "
              f"{ratio}")

    def get(group: str, provider: str = "fast") -> float | None:
        return groups.get(group, {}).get(provider)

    print()
    for suffix in ("", " head=path-hash"):
        for vocab in (4096, 151936):
            heap = get(f"build sequential-heap V={vocab} B=64{suffix}")
            w4, w12, w32 = (get(f"build dartree-pruned V={vocab} B=64 W={w}{suffix}") for w in (4, 12, 32))
            if heap and w12:
                print(f"V={vocab}{suffix}: sequential-heap / dartree-pruned (B=64, W=12, fast) = {heap / w12:.2f}x")
            if w4 and w32:
                print(f"V={vocab}{suffix}: dartree-pruned W=32 / W=4 (B=64, fast) = {w32 / w4:.2f}x")


if __name__ == "__main__":
    main(sys.argv[1])
