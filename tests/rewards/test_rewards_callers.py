"""Specification: the verifier and the scoring pool work the same from every kind of caller.

Each calling form runs as its own Python process: a script without a main guard, a script read
from standard input, ``python -c``, a notebook-style ``exec`` of a cell, a worker thread, and a
process that already runs torch's threads. Each scores a correct answer 1.0, a wrong one 0.0, and
an answer whose symbolic check never ends 0.0 within 1.5 s at ``timeout_s=1``. The correct and
wrong answers are scored under a 60 s limit (the default function's under its own 1 s): on a
loaded machine a fresh worker's first call can pass 1 s, which would score a correct answer 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCORING = textwrap.dedent(
    r"""
    import json, time
    from pacs.rewards import ScoringPool, default_compute_score, math_score

    RIGHT, WRONG, ENDLESS = r"so \boxed{\frac{1}{2}}", r"\boxed{3}", r"\boxed{9^{9^{9^{9}}}}"
    UNDER_LOAD_S = 60
    report = {
        "math_score": [math_score(RIGHT, "0.5", timeout_s=UNDER_LOAD_S), math_score(WRONG, "0.5", timeout_s=UNDER_LOAD_S)],
        "compute_score": [default_compute_score("math500", answer, "0.5") for answer in (RIGHT, WRONG)],
    }
    start = time.perf_counter()
    report["math_score"].append(math_score(ENDLESS, "0.5", timeout_s=1))
    report["math_score_seconds"] = time.perf_counter() - start
    start = time.perf_counter()
    report["compute_score"].append(default_compute_score("math500", ENDLESS, "0.5"))
    report["compute_score_seconds"] = time.perf_counter() - start
    rows = [{"data_source": "math500", "reward_model": {"ground_truth": "0.5"}}] * 3
    with ScoringPool(num_workers=2, timeout_s=UNDER_LOAD_S) as pool:
        answered = pool.score(rows[:2], [RIGHT, WRONG])
        pool.timeout_s = 1
        start = time.perf_counter()
        endless = pool.score(rows[2:], [ENDLESS])
        report["pool_seconds"] = time.perf_counter() - start
    report["pool"] = [*answered.scores, *endless.scores]
    report["pool_timed_out"] = answered.timed_out + endless.timed_out
    print("REPORT " + json.dumps(report))
    """
)

IN_A_THREAD = "import threading\nthread = threading.Thread(target=exec, args=(SCORING, {}))\nthread.start()\nthread.join()\n"
WITH_TORCH_THREADS = (
    "import torch\ntorch.set_num_threads(2)\nmatrix = torch.randn(512, 512)\n(matrix @ matrix).sum()\nexec(SCORING, {})\n"
)
NOTEBOOK_KERNEL = (
    "import sys\n"
    'if __name__ == "__main__":\n'
    "    cell = open(sys.argv[1]).read()\n"
    '    exec(compile(cell, "<cell>", "exec"), {"__name__": "__main__"})\n'
)


def command_for(form: str, directory: Path) -> tuple[list[str], str | None]:
    """The command line (and standard input) that runs SCORING in the calling form `form`."""
    script = directory / "score.py"
    script.write_text(SCORING)
    if form == "script without a main guard":
        return [sys.executable, str(script)], None
    if form == "script on standard input":
        return [sys.executable, "-"], SCORING
    if form == "python -c":
        return [sys.executable, "-c", SCORING], None
    if form == "notebook-style exec":
        kernel = directory / "kernel.py"
        kernel.write_text(NOTEBOOK_KERNEL)
        return [sys.executable, str(kernel), str(script)], None
    wrapper = directory / "wrapper.py"
    body = IN_A_THREAD if form == "worker thread" else WITH_TORCH_THREADS
    wrapper.write_text(f"SCORING = {SCORING!r}\n{body}")
    return [sys.executable, str(wrapper)], None


@pytest.mark.parametrize(
    "form",
    [
        "script without a main guard",
        "script on standard input",
        "python -c",
        "notebook-style exec",
        "worker thread",
        "process with torch threads",
    ],
)
@pytest.mark.slow
def test_scoring_works_and_keeps_its_limit_from_every_kind_of_caller(form: str, tmp_path: Path) -> None:
    command, stdin = command_for(form, tmp_path)
    finished = subprocess.run(command, input=stdin, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert finished.returncode == 0, finished.stderr
    [line] = [line for line in finished.stdout.splitlines() if line.startswith("REPORT ")]
    report = json.loads(line.removeprefix("REPORT "))
    assert report["math_score"] == [1.0, 0.0, 0.0]
    assert report["compute_score"] == [1.0, 0.0, 0.0]
    assert report["pool"] == [1.0, 0.0, 0.0] and report["pool_timed_out"] == 1
    for timing in ("math_score_seconds", "compute_score_seconds", "pool_seconds"):
        assert report[timing] < 1.5, (timing, report[timing])
    assert "Traceback" not in finished.stderr
