"""`builtin:tiny-arithmetic`: the built-in tiny model warm-started on `builtin:arithmetic`;
`builtin:tiny-tools`: the built-in tiny model warm-started on `builtin:multiplication`, some of
whose demonstrations call the python tool in the chat format (`tool_demonstration`).

Each is built on first use (a minute or two on a CPU; docs/results.md has the times) and cached under
`pacs.paths.cache_dir()`; no weights live in git. The warm-start is deliberately short: the model
solves some problems but not all, so RL sees groups with both outcomes. Processes that ask for it
at once (test workers, runs sharing a cache) build it once: the others wait on a lock file beside
it.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

from pacs.data.arithmetic import answer_text
from pacs.data.loading import load_rows
from pacs.models.tiny import save_builtin_tiny
from pacs.paths import cache_dir
from pacs.train.sft import supervised_warm_start

WARM_START = {"task": "builtin:arithmetic?max_operand=19", "steps": 700, "batch_size": 64, "lr": 1e-3}
"""Long enough that the model solves many held-out problems (pass@1 at temperature 0.6 of roughly
30–50%, depending on the seed and the machine's roundoff) and short enough that it fails others,
so RL sees groups with both outcomes. 450 steps were enough while the tiny tokenizer dropped the
prompts' spaces; on the prompts as written they left a base of about 15% that the demo's 130
steps raised by only about 7 points (docs/results.md, "The demo over ten seeds")."""


TOOLS_WARM_START = {
    "task": "builtin:multiplication?size=4000",
    "tool_fraction": 0.25,
    "steps": 600,
    "batch_size": 64,
    "lr": 1e-3,
}
"""`builtin:tiny-tools`'s warm-start: a quarter of the demonstrations call the tool and copy its
output into the answer, the rest write an answer directly (which the model cannot compute), so the
warm-started model calls the tool in some of its samples and RL has a tool-call rate to raise."""


def warm_started_tiny(seed: int = 0, *, show_progress: bool = True) -> Path:
    """Directory of the tiny model (initialised with `seed`) after the arithmetic warm-start; cached."""
    return _cached_warm_start("tiny-arithmetic", {**WARM_START, "seed": seed, "format": 3}, seed, answer_text, show_progress)


def warm_started_tiny_tools(seed: int = 0, *, show_progress: bool = True) -> Path:
    """Directory of the tiny model (initialised with `seed`) after the tool warm-start
    (`TOOLS_WARM_START`); cached."""
    rows = load_rows(TOOLS_WARM_START["task"], default_split="train")
    with_tool = {row["extra_info"]["index"] for row in rows[: round(TOOLS_WARM_START["tool_fraction"] * len(rows))]}

    def reference(row: dict) -> str | list[dict]:
        return tool_demonstration(row) if row["extra_info"]["index"] in with_tool else answer_text(row)

    settings = {**TOOLS_WARM_START, "seed": seed, "format": 2}
    return _cached_warm_start("tiny-tools", settings, seed, reference, show_progress)


def tool_demonstration(row: dict) -> list[dict]:
    """The turns of an arithmetic row solved with the python tool in the chat format: a call that
    prints the expression, the tool's output (the answer), and the boxed answer:

        assistant: <tool_call>{"name": "python", "arguments": {"code": "print(4821*9317)"}}</tool_call>
        tool:      44917357
        assistant: \\boxed{44917357}
    """
    call = json.dumps({"name": "python", "arguments": {"code": f"print({row['extra_info']['expression']})"}})
    return [
        {"role": "assistant", "content": f"<tool_call>{call}</tool_call>"},
        {"role": "tool", "content": row["reward_model"]["ground_truth"]},
        {"role": "assistant", "content": answer_text(row)},
    ]


def _cached_warm_start(
    name: str, settings: dict, seed: int, reference: Callable[[dict], str | list[dict]], show_progress: bool
) -> Path:
    """The cached directory of `name` warm-started with `settings` (a "task", "steps", "batch_size"
    and "lr"), building it under a lock beside it when no process has."""
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    directory = cache_dir() / "models" / f"{name}-seed{seed}-{key}"
    if (directory / "config.json").is_file():
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(directory.with_name(directory.name + ".lock")):
        if (directory / "config.json").is_file():  # another process built it while this one waited
            return directory
        return _warm_start(settings, reference, seed, directory, show_progress)


def _warm_start(
    settings: dict, reference: Callable[[dict], str | list[dict]], seed: int, directory: Path, show_progress: bool
) -> Path:
    """Warm-start `builtin:tiny` initialised with `seed` on `settings["task"]`'s training rows and
    their `reference` answers; write it to `directory`."""
    rows = load_rows(settings["task"], default_split="train")
    with tempfile.TemporaryDirectory() as scratch:
        initial = save_builtin_tiny(Path(scratch) / "tiny", seed=seed)
        return supervised_warm_start(
            str(initial),
            rows,
            reference,
            directory,
            steps=settings["steps"],
            batch_size=settings["batch_size"],
            lr=settings["lr"],
            seed=seed,
            show_progress=show_progress,
        )
