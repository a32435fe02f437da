#!/usr/bin/env bash
# Refresh the single-request figures of docs/results.md and docs/zoo.md: the `make demo` benchmark,
# the same methods at T=1, the dartree-fixed quota comparison (issue 11 item 16) and the paper's
# budget B=64 at T=0 and T=1, on the bundled zoo, one torch thread.  Run from the repository root
# with the project's venv; writes results/demo/, results/demo-t1/, results/fixed-quota/ and
# results/zoo-b64/ (overwritten).  About 6 min on an idle 2-core machine.  Then copy their tables
# into the docs with this script's date and commands.
set -euo pipefail
PY=${PY:-.venv/bin/python}
export OMP_NUM_THREADS=1 PYTHONPATH=${PYTHONPATH:-$PWD}
rm -rf results/demo results/demo-t1 results/fixed-quota results/zoo-b64
# 1. exactly `make demo` (dartree bench --preset demo), into results/demo
$PY -m dartree.cli bench --preset demo --out results/demo
# 2. dartree-fixed at the preset's B=16 (quota [2, 1, 1, ...] at gamma=15) beside the paper's B=64
#    (quota [5, 5, 5, 5, 4, ...]: about 4 nodes per depth), with ddtree at both budgets for scale
$PY -m dartree.cli bench --threads 1 --methods ddtree:budget=16 dartree-fixed:budget=16 ddtree:budget=64 \
    dartree-fixed:budget=64 --datasets humaneval stdlib --temperatures 0 --num-prompts 3 \
    --max-new-tokens 64 --out results/fixed-quota
# 3. the demo's methods at T=1 with both verifiers (matching: the keyed sampler of AR, lossless per token;
#    rejection: sampled trees, lossless in law) and the tuner ranking both
$PY -m dartree.cli bench --preset demo --temperatures 1 --methods chain ddtree corrected-chain dartree-fixed \
    dartree-pruned chain:verifier=rejection ddtree:verifier=rejection corrected-chain:verifier=rejection \
    dartree-fixed:verifier=rejection dartree-pruned:verifier=rejection \
    dartree-pruned:budget=auto,width=auto,beta=auto --out results/demo-t1
# 4. the paper's budget B=64 (W=12 for the pruned tree), T=0 and T=1: the ordering of issue 12
$PY -m dartree.cli bench --threads 1 --methods ddtree:budget=64 corrected-chain dartree-fixed:budget=64 \
    dartree-pruned:budget=64,width=12 --datasets humaneval stdlib --temperatures 0 1 --num-prompts 3 \
    --max-new-tokens 64 --out results/zoo-b64
$PY -c "from dartree.fast.widths import quota_widths as q; print('quota B=16:', q(16, 64, 15)); print('quota B=64:', q(64, 64, 15))"
date -u
