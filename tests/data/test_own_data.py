"""A researcher's own data in one command: `pacs prepare` reads any row-shaped file (jsonl, json,
csv, parquet) whose fields it recognises or is told, then `pacs train` and `pacs eval` run on it
with nothing written by the user but a reward function."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from running import run

from pacs.data.prepare import DEFAULT_DATA_SOURCE, PROMPT_SUFFIX, prepare_dataset, read_rows
from pacs.rewards.registry import REWARD_FUNCTIONS, reward_function_for
from pacs.train.metrics import read_metrics

MY_REWARD = """\
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str.strip().endswith("\\\\boxed{" + ground_truth + "}"))
"""
"""The one piece of code the user writes: 1 when the answer ends with the ground truth in \\boxed{}."""
PROBLEMS = [("What is 3 + 4?", "7"), ("What is 9 - 5?", "4"), ("What is 2 * 6?", "12"), ("What is 8 + 8?", "16")]


def pacs(folder: Path, *arguments: str) -> str:
    """`pacs ARGUMENTS` as a user runs it, in `folder`, one thread; its standard output."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pacs.cli", *arguments], cwd=folder, env=environment, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"pacs {' '.join(arguments)}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def own_files(tmp_path_factory) -> Path:
    """A folder holding the same problems in three shapes users have: a {"problem", "answer"}
    jsonl, a csv with a question column, a parquet with prompt and ground_truth columns; and the
    user's reward function, my_reward.py."""
    folder = tmp_path_factory.mktemp("own")
    (folder / "problems.jsonl").write_text("".join(json.dumps({"problem": p, "answer": a}) + "\n" for p, a in PROBLEMS))
    (folder / "problems.csv").write_text("question,answer\n" + "".join(f'"{p}",{a}\n' for p, a in PROBLEMS))
    table = pa.table({"prompt": [p for p, _ in PROBLEMS], "ground_truth": [int(a) for _, a in PROBLEMS]})
    pq.write_table(table, folder / "problems_raw.parquet")
    (folder / "my_reward.py").write_text(MY_REWARD)
    return folder


@pytest.mark.slow
def test_own_jsonl_csv_and_parquet_are_prepared_trained_on_for_two_steps_and_evaluated(own_files, tiny_model_dir):
    folder = own_files
    pacs(folder, "prepare", "--input", "problems.jsonl", "--out", "jsonl.parquet")
    pacs(folder, "prepare", "--input", "problems.csv", "--out", "csv.parquet", "--data-source", "my_sums")
    pacs(folder, "prepare", "--input", "problems_raw.parquet", "--out", "parquet.parquet")
    checked = pacs(folder, "prepare", "--check", "csv.parquet", "--reward-function", "my_reward:compute_score")
    assert "csv.parquet: 4 rows, all valid; data_source my_sums, scored by my_reward:compute_score" in checked
    files = ["jsonl.parquet", "csv.parquet", "parquet.parquet"]
    pacs(
        folder, "train", "output_dir=run", f"model.path={tiny_model_dir}", f"data.train=[{','.join(files)}]",
        "data.val=null", "train.steps=2", "train.batch_size=2", "train.mini_batch_size=2", "rollout.n=2",
        "data.max_response_length=8", "reward.function=my_reward:compute_score", "reward.num_workers=1",
    )  # fmt: skip
    assert [row["step"] for row in read_metrics(folder / "run")] == [1, 2]
    table = pacs(
        folder, "eval", "--model", "run/checkpoints/final", "--data", ",".join(files), "--n", "2", "--max-tokens", "8",
        "--reward-function", "my_reward:compute_score", "--reward-workers", "1", "--out", "eval",
    )  # fmt: skip
    sources = json.loads((folder / "eval" / "eval_metrics.json").read_text())["data_sources"]
    assert {source: report["problems"] for source, report in sources.items()} == {
        "math/problems": 4,
        "my_sums": 4,
        "math/problems_raw": 4,
    }
    assert table.splitlines()[0].split()[:3] == ["data", "source", "problems"]


