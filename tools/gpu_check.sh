#!/usr/bin/env bash
# The GPU checks on a lent machine, from the repository's root (docs/gpu.md, "Running the GPU checks
# on a lent machine"): installs the wheels of .gpu-wheels/ (`make gpu-wheels`, done beforehand where
# PyPI is reachable) and this checkout's pacs into /tmp/site, and runs the stages named, each under a
# wall-clock limit, its output under $OUT:
#
#   tools/gpu_check.sh [--dry-run] STAGE...     # STAGE: suite, bench, trl
#
#   suite  the GPU suite (tests/gpu, -m gpu)                          ~ up to 8 min: a call of its own
#   bench  async_rollouts.py and continuous_batching.py on the GPU    ~ up to 6.5 min
#   trl    vs_trl.py --device cuda against TRL in this same python     ~ up to 8 min: a call of its own
#
# The limits keep a stage inside one device call (10 minutes at most). --dry-run prints the commands
# and runs none. A stage that fails leaves its log; the script exits with the last failure's status.
set -u -o pipefail
export PYTHONUNBUFFERED=1
# Nothing outside a lent machine can be reached: a hub look-up fails at once instead of waiting.
export HF_HUB_OFFLINE=1
# The benchmarks' tables (rich) go to log files: without a terminal rich would fold them into 80 columns.
export COLUMNS=${COLUMNS:-220}

dry_run=false
stages=()
for argument in "$@"; do
  case $argument in
    --dry-run) dry_run=true ;;
    suite | bench | trl) stages+=("$argument") ;;
    *) echo "gpu_check.sh: unknown argument '$argument'; give --dry-run and stages among: suite bench trl" >&2; exit 2 ;;
  esac
done
if [ ${#stages[@]} -eq 0 ]; then
  echo "gpu_check.sh: no stage given; give one or more of: suite bench trl (and --dry-run to print the commands)" >&2
  exit 2
fi

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
SITE=/tmp/site
if $dry_run; then OUT=${OUT:-'$OUT'}; else OUT=${OUT:-$(mktemp -d -t gpu-check-XXXXXX)}; fi
# pacs is installed, not run from src/: its built-in configs (`builtin:demo`, ...) are the package
# pacs.configs, which pyproject.toml maps to the top-level configs/ folder only in an install. The
# build uses the image's setuptools (--no-build-isolation: there is no index to fetch one from).
export PYTHONPATH="$SITE"
# vs_trl.py's shapes: 0.5b alone, since both shapes' runs may pass the stage's limit; VS_TRL_SHAPES=1.5b
# runs the other in a call of its own.
VS_TRL_SHAPES=${VS_TRL_SHAPES:-0.5b}
# Its runs (`--runs`, their numbers in vs_trl.py's RUNS): all by default, in the order of their value;
# VS_TRL_RUNS=4,5,6 makes in a later call the ones a stage's limit cut.
VS_TRL_RUNS=${VS_TRL_RUNS:-}
status=0

# step SECONDS LOG COMMAND...: COMMAND under a limit of SECONDS, its output on the screen and in $OUT/LOG.
step() {
  local seconds=$1 log=$2
  shift 2
  echo "+ timeout $seconds $* > $OUT/$log"
  if ! $dry_run; then
    timeout --kill-after=15 "$seconds" "$@" 2>&1 | tee "$OUT/$log"
    local code=$?
    if [ "$code" -ne 0 ]; then
      local why=""
      [ "$code" -eq 124 ] || [ "$code" -eq 137 ] && why=", stopped at its limit of $seconds s"
      echo "gpu_check.sh: '$*' exited with $code$why" | tee -a "$OUT/$log"
      status=$code
    fi
  fi
}

echo "+ $PYTHON -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade --target $SITE .gpu-wheels/*.whl ."
if ! $dry_run; then
  compgen -G ".gpu-wheels/*.whl" > /dev/null || { echo "gpu_check.sh: no wheels in .gpu-wheels/: run 'make gpu-wheels' here and carry .gpu-wheels" >&2; exit 1; }
  PIP_ROOT_USER_ACTION=ignore "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade --target "$SITE" .gpu-wheels/*.whl . || exit 1
  {
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo "no .git here; when the wheels were fetched: $(cat .gpu-wheels/COMMIT 2>/dev/null || echo unknown)")"
    nvidia-smi -L
    "$PYTHON" -c "import sys, torch, transformers, trl, datasets, pydantic; print('python', sys.version.split()[0]); print(*(f'{m.__name__} {m.__version__}' for m in (torch, transformers, trl, datasets, pydantic)), sep=', '); print('cuda available:', torch.cuda.is_available()); from transformers.utils import is_flash_attn_2_available; print('flash attention 2 (continuous batching with CUDA graphs):', is_flash_attn_2_available())"
    # Only the lines naming a carried package: the image's own mismatches are not ours to judge.
    carried=$(for wheel in .gpu-wheels/*.whl; do basename "$wheel" | cut -d- -f1; done | sed 's/[-_.]/[-_.]/g' | paste -sd'|')
    echo "pip check, lines naming a carried package:"
    { "$PYTHON" -m pip check 2>&1 || true; } | grep -iE "(^|[ ,])($carried)[ ,<>=!~]" || echo "  none"
  } 2>&1 | tee "$OUT/environment.txt"
fi

for stage in "${stages[@]}"; do
  case $stage in
    suite)
      step 480 gpu-suite.log "$PYTHON" -m pytest tests/gpu -m gpu -p no:xdist -ra
      ;;
    bench)
      # pacs train computes on the GPU when there is one: async_rollouts.py needs no device flag. Its 4
      # runs of at most 60 s each fit the limit, so that a run that hangs still leaves the others' table.
      step 270 async-rollouts.log "$PYTHON" benchmarks/async_rollouts.py --workloads demo,100m --staleness 0,1 --timeout 60 --json "$OUT/async-rollouts.json"
      step 120 continuous-batching.log "$PYTHON" benchmarks/continuous_batching.py --device cuda --shapes demo,100m --repeats 2
      ;;
    trl)
      step 480 vs-trl.log "$PYTHON" benchmarks/vs_trl.py --device cuda --shapes "$VS_TRL_SHAPES" --steps 3 --trl-python "$PYTHON" --results "$OUT/vs-trl-$VS_TRL_SHAPES" ${VS_TRL_RUNS:+--runs "$VS_TRL_RUNS"}
      ;;
  esac
done
$dry_run || echo "gpu_check.sh: logs in $OUT: $(ls "$OUT" | paste -sd' ')"
exit $status
