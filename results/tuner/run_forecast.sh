#!/usr/bin/env bash
# The forecast of the tuned dartree-pruned against its measurement when both sides decode many prompts:
# at T=0 and T=1, HumanEval with 48 evaluation + 48 calibration prompts, and both datasets with 16 + 16
# (the held-out stdlib has 33 files), on one pinned core with one torch thread.  The grid is cut to
# B in {16, 32}, W in {8, 12} (the settings `make demo` chooses among) to keep each run at ~2-3 minutes.
# Run from a checkout's root; writes ${OUT}/forecast-tT-{he48,both16}.  docs/results.md (tuner section).
set -euo pipefail
export OMP_NUM_THREADS=1 PYTHONPATH=$PWD DARTREE_CACHE_DIR=${DARTREE_CACHE_DIR:-/tmp/dartree-tuner-cache}
PY=${PY:-.venv/bin/python}
OUT=${OUT:-results/tuner}
CORE=${CORE:-0}
GRID=(--methods dartree-pruned:budget=auto,width=auto --tune-budgets 16,32 --tune-widths 8,12 --max-new-tokens 64
      --threads 1 --force)
for t in 0 1; do
  taskset -c "$CORE" "$PY" -m dartree.cli bench "${GRID[@]}" --temperatures "$t" --datasets humaneval \
    --num-prompts 48 --calibration-prompts 48 --out "$OUT/forecast-t$t-he48"
  taskset -c "$CORE" "$PY" -m dartree.cli bench "${GRID[@]}" --temperatures "$t" --datasets humaneval stdlib \
    --num-prompts 16 --calibration-prompts 16 --out "$OUT/forecast-t$t-both16"
done
date -u
