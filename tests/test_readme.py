"""The README's examples work as written: every fenced block of README.md says, in the comment on
the line before it, what it is, and each runnable one is run here exactly as written.

    <!-- readme-test: run -->                          run each command, in a fresh folder
    <!-- readme-test: run slow, append OVERRIDES -->   the same, marked slow, with the step-count
                                                      OVERRIDES appended to each command that
                                                      takes key=value overrides
    <!-- readme-test: file NAME -->                    a file the blocks after it use, saved as NAME
    <!-- readme-test: skip: REASON -->                 not runnable here (placeholders, a GPU, a layout)

Commands run in one temporary folder per test, holding the repository's `data/benchmarks`,
`configs` and every `file` block, with `.venv/bin` (this interpreter's) first on PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pacs.data.arithmetic import answer_text
from pacs.data.loading import load_rows
from pacs.rewards import load_reward_function

REPOSITORY = Path(__file__).resolve().parents[1]
README = REPOSITORY / "README.md"
BLOCK = re.compile(r"^(?P<indent> *)```(?P<language>\w*)\n(?P<body>.*?)^(?P=indent)```$", re.MULTILINE | re.DOTALL)
ANNOTATION = re.compile(r"<!-- readme-test: (?P<what>.+?) -->\s*$")
TAKES_OVERRIDES = re.compile(r"\bpacs(\.cli)? (train|demo|compare)\b")


def readme_blocks() -> list[tuple[int, str, str]]:
    """(line number, annotation, body) of every fenced block of the README."""
    text = README.read_text()
    blocks = []
    for match in BLOCK.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        previous = text.splitlines()[line - 2] if line > 1 else ""
        annotation = ANNOTATION.search(previous)
        blocks.append((line, annotation["what"] if annotation else "", match["body"]))
    return blocks


def commands(body: str, appended: str) -> list[str]:
    """The block's commands, continuation lines joined, `appended` added to those taking overrides."""
    joined = body.replace("\\\n", " ")
    lines = [line.split(" # ")[0].strip() for line in joined.splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    return [f"{line} {appended}".strip() if TAKES_OVERRIDES.search(line) else line for line in lines]


def file_blocks() -> dict[str, str]:
    return {what.removeprefix("file "): body for _, what, body in readme_blocks() if what.startswith("file ")}


def runnable(slow: bool) -> list:
    cases = []
    for line, what, body in readme_blocks():
        settings = [part.strip() for part in what.split(",")]
        if settings[0] not in ("run", "run slow") or (settings[0] == "run slow") != slow:
            continue
        appended = " ".join(part.removeprefix("append ") for part in settings[1:] if part.startswith("append "))
        marks = [pytest.mark.slow] if slow else []
        cases.append(pytest.param(commands(body, appended), id=f"README line {line}", marks=marks))
    return cases


def run_in_fresh_folder(folder: Path, block_commands: list[str]) -> None:
    shutil.copytree(REPOSITORY / "data" / "benchmarks", folder / "data" / "benchmarks")
    shutil.copytree(REPOSITORY / "configs", folder / "configs")  # the README's commands run in the repository
    for name, body in file_blocks().items():
        (folder / name).write_text(body)
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    environment.pop("PYTHONPATH", None)
    for command in block_commands:
        result = subprocess.run(["bash", "-c", command], cwd=folder, env=environment, capture_output=True, text=True)
        assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"


def test_every_block_says_what_it_is():
    unannotated = [line for line, what, _ in readme_blocks() if not re.match(r"(run|file |skip: )", what)]
    assert unannotated == [], f"README blocks without a readme-test comment at lines {unannotated}"


@pytest.mark.parametrize("block_commands", runnable(slow=False))
def test_readme_block_runs_as_written(tmp_path, block_commands):
    run_in_fresh_folder(tmp_path, block_commands)


@pytest.mark.parametrize("block_commands", runnable(slow=True))
def test_slow_readme_block_runs_as_written(tmp_path, block_commands):
    run_in_fresh_folder(tmp_path, block_commands)


def test_the_example_reward_function_is_found_in_the_working_directory_and_scores_the_builtin_answers(
    tmp_path, monkeypatch
):
    (tmp_path / "my_rewards.py").write_text(file_blocks()["my_rewards.py"])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [entry for entry in sys.path if entry not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    compute_score = load_reward_function("my_rewards:compute_score")
    monkeypatch.delitem(sys.modules, "my_rewards")
    for row in load_rows("builtin:arithmetic?size=20", default_split="train"):
        truth = row["reward_model"]["ground_truth"]
        assert compute_score("arithmetic", answer_text(row), truth)["score"] == 1.0
        assert compute_score("arithmetic", answer_text(row) + "1", truth)["score"] == 0.0
