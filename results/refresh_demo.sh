#!/usr/bin/env bash
# Refresh the figures of docs/results.md: the `make demo` benchmark and the dartree-fixed quota
# comparison (issue 11 item 16), on the bundled zoo, one torch thread.  Run from the repository root
# with the project's venv; writes results/demo/ and results/fixed-quota/ (overwritten).  About 2-5 min
# on an idle 2-core machine.  Then copy the tables of results/demo/results.md and
# results/fixed-quota/results.md into docs/results.md with this script's date and commands.
set -euo pipefail
PY=${PY:-.venv/bin/python}
export OMP_NUM_THREADS=1 PYTHONPATH=${PYTHONPATH:-$PWD}
rm -rf results/demo results/fixed-quota
# 1. exactly `make demo` (dartree bench --preset demo), into results/demo
$PY -m dartree.cli bench --preset demo --out results/demo
# 2. dartree-fixed at the preset's B=16 (quota [2, 1, 1, ...] at gamma=15) beside the paper's B=64
#    (quota [5, 5, 5, 5, 4, ...]: about 4 nodes per depth), with ddtree at both budgets for scale
$PY -m dartree.cli bench --threads 1 --methods ddtree:budget=16 dartree-fixed:budget=16 ddtree:budget=64 \
    dartree-fixed:budget=64 --datasets humaneval stdlib --temperatures 0 --num-prompts 3 \
    --max-new-tokens 64 --out results/fixed-quota
$PY -c "from dartree.fast.widths import quota_widths as q; print('quota B=16:', q(16, 64, 15)); print('quota B=64:', q(64, 64, 15))"
date -u
