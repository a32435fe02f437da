"""Benchmark harness: datasets, methods, the benchmark (:mod:`~dartree.eval.bench`), sweeps, the budget tuner
(:mod:`~dartree.eval.tune`), replays (:mod:`~dartree.eval.simulate`), tables and plots; the command line is
:mod:`dartree.cli`.  Submodules import matplotlib only where they plot."""
