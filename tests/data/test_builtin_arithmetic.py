"""Specification of the built-in arithmetic task and of loading rows from a data spec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pacs.data.arithmetic import answer_text, generate_problems
from pacs.data.loading import load_rows, render_prompt
from pacs.models.tiny import build_char_tokenizer


def _recompute(expression: str) -> int:
    """Evaluate ``a<op>b`` with int arithmetic (the first operand is never negative)."""
    for op, combine in (("+", int.__add__), ("*", int.__mul__), ("-", int.__sub__)):
        left, found, right = expression.partition(op)
        if found:
            return combine(int(left), int(right))
    raise AssertionError(f"no operator in {expression!r}")


def _expressions(rows: list[dict]) -> set[str]:
    return {row["extra_info"]["expression"] for row in rows}


def test_row_follows_the_shared_schema() -> None:
    row = generate_problems("train", 1)[0]
    assert row["data_source"] == "arithmetic"
    assert row["ability"] == "arithmetic"
    assert row["reward_model"]["style"] == "rule"
    assert row["extra_info"]["split"] == "train"
    assert row["prompt"] == [
        {
            "role": "user",
            "content": f"What is {row['extra_info']['expression']}? Put the final answer in \\boxed{{}}.",
        }
    ]


def test_generation_is_deterministic() -> None:
    assert generate_problems("train", 50, seed=3) == generate_problems("train", 50, seed=3)


def test_different_seeds_give_different_problems() -> None:
    assert generate_problems("train", 50, seed=0) != generate_problems("train", 50, seed=1)


@pytest.mark.parametrize("seed", [0, 1, 2, 7])
def test_train_and_val_are_disjoint_for_any_seeds(seed: int) -> None:
    train = generate_problems("train", 2000, seed=seed)
    val = generate_problems("val", 500, seed=seed + 100)
    assert not _expressions(train) & _expressions(val)


def test_no_problem_repeats_inside_a_split() -> None:
    rows = generate_problems("train", 250, digits=1)
    assert len(_expressions(rows)) == len(rows)


def test_indices_count_from_zero() -> None:
    assert [row["extra_info"]["index"] for row in generate_problems("val", 20)] == list(range(20))


@pytest.mark.parametrize("op", ["+", "-", "*"])
def test_ground_truth_is_the_integer_result(op: str) -> None:
    for row in generate_problems("train", 200, operations=op):
        assert row["reward_model"]["ground_truth"] == str(_recompute(row["extra_info"]["expression"]))


def test_subtraction_can_give_negative_answers() -> None:
    assert any(int(row["reward_model"]["ground_truth"]) < 0 for row in generate_problems("train", 100, operations="-"))


def test_digits_bound_the_operands() -> None:
    for row in generate_problems("train", 200, digits=3, operations="+"):
        left, right = row["extra_info"]["expression"].split("+")
        assert 0 <= int(left) < 1000 and 0 <= int(right) < 1000


def test_max_operand_bounds_the_operands_and_covers_the_whole_range() -> None:
    rows = generate_problems("train", 5000, max_operand=19, operations="+", allow_fewer=True)
    operands = [int(part) for row in rows for part in row["extra_info"]["expression"].split("+")]
    assert min(operands) == 0 and max(operands) == 19
    assert len(rows) + len(generate_problems("val", 5000, max_operand=19, operations="+", allow_fewer=True)) == 400


def test_spec_without_size_takes_every_problem_when_fewer_than_the_default_exist() -> None:
    assert (
        len(load_rows("builtin:arithmetic?max_operand=19", default_split="val"))
        == len(generate_problems("val", 200, max_operand=19, allow_fewer=True))
        < 200
    )


def test_spec_with_both_digits_and_max_operand_is_rejected() -> None:
    with pytest.raises(ValueError, match="sets both digits and max_operand"):
        load_rows("builtin:arithmetic?digits=2&max_operand=19", default_split="val")


def test_multiplication_has_a_single_digit_second_operand() -> None:
    for row in generate_problems("train", 200, digits=3, operations="*"):
        assert 0 <= int(row["extra_info"]["expression"].split("*")[1]) < 10


def test_operations_restrict_the_operators() -> None:
    expressions = _expressions(generate_problems("train", 200, operations="+-"))
    assert not any("*" in expression for expression in expressions)


def test_requesting_more_problems_than_exist_says_how_many_exist() -> None:
    with pytest.raises(ValueError, match=r"only \d+ distinct ones exist"):
        generate_problems("val", 1000, digits=1)


@pytest.mark.parametrize("operations", ["", "/", "+x"])
def test_invalid_operations_are_rejected(operations: str) -> None:
    with pytest.raises(ValueError, match="subset of"):
        generate_problems("train", 10, operations=operations)


def test_unknown_split_is_rejected() -> None:
    with pytest.raises(ValueError, match="'train', 'val'"):
        generate_problems("test", 10)


def test_answer_text_boxes_the_ground_truth() -> None:
    row = generate_problems("train", 1)[0]
    assert answer_text(row) == f"\\boxed{{{row['reward_model']['ground_truth']}}}"


def test_builtin_spec_uses_default_split_and_size() -> None:
    rows = load_rows("builtin:arithmetic", default_split="val")
    assert len(rows) == 200 and {row["extra_info"]["split"] for row in rows} == {"val"}


def test_builtin_spec_default_train_size_is_2000() -> None:
    assert len(load_rows("builtin:arithmetic", default_split="train")) == 2000


def test_builtin_spec_parameters_are_applied() -> None:
    rows = load_rows("builtin:arithmetic?digits=3&size=50&operations=+-&split=val&seed=1", default_split="train")
    assert rows == generate_problems("val", 50, digits=3, operations="+-", seed=1)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("builtin:arithmetic?digits=0", "digits='0'.*integer >= 1"),
        ("builtin:arithmetic?size=many", "size='many'.*integer >= 1"),
        ("builtin:arithmetic?seed=x", "seed='x'.*integer"),
        ("builtin:arithmetic?split=test", "split='test'.*'train', 'val'"),
        ("builtin:arithmetic?operations=/", "subset of"),
        ("builtin:arithmetic?level=2", "Unknown parameter.*'level'.*valid"),
        ("builtin:arithmetic?size=1&size=2", "'size' is given more than once"),
        ("builtin:arithmetic?digits", "Malformed parameters"),
        ("builtin:geometry", "Unknown built-in dataset.*builtin:arithmetic"),
        ("data/train.csv", r"Unsupported data spec.*\.json, \.jsonl, \.parquet"),
    ],
)
def test_invalid_data_spec_is_explained(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_rows(spec, default_split="train")


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_jsonl_rows_are_loaded_as_written(tmp_path: Path) -> None:
    rows = generate_problems("train", 3)
    path = _write_lines(tmp_path / "rows.jsonl", [json.dumps(row) for row in rows])
    assert load_rows(str(path), default_split="train") == rows


def test_jsonl_blank_lines_are_skipped(tmp_path: Path) -> None:
    row = generate_problems("train", 1)[0]
    path = _write_lines(tmp_path / "rows.jsonl", ["", json.dumps(row), "  "])
    assert load_rows(str(path), default_split="train") == [row]


def test_jsonl_invalid_json_names_file_and_line(tmp_path: Path) -> None:
    row = generate_problems("train", 1)[0]
    path = _write_lines(tmp_path / "rows.jsonl", [json.dumps(row), "{not json"])
    with pytest.raises(ValueError, match=r"rows\.jsonl: 1 bad row, numbered by line of the file.*\n    line 2: invalid JSON"):
        load_rows(str(path), default_split="train")


@pytest.mark.parametrize("missing", ["data_source", "prompt", "reward_model"])
def test_jsonl_missing_key_names_row_and_key(tmp_path: Path, missing: str) -> None:
    row = generate_problems("train", 1)[0]
    del row[missing]
    path = _write_lines(tmp_path / "rows.jsonl", [json.dumps(row)])
    with pytest.raises(ValueError, match=rf"\n    line 1: field '{missing}': missing"):
        load_rows(str(path), default_split="train")


def test_jsonl_missing_ground_truth_is_named(tmp_path: Path) -> None:
    row = generate_problems("train", 1)[0]
    del row["reward_model"]["ground_truth"]
    path = _write_lines(tmp_path / "rows.jsonl", [json.dumps(row)])
    with pytest.raises(ValueError, match=r"\n    line 1: field 'reward_model\.ground_truth': missing"):
        load_rows(str(path), default_split="train")


def test_jsonl_line_that_is_not_an_object_is_rejected(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "rows.jsonl", ["[1, 2]"])
    with pytest.raises(ValueError, match=r"\n    line 1: expected a JSON object"):
        load_rows(str(path), default_split="train")


def test_empty_jsonl_is_rejected(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "rows.jsonl", [""])
    with pytest.raises(ValueError, match="contains no rows"):
        load_rows(str(path), default_split="train")


def test_missing_jsonl_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="absent.jsonl"):
        load_rows(str(tmp_path / "absent.jsonl"), default_split="train")


def test_render_prompt_applies_the_chat_template() -> None:
    row = generate_problems("train", 1)[0]
    expression = row["extra_info"]["expression"]
    assert render_prompt(build_char_tokenizer(), row) == (
        f"<|user|>What is {expression}? Put the final answer in \\boxed{{}}.<|end|><|assistant|>"
    )
