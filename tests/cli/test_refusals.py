"""One rule for every command: nothing is written, and no model is loaded, until every input has
been checked, and a refused command leaves the disk exactly as it was.

Each refusal that a new user met after the config check (a bad JSON line, a missing or wrongly
typed ground_truth, an empty file, a data_source no reward function scores, a model that cannot be
reached, a reward function that raises, returns garbage or has the wrong signature) is tried with
`pacs train`, `pacs eval` and, where it applies, `pacs sft`: the command must fail naming the
problem, without calling the model loader, with the output folder's parent byte for byte as before.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from running import run
from test_output_rule import tree_hash

import pacs.models.loading as loading

REWARD_FUNCTIONS = """\
def fine(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0

def raises(data_source, solution_str, ground_truth, extra_info=None):
    raise KeyError("answer")

def returns_garbage(data_source, solution_str, ground_truth, extra_info=None):
    return "correct"

def two_arguments(solution_str, ground_truth):
    return 1.0
"""
UNREACHABLE_MODEL = "pacs-test/no-such-model"


def row(ground_truth: object = "7", data_source: str = "arithmetic") -> dict:
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": "What is 3 + 4? Put the answer in \\boxed{}."}],
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
    }


def lines(*rows: dict) -> str:
    return "".join(json.dumps(one) + "\n" for one in rows)


CASES = {
    # case: (data.jsonl's text, model ("" for the tiny model), reward function (None: by data_source), what the error says)
    "a bad JSON line": (lines(row()) + '{"data_source": "arithmetic", oops}\n', "", None, r"data\.jsonl: 1 bad row, numbered by line of the file, the first line being 1: line 2: invalid JSON"),
    "a missing ground_truth": (
        lines({**row(), "reward_model": {"style": "rule"}}), "", None, r"line 1: field 'reward_model\.ground_truth': missing",
    ),
    "a ground_truth of the wrong type": (
        lines(row(ground_truth=7)), "", None, r"line 1: field 'reward_model\.ground_truth': expected a string, got int 7",
    ),
    "an empty file": ("", "", None, r"data\.jsonl contains no rows"),
    "a data_source no reward function scores": (
        lines(row()) + "\n" + lines(row(data_source="my_task")), "", None,
        r"no reward function for data_source 'my_task' \(first at .*data\.jsonl: line 3\)",
    ),
    "a model that cannot be reached": (
        lines(row()), UNREACHABLE_MODEL, None, r"Could not reach the Hugging Face Hub .* 'pacs-test/no-such-model'",
    ),
    "a reward function that raises": (
        lines(row()), "", "refusal_rewards:raises", r"Reward function refusal_rewards:raises raised for .*KeyError: 'answer'",
    ),
    "a reward function that returns garbage": (
        lines(row()), "", "refusal_rewards:returns_garbage", r"refusal_rewards:returns_garbage: .*must be a number in \[0, 1\], got str 'correct'",
    ),
    "a reward function of the wrong signature": (
        lines(row()), "", "refusal_rewards:two_arguments",
        r"reward function refusal_rewards:two_arguments takes \(solution_str, ground_truth\), but pacs calls it as "
        r"compute_score\(data_source, solution_str, ground_truth, extra_info\)",
    ),
}  # fmt: skip


def train(out: Path, data: Path, model: str, reward: str | None) -> list[str]:
    reward_option = [f"reward.function={reward}"] if reward else []
    return ["train", f"output_dir={out}", f"model.path={model}", f"data.train={data}", "data.val=null", *reward_option]


def evaluate(out: Path, data: Path, model: str, reward: str | None) -> list[str]:
    reward_option = ["--reward-function", reward] if reward else []
    return ["eval", "--model", model, "--data", str(data), "--n", "1", "--out", str(out), *reward_option]


def sft(out: Path, data: Path, model: str, reward: str | None) -> list[str]:
    return ["sft", "--model", model, "--data", str(data), "--out", str(out), "--steps", "1"]


COMMANDS = {"train": train, "eval": evaluate, "sft": sft}
SFT_CASES = [
    "a bad JSON line",
    "a missing ground_truth",
    "a ground_truth of the wrong type",
    "an empty file",
    "a model that cannot be reached",
]


@pytest.fixture
def loads(monkeypatch, tmp_path) -> list[str]:
    """The model paths the model loader was asked for (tokenizers and models alike); the reward
    functions importable (from a folder outside the one checked); the hub unreachable."""
    called: list[str] = []
    monkeypatch.setattr(loading, "_from_pretrained", lambda load, path: called.append(path) or pytest.fail(f"loaded {path}"))
    monkeypatch.setattr(loading, "_hub_unreachable_reason", lambda repo_id: "the test's hub is unreachable")
    monkeypatch.setattr(loading, "_HUB_ANSWERS", {})
    code = tmp_path / "code"
    code.mkdir()
    (code / "refusal_rewards.py").write_text(REWARD_FUNCTIONS)
    monkeypatch.syspath_prepend(str(code))
    return called


@pytest.mark.parametrize(
    ("command", "case"),
    [(command, case) for command in ("train", "eval") for case in CASES] + [("sft", case) for case in SFT_CASES],
)
@pytest.mark.slow
def test_a_refused_command_names_the_problem_loads_no_model_and_leaves_the_disk_as_it_was(
    tmp_path, tiny_model_dir, loads, capsys, command, case
):
    text, model, reward, message = CASES[case]
    work = tmp_path / "work"
    work.mkdir()
    data = work / "data.jsonl"
    data.write_text(text)
    before = tree_hash(work)
    assert run(COMMANDS[command](work / "out", data, model or str(tiny_model_dir), reward)) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert f"pacs {command}: error: unusable inputs:" in error
    assert re.search(message, error), error
    assert loads == []
    assert tree_hash(work) == before


@pytest.mark.parametrize("command", ["train", "eval"])
def test_every_problem_is_reported_at_once(tmp_path, loads, capsys, command):
    work = tmp_path / "work"
    work.mkdir()
    good, empty = work / "good.jsonl", work / "empty.jsonl"
    good.write_text(lines(row()))
    empty.write_text("")
    arguments = COMMANDS[command](work / "out", good, UNREACHABLE_MODEL, "refusal_rewards:two_arguments")
    arguments = [
        argument.replace(str(good), f"[{good},{empty}]" if command == "train" else f"{good},{empty}") for argument in arguments
    ]
    before = tree_hash(work)
    assert run(arguments) == 2
    error = capsys.readouterr().err
    assert "no-such-model" in error and "empty.jsonl contains no rows" in error and "takes (solution_str, ground_truth)" in error
    assert loads == [] and tree_hash(work) == before


def test_a_config_error_and_bad_data_rows_are_refused_in_one_message_config_first(tmp_path, loads, capsys):
    work = tmp_path / "work"
    work.mkdir()
    data = work / "data.jsonl"
    data.write_text(lines(row(), row(), row(), row()) + '{"oops"}\n' + lines(row(ground_truth=7)))
    before = tree_hash(work)
    assert run([*train(work / "out", data, UNREACHABLE_MODEL, None), "train.stpes=3"]) == 2
    error = capsys.readouterr().err
    typo, line_5, line_6 = (
        error.find(text) for text in ("train.stpes: unknown key (did you mean 'steps'?)", "line 5:", "line 6:")
    )
    assert -1 < typo < line_5 < line_6, error
    assert "data.train: " in error and "2 bad rows" in error
    assert loads == [] and tree_hash(work) == before


@pytest.mark.slow
def test_prepare_check_refuses_a_file_whose_data_source_has_no_reward_function(tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text(lines(row(data_source="my_task")))
    assert run(["prepare", "--check", str(data)]) == 2
    assert "no reward function for data_source 'my_task'" in capsys.readouterr().err
    assert run(["prepare", "--check", str(data), "--reward-function", "pacs.rewards.registry:default_compute_score"]) == 2


@pytest.mark.slow
def test_the_same_inputs_without_a_fault_get_past_the_checks_to_the_model_loader(tmp_path, tiny_model_dir, loads):
    """The refusals above come from the faults, not from the way the commands are run."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "data.jsonl").write_text(lines(row()))
    with pytest.raises(pytest.fail.Exception, match="loaded"):
        run(train(work / "out", work / "data.jsonl", str(tiny_model_dir), "refusal_rewards:fine"))
    assert loads == [str(tiny_model_dir)]


@pytest.mark.parametrize("command", ["compare", "demo"])
def test_compare_and_demo_refuse_a_config_error_and_bad_data_rows_in_one_message(tmp_path, loads, capsys, command):
    work = tmp_path / "work"
    work.mkdir()
    data = work / "val.jsonl"
    data.write_text(lines(row(), row(), row(), row()) + '{"oops"}\n' + lines(row(ground_truth=7)))
    before = tree_hash(work)
    settings = [f"data.val={data}", "train.stpes=3"]
    if command == "compare":
        arguments = ["compare", "--config", "builtin:compare-demo", "--out", str(work / "out"), *settings]
    else:
        arguments = ["demo", "--out", str(work / "out"), *settings]
    assert run(arguments) == 2
    error = capsys.readouterr().err
    typo, line_5, line_6 = (
        error.find(text) for text in ("train.stpes: unknown key (did you mean 'steps'?)", "line 5:", "line 6:")
    )
    assert -1 < typo < line_5 < line_6, error
    assert loads == [] and tree_hash(work) == before


MODULES_THAT_DO_NOT_COMPILE = {
    # module: (its text, what names it, the error pacs names)
    "broken_reward": (
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None)\n    return 1.0\n",
        "function 'broken_reward:compute_score'",
        "broken_reward.py, line 1: SyntaxError: expected ':'",
    ),
    "broken_algorithm": (
        "class Broken:\n    def section(self):\n    return 1\n",
        "class 'broken_algorithm:Broken'",
        "broken_algorithm.py, line 3: IndentationError: expected an indented block after function definition on line 2",
    ),
    "broken_tool": (
        "def tool(code):\n    return 1\n        extra = 2\n",
        "tool 'broken_tool:tool'",
        "broken_tool.py, line 3: IndentationError: unexpected indent",
    ),
}
USES_OF_A_USER_MODULE = {
    # (command, module): the arguments, given the work folder and the data file
    ("train", "broken_reward"): lambda work, data: [*train(work / "out", data, "builtin:tiny", "broken_reward:compute_score")],
    ("train", "broken_algorithm"): lambda work, data: [*train(work / "out", data, "builtin:tiny", None), "algorithm.name=broken_algorithm:Broken"],
    ("train", "broken_tool"): lambda work, data: [*train(work / "out", data, "builtin:tiny", None), "rollout.tools=broken_tool:tool"],
    ("eval", "broken_reward"): lambda work, data: evaluate(work / "out", data, "builtin:tiny", "broken_reward:compute_score"),
    ("eval", "broken_tool"): lambda work, data: [*evaluate(work / "out", data, "builtin:tiny", None), "--tools", "broken_tool:tool"],
    ("prepare", "broken_reward"): lambda work, data: ["prepare", "--check", str(data), "--reward-function", "broken_reward:compute_score"],
}  # fmt: skip


