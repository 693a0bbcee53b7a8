"""The examples of README.md, CONTRIBUTING.md and docs/ work as written: every fenced block of
those pages says, in the comment on the line before it, what it is, and each runnable one is run
here exactly as written.

    <!-- readme-test: run -->                          run each command, in a fresh folder
    <!-- readme-test: run slow, append OVERRIDES -->   the same, marked slow, with OVERRIDES that
                                                      shorten the run (fewer steps, no validation)
                                                      appended to each command that takes
                                                      key=value overrides
    <!-- readme-test: file NAME -->                    a file the page's blocks use, saved as NAME
    <!-- readme-test: skip: REASON -->                 not runnable here (placeholders, a GPU, a layout)

Commands run in one temporary folder per block, holding the repository's `data/benchmarks`,
`configs` and every `file` block of the block's own page, with `.venv/bin` (this interpreter's)
first on PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from pacs.data.arithmetic import answer_text
from pacs.data.loading import load_rows
from pacs.rewards import load_reward_function

REPOSITORY = Path(__file__).resolve().parents[2]
PAGES = [
    REPOSITORY / "README.md",
    REPOSITORY / "CONTRIBUTING.md",
    *sorted((REPOSITORY / "docs").rglob("*.md")),
]
BLOCK = re.compile(r"^(?P<indent> *)```(?P<language>\w*)\n(?P<body>.*?)^(?P=indent)```$", re.MULTILINE | re.DOTALL)
ANNOTATION = re.compile(r"<!-- readme-test: (?P<what>.+?) -->\s*$")
TAKES_OVERRIDES = re.compile(r"\bpacs(\.cli)? (train|demo|compare)\b")


class Block(NamedTuple):
    page: str
    line: int
    what: str
    body: str


def page_blocks(page: Path) -> list[Block]:
    """Every fenced block of `page`, with the annotation on the line before it ("" if none)."""
    text = page.read_text()
    lines = text.splitlines()
    blocks = []
    for match in BLOCK.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        annotation = ANNOTATION.search(lines[line - 2]) if line > 1 else None
        name = str(page.relative_to(REPOSITORY))
        blocks.append(Block(name, line, annotation["what"] if annotation else "", match["body"]))
    return blocks


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in page_blocks(page)]


def commands(body: str, appended: str) -> list[str]:
    """The block's commands, continuation lines joined, `appended` added to those taking overrides."""
    joined = body.replace("\\\n", " ")
    lines = [line.split(" # ")[0].strip() for line in joined.splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    return [f"{line} {appended}".strip() if TAKES_OVERRIDES.search(line) else line for line in lines]


def file_blocks(page: str) -> dict[str, str]:
    """{file name: content} of the `file` blocks of `page` (a path relative to the repository)."""
    return {
        block.what.removeprefix("file "): block.body for block in page_blocks(REPOSITORY / page) if block.what.startswith("file ")
    }


WARM_MODEL = "builtin:tiny-arithmetic"
"""A block that names the warm-started model uses it, as the `warm_model` tests do."""
REAL_MODEL = "builtin:smollm2-135m-instruct"
"""A block that names the real model runs with the conversion the machine keeps (`smollm2_dir`)."""


def runnable(slow: bool) -> list:
    cases = []
    for block in all_blocks():
        settings = [part.strip() for part in block.what.split(",")]
        if settings[0] not in ("run", "run slow") or (settings[0] == "run slow") != slow:
            continue
        appended = " ".join(part.removeprefix("append ") for part in settings[1:] if part.startswith("append "))
        marks = [pytest.mark.slow] if slow else []
        if WARM_MODEL in block.body:  # built for the test session if no earlier test built it
            marks.append(pytest.mark.warm_model)
        cases.append(pytest.param(block.page, commands(block.body, appended), id=f"{block.page} line {block.line}", marks=marks))
    return cases


def run_in_fresh_folder(folder: Path, page: str, block_commands: list[str]) -> None:
    shutil.copytree(REPOSITORY / "data" / "benchmarks", folder / "data" / "benchmarks")
    shutil.copytree(REPOSITORY / "configs", folder / "configs")  # the pages' commands run in the repository
    for name, body in file_blocks(page).items():
        (folder / name).write_text(body)
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    environment.pop("PYTHONPATH", None)
    for command in block_commands:
        result = subprocess.run(["bash", "-c", command], cwd=folder, env=environment, capture_output=True, text=True)
        assert result.returncode == 0, f"{page}: {command}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"


def test_every_block_says_what_it_is():
    unannotated = [f"{block.page} line {block.line}" for block in all_blocks() if not re.match(r"(run|file |skip: )", block.what)]
    assert unannotated == [], f"blocks without a readme-test comment: {unannotated}"


@pytest.mark.parametrize(("page", "block_commands"), runnable(slow=False))
def test_block_runs_as_written(tmp_path, page, block_commands):
    run_in_fresh_folder(tmp_path, page, block_commands)


@pytest.mark.parametrize(("page", "block_commands"), runnable(slow=True))
def test_slow_block_runs_as_written(tmp_path, request, page, block_commands):
    if any(REAL_MODEL in command for command in block_commands):
        request.getfixturevalue("smollm2_dir")
    run_in_fresh_folder(tmp_path, page, block_commands)


def test_the_example_reward_function_is_found_in_the_working_directory_and_scores_the_builtin_answers(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(file_blocks("README.md")["my_rewards.py"])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [entry for entry in sys.path if entry not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    compute_score = load_reward_function("my_rewards:compute_score")
    monkeypatch.delitem(sys.modules, "my_rewards")
    for row in load_rows("builtin:arithmetic?size=20", default_split="train"):
        truth = row["reward_model"]["ground_truth"]
        assert compute_score("arithmetic", answer_text(row), truth)["score"] == 1.0
        assert compute_score("arithmetic", answer_text(row) + "1", truth)["score"] == 0.0


WRITES = re.compile(r"\bpacs(\.cli)? (?P<command>train|demo|compare|eval|sft)\b")


def written_folder(command: str) -> str | None:
    """The folder a page's `pacs train|demo|compare|eval|sft` command writes (None: it writes none,
    or continues a run there with resume=auto)."""
    words = command.split()
    found = WRITES.search(command)
    if found is None or "--print-config" in words or "resume=auto" in words:
        return None
    if found["command"] != "train":
        return words[words.index("--out") + 1] if "--out" in words else ("runs/demo" if found["command"] == "demo" else None)
    given = [word.removeprefix("output_dir=") for word in words if word.startswith("output_dir=")]
    if given:
        return given[-1]
    source = words[words.index("--config") + 1] if "--config" in words else None
    if source is None:
        from pacs.config import Config

        return str(Config.model_fields["output_dir"].default)
    recipe = (
        REPOSITORY / "configs" / f"{source.removeprefix('builtin:')}.yaml"
        if source.startswith("builtin:")
        else REPOSITORY / source
    )
    import yaml

    return str(yaml.safe_load(recipe.read_text())["output_dir"])


def test_every_runnable_example_that_writes_writes_a_folder_of_its_own_apart_from_the_demo():
    """A reader who runs the pages' runnable commands in order, in one folder, after `make demo`
    (which writes runs/demo; `pacs demo` moves its previous run aside by itself), meets no command
    refused for a folder an earlier one wrote."""
    writers: dict[str, list[str]] = {}
    for block in all_blocks():
        if not block.what.startswith("run"):
            continue
        for command in commands(block.body, ""):
            if (folder := written_folder(command)) is not None and not WRITES.search(command)["command"] == "demo":
                writers.setdefault(os.path.normpath(folder), []).append(f"{block.page} line {block.line}")
    shared = {folder: places for folder, places in writers.items() if len(set(places)) > 1}
    assert not shared, shared
    inside_the_demo = sorted(folder for folder in writers if folder == "runs/demo" or folder.startswith("runs/demo/"))
    assert not inside_the_demo, inside_the_demo