def test_a_problem_answer_jsonl_becomes_math_rows_of_its_own_data_source_asking_for_a_boxed_answer(own_files):
    prepared = prepare_dataset(own_files / "problems.jsonl")
    assert prepared.rows[0] == {
        "data_source": f"{DEFAULT_DATA_SOURCE}/problems",
        "prompt": [{"role": "user", "content": "What is 3 + 4?" + PROMPT_SUFFIX}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "7"},
        "extra_info": {"split": "train", "index": 0, "repeat": 0},
    }
    assert (prepared.report.problem_field, prepared.report.answer_field) == ("problem", "answer")


def test_a_csv_is_read_as_text_with_its_header_naming_the_fields(own_files):
    prepared = prepare_dataset(own_files / "problems.csv")
    assert [row["reward_model"]["ground_truth"] for row in prepared.rows] == ["7", "4", "12", "16"]
    assert prepared.report.problem_field == "question"


def test_a_parquet_of_prompt_and_ground_truth_columns_is_recognised_and_numbers_become_text(own_files):
    prepared = prepare_dataset(own_files / "problems_raw.parquet")
    assert [row["reward_model"]["ground_truth"] for row in prepared.rows] == ["7", "4", "12", "16"]
    assert prepared.report.normalised_answers == 4


def test_fields_with_other_names_are_named_and_the_prompt_suffix_and_data_source_chosen(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"q": "Name a prime.", "final": "2", "id": 5}) + "\n")
    row = prepare_dataset(path, prompt_field="q", answer_field="final", data_source="primes", prompt_suffix="").rows[0]
    assert (row["data_source"], row["prompt"][0]["content"], row["reward_model"]["ground_truth"]) == (
        "primes",
        "Name a prime.",
        "2",
    )


def test_unrecognised_fields_are_refused_naming_the_file_the_fields_found_and_the_option(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"q": "Name a prime.", "answer": "2"}) + "\n")
    with pytest.raises(
        ValueError,
        match=r"mine\.jsonl: line 1 \(the first record\): no problem field recognised .*the record has: 'q', 'answer'.*--prompt-field",
    ):
        prepare_dataset(path)


def test_a_row_without_the_recognised_field_is_refused_naming_it(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"problem": "A?", "answer": "1"}) + "\n" + json.dumps({"problem": "B?", "solution": "2"}) + "\n")
    with pytest.raises(ValueError, match=r"mine\.jsonl: 1 bad row.*\n    line 2: field 'answer': missing"):
        prepare_dataset(path)


def test_a_csv_line_with_more_fields_than_its_header_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "mine.csv"
    path.write_text("problem,answer\nA?,1\nB?,2,3\n")
    with pytest.raises(
        ValueError,
        match=r"mine\.csv: 1 bad row, numbered by line of the file, the header being line 1:\n    line 3: more fields than the header's 2 \(problem, answer\)",
    ):
        prepare_dataset(path)


def test_an_empty_answer_cell_is_refused_naming_the_row_and_field(tmp_path):
    path = tmp_path / "mine.csv"
    path.write_text("problem,answer\nA?,\n")
    with pytest.raises(ValueError, match=r"mine\.csv: 1 bad row.*\n    line 2: field 'answer': expected a non-empty string"):
        prepare_dataset(path)


def test_a_data_source_of_a_kind_is_scored_by_that_kinds_reward_function():
    assert reward_function_for("math/problems") is REWARD_FUNCTIONS["math"]
    assert reward_function_for("arithmetic/mine") is REWARD_FUNCTIONS["arithmetic"]
    assert reward_function_for("my_sums") is None and reward_function_for("my/math") is None


def test_a_question_whose_answer_ends_in_hashes_and_a_number_is_read_in_gsm8ks_layout(own_files, tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"question": "A?", "answer": "so #### 1,234"}) + "\n")
    assert prepare_dataset(path).rows[0]["reward_model"]["ground_truth"] == "1234"


def test_prepare_check_refuses_a_data_source_that_no_reward_function_scores(own_files, tmp_path, capsys):
    out = tmp_path / "mine.parquet"
    assert run(["prepare", "--input", str(own_files / "problems.jsonl"), "--out", str(out), "--data-source", "my_sums"]) == 0
    assert run(["prepare", "--check", str(out)]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert f"no reward function for data_source 'my_sums' (first at {out}: row 1)" in error
    assert len(read_rows(out)) == 4