@pytest.mark.parametrize(("command", "module"), USES_OF_A_USER_MODULE)
def test_a_user_module_that_does_not_compile_is_named_in_one_line_by_file_line_and_error(
    tmp_path, loads, capsys, command, module
):
    work = tmp_path / "work"
    work.mkdir()
    text, spec, compile_error = MODULES_THAT_DO_NOT_COMPILE[module]
    (tmp_path / "code" / f"{module}.py").write_text(text)
    data = work / "data.jsonl"
    data.write_text(lines(row(data_source="math")))
    before = tree_hash(work)
    assert run(USES_OF_A_USER_MODULE[command, module](work, data)) == 2
    error = capsys.readouterr().err
    assert f"Cannot import module {module!r} of {spec}: {tmp_path / 'code' / compile_error}\n" in error
    assert "Traceback" not in error and len(error.splitlines()) <= 2  # the command's header, then the one line
    assert loads == [] and tree_hash(work) == before


@pytest.mark.slow
def test_prompts_all_longer_than_max_prompt_length_are_refused_naming_the_longest_before_a_model_loads_or_a_file_is_written(
    tmp_path, tiny_model_dir, monkeypatch, capsys
):
    from pacs.data.prompts import prompt_token_ids
    from pacs.models.loading import load_tokenizer
    from pacs.train.trainer import Trainer

    work = tmp_path / "work"
    work.mkdir()
    short, long = row(), {**row(), "prompt": [{"role": "user", "content": "What is 3 + 4 + 5? Put the answer in \\boxed{}."}]}
    data = work / "data.jsonl"
    data.write_text(lines(short, long))
    tokenizer = load_tokenizer(str(tiny_model_dir))
    shortest, longest = (len(prompt_token_ids(tokenizer, one)) for one in (short, long))
    monkeypatch.setattr(Trainer, "setup", lambda *arguments: pytest.fail("the models were loaded"))
    before = tree_hash(work)
    assert run([*train(work / "out", data, str(tiny_model_dir), None), f"data.max_prompt_length={shortest - 1}"]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert f"data.train: every one of the 2 prompts is longer than data.max_prompt_length={shortest - 1} tokens" in error
    assert f"the longest, {data}: line 2, has {longest} tokens: data.max_prompt_length={longest} keeps every prompt" in error
    assert tree_hash(work) == before
    with pytest.raises(pytest.fail.Exception, match="the models were loaded"):  # one prompt that fits is enough
        run([*train(work / "out", data, str(tiny_model_dir), None), f"data.max_prompt_length={shortest}"])
