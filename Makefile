# Quick start: `make demo` (set up, then run the built-in demo) and `make test` (set up, then the suite).
PYTHON ?= python3
VENV ?= .venv
TORCH_CONSTRAINTS ?= constraints-cpu.txt
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test clean

install: $(STAMP)

$(STAMP): pyproject.toml $(TORCH_CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(if $(TORCH_CONSTRAINTS),--constraint $(TORCH_CONSTRAINTS)) -e ".[test,lora]"
	touch $(STAMP)

demo: install
	$(BIN)/pacs demo

test: install
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) runs .pytest_cache
