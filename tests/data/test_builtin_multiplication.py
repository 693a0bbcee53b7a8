"""Specification of the built-in tool task `builtin:multiplication`: products of two many-digit numbers."""

from __future__ import annotations

import pytest

from pacs.data.arithmetic import generate_multiplications
from pacs.data.loading import load_rows


def _operands(row: dict) -> tuple[int, int]:
    left, right = row["extra_info"]["expression"].split("*")
    return int(left), int(right)


def test_row_follows_the_shared_schema_of_the_arithmetic_task() -> None:
    row = generate_multiplications("train", 1)[0]
    assert row["data_source"] == "arithmetic" and row["ability"] == "arithmetic"
    assert row["reward_model"]["style"] == "rule"
    assert row["extra_info"]["split"] == "train" and row["extra_info"]["index"] == 0
    assert row["prompt"] == [
        {"role": "user", "content": f"What is {row['extra_info']['expression']}? Put the final answer in \\boxed{{}}."}
    ]


@pytest.mark.parametrize("digits", [2, 4, 5])
def test_both_operands_have_exactly_the_digits_asked_for(digits: int) -> None:
    for row in generate_multiplications("train", 200, digits=digits):
        assert all(len(str(operand)) == digits for operand in _operands(row))


def test_ground_truth_is_the_product() -> None:
    for row in generate_multiplications("val", 200):
        left, right = _operands(row)
        assert row["reward_model"]["ground_truth"] == str(left * right)


@pytest.mark.parametrize("seed", [0, 1, 5])
def test_train_and_val_are_disjoint_for_any_seeds(seed: int) -> None:
    train = generate_multiplications("train", 2000, digits=2, seed=seed)
    val = generate_multiplications("val", 100, digits=2, seed=seed + 1)
    assert not {row["extra_info"]["expression"] for row in train} & {row["extra_info"]["expression"] for row in val}


def test_no_problem_repeats_inside_a_split_and_generation_is_deterministic() -> None:
    rows = generate_multiplications("train", 500, digits=2)
    assert len({row["extra_info"]["expression"] for row in rows}) == 500
    assert rows == generate_multiplications("train", 500, digits=2)
    assert rows != generate_multiplications("train", 500, digits=2, seed=1)


def test_asking_for_more_problems_than_exist_is_refused_with_the_count() -> None:
    with pytest.raises(ValueError, match=r"Requested 8100 val problems but only \d+ distinct ones exist with 2-digit operands"):
        generate_multiplications("val", 8100, digits=2)


def test_the_spec_sets_digits_size_split_and_seed() -> None:
    rows = load_rows("builtin:multiplication?digits=3&size=5&split=train&seed=2", default_split="val")
    assert rows == generate_multiplications("train", 5, digits=3, seed=2)
    assert len(load_rows("builtin:multiplication", default_split="val")) == 200
    assert all(len(str(operand)) == 4 for operand in _operands(load_rows("builtin:multiplication", default_split="val")[0]))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("builtin:multiplication?max_operand=9", r"Unknown parameter\(s\) \['max_operand'\].*valid: \['digits', 'size'"),
        ("builtin:multiplication?digits=1", "digits=1 .* must be an integer >= 2"),
        ("builtin:multiplication?split=test", "split='test' .* must be one of"),
    ],
)
def test_a_bad_parameter_is_refused_naming_it(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_rows(spec, default_split="train")
