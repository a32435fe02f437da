"""Benchmark harness: datasets, methods, the benchmark, sweeps, the budget tuner, tables and plots.

Entry points: :func:`dartree.eval.bench.run_bench`, :func:`dartree.eval.sweep.run_sweep`,
:func:`dartree.eval.tune.tune`, :func:`dartree.eval.simulate.simulate`, and the ``dartree`` command
line (:mod:`dartree.cli`).  Submodules import matplotlib only where they plot.
"""
