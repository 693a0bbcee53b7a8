"""Run the tests that use the warm-started tiny model against warm models built with other thread
counts and seeds, and print a table.

Every machine builds `builtin:tiny-arithmetic` for itself (`make test` on one thread, seed 0), and
its weights, so every sample drawn from it, follow that CPU's float rounding and thread count. The
tests that use it (marked `warm_model` by tests/conftest.py) must pass whichever model they get:
this script builds the model with each thread count and seed asked for, evaluates its pass@1, and
runs those tests against it (`PACS_TEST_WARM_MODEL`), in the main venv and, when it exists, in the
vLLM venv (`make vllm-venv`) for tests/rollout/test_rollout_vllm.py.

    python benchmarks/warm_model_variants.py                    # threads 1,2 x seeds 0,1,2
    python benchmarks/warm_model_variants.py --threads 1 --seeds 0 --cache /tmp/variants

Models are cached under `--cache` (one folder per thread count), so a second run only tests.
Not part of `make test` (it runs the marked tests six times: about half an hour on 2 cores).
Exits 1 if any test failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VLLM_PYTHON = REPO / ".peer-venvs" / "vllm" / "bin" / "python"
VLLM_TESTS = "tests/rollout/test_rollout_vllm.py"
PASS_AT_1_DATA = "builtin:arithmetic?max_operand=19&split=val"
"""The demo's validation problems (91), 8 samples each at the demo's evaluation temperature."""


def integers(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def build(threads: int, seed: int, cache: Path) -> Path:
    """The warm model of `seed` built on `threads` threads, cached in `cache`/threads-N."""
    code = f"from pacs.train.builtin_models import warm_started_tiny; print(warm_started_tiny({seed}, show_progress=False))"
    # A passive OpenMP wait: the same arithmetic, without threads spinning against a busy machine.
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "OMP_WAIT_POLICY": "PASSIVE",
        "PACS_CACHE_DIR": str(cache / f"threads-{threads}"),
    }
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"building the warm model ({threads} threads, seed {seed}) failed:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def pass_at_1(model: Path) -> float:
    """pass@1 of `model` on PASS_AT_1_DATA (`pacs eval`, temperature 0.6, 8 samples a problem)."""
    with tempfile.TemporaryDirectory(prefix="pacs-variant-eval-") as scratch:
        out = Path(scratch) / "eval"
        command = [sys.executable, "-m", "pacs.cli", "eval", "--model", str(model), "--data", PASS_AT_1_DATA, "--n", "8",
                   "--temperature", "0.6", "--max-tokens", "16", "--reward-workers", "0", "--out", str(out)]  # fmt: skip
        done = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"evaluating {model} failed:\n{done.stderr[-3000:]}")
        metrics = json.loads((out / "eval_metrics.json").read_text())
    return metrics["data_sources"]["arithmetic"]["pass@k"]["pass@1"]


def run_marked_tests(python: Path, files: list[str], model: Path, test_cache: Path, workers: int) -> tuple[int, list[str]]:
    """(tests passed, ids of those that failed or erred) of `-m warm_model` in `files` against `model`."""
    with tempfile.TemporaryDirectory(prefix="pacs-variant-tests-") as scratch:
        report = Path(scratch) / "report.xml"
        command = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "warm_model", f"--junitxml={report}",
                   *(["-n", str(workers), "--dist", "loadfile"] if workers > 1 else []), *files]  # fmt: skip
        env = {**os.environ, "PACS_TEST_WARM_MODEL": str(model), "PACS_TEST_CACHE_DIR": str(test_cache),
               "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}  # fmt: skip
        subprocess.run(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        if not report.is_file():
            return 0, [f"{' '.join(files)}: pytest wrote no report"]
        cases = ElementTree.parse(report).getroot().iter("testcase")
        passed, failed = 0, []
        for case in cases:
            outcome = {child.tag for child in case}
            if outcome & {"failure", "error"}:
                failed.append(f"{case.get('classname')}::{case.get('name')}")
            elif "skipped" not in outcome:
                passed += 1
    return passed, failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=integers, default=[1, 2], help="thread counts to build with (default: 1,2)")
    parser.add_argument("--seeds", type=integers, default=[0, 1, 2], help="warm-start seeds (default: 0,1,2)")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(tempfile.gettempdir()) / "pacs-warm-model-variants",
        help="where the models and the tests' model cache are kept (default: %(default)s)",
    )
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers for the main venv's tests (default: 2)")
    args = parser.parse_args()

    rows, any_failed = [], False
    for threads in args.threads:
        build(threads, 0, args.cache)  # `pacs demo` and `pacs compare` in the tests build seed 0's themselves
        for seed in args.seeds:
            start = time.perf_counter()
            model = build(threads, seed, args.cache)
            score = pass_at_1(model)
            test_cache = args.cache / f"threads-{threads}"
            passed, failed = run_marked_tests(
                Path(sys.executable), ["--ignore", VLLM_TESTS, "tests"], model, test_cache, args.workers
            )
            if VLLM_PYTHON.is_file():
                vllm_passed, vllm_failed = run_marked_tests(VLLM_PYTHON, [VLLM_TESTS], model, test_cache, 1)
                passed, failed = passed + vllm_passed, failed + vllm_failed
            any_failed |= bool(failed)
            rows.append((threads, seed, score, passed, failed, time.perf_counter() - start))
            print(f"threads {threads}, seed {seed}: pass@1 {100 * score:.1f}%, {passed} passed, {len(failed)} failed "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)  # fmt: skip

    print(f"\nThe `warm_model` tests against warm models built here ({'' if VLLM_PYTHON.is_file() else 'no vLLM venv: '}"
          f"{'with' if VLLM_PYTHON.is_file() else 'without'} {VLLM_TESTS}); pass@1 on {PASS_AT_1_DATA}, 8 samples, T=0.6\n")  # fmt: skip
    print("| threads | seed | pass@1 | passed | failed | seconds |")
    print("|---|---|---|---|---|---|")
    for threads, seed, score, passed, failed, seconds in rows:
        print(f"| {threads} | {seed} | {100 * score:.1f}% | {passed} | {len(failed)} | {seconds:.0f} |")
    for threads, seed, _, _, failed, _ in rows:
        for test in failed:
            print(f"failed with threads {threads}, seed {seed}: {test}")
    sys.exit(1 if any_failed else 0)


if __name__ == "__main__":
    main()
