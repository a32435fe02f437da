#!/usr/bin/env bash
# The demo's tuned method (dartree-pruned:budget=auto,width=auto) at T=0 and T=1, once per argument
# (a run label), on one pinned core with one torch thread: `make demo` and its T=1 variant.  Run from
# a checkout's root; each run writes ${OUT}/demo-t0-LABEL and ${OUT}/demo-t1-LABEL.  The runs of
# docs/results.md (tuner section) came from a `git archive` of f7f08ec, labels a b c d.
set -euo pipefail
export OMP_NUM_THREADS=1 PYTHONPATH=$PWD DARTREE_CACHE_DIR=${DARTREE_CACHE_DIR:-/tmp/dartree-tuner-cache}
PY=${PY:-.venv/bin/python}
OUT=${OUT:-results/tuner}
for rep in "$@"; do
  taskset -c 0 "$PY" -m dartree.cli bench --preset demo --out "$OUT/demo-t0-$rep" --force
  taskset -c 0 "$PY" -m dartree.cli bench --preset demo --temperatures 1 --out "$OUT/demo-t1-$rep" --force
done
date -u
