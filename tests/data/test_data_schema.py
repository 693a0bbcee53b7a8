"""Specification of the row schema check: every error names the file, the row and the field."""

from __future__ import annotations

import re

import pytest

from pacs.data.schema import validate_rows


def _valid_row() -> dict:
    return {
        "data_source": "math500",
        "prompt": [{"role": "user", "content": "What is 1+1?\nPlease reason step by step."}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "2"},
        "extra_info": {"split": "test", "index": 1, "repeat": 0},
    }


MISSING = object()


def _row_with(path: str, value: object) -> dict:
    """Return a valid row whose dotted ``path`` is set to ``value``, or deleted if it is ``MISSING``."""
    row = _valid_row()
    *parents, leaf = path.split(".")
    parent = row
    for key in parents:
        parent = parent[key]
    if value is MISSING:
        del parent[leaf]
    else:
        parent[leaf] = value
    return row


def test_valid_rows_pass() -> None:
    validate_rows([_valid_row(), _valid_row()], "rows.parquet")


def test_optional_fields_may_be_absent_or_null() -> None:
    bare = {key: value for key, value in _valid_row().items() if key in ("data_source", "prompt", "reward_model")}
    nulls = {**_valid_row(), "ability": None, "extra_info": {"index": None}, "reward_model": {"ground_truth": "2", "style": None}}
    validate_rows([bare, nulls], "rows.parquet")


def test_error_for_a_row_that_is_not_a_dict_names_the_row() -> None:
    with pytest.raises(ValueError, match=r"^rows\.parquet: 1 bad row.*\n    row 2: expected a row object \(a dict\), got list"):
        validate_rows([_valid_row(), ["not", "a", "row"]], "rows.parquet")


def test_ground_truth_of_the_wrong_type_is_named_with_its_value() -> None:
    row = _valid_row()
    row["reward_model"]["ground_truth"] = 27.0
    with pytest.raises(ValueError) as error:
        validate_rows([_valid_row(), row], "math500.parquet")
    assert str(error.value) == (
        "math500.parquet: 1 bad row, numbered by position in the list of rows, the first being 1:\n"
        "    row 2: field 'reward_model.ground_truth': expected a string, got float 27.0"
    )


@pytest.mark.parametrize(
    ("path", "value", "field", "message"),
    [
        ("data_source", MISSING, "data_source", "missing; a row needs data_source, prompt and reward_model.ground_truth"),
        ("data_source", "", "data_source", "expected a non-empty string"),
        ("data_source", 3, "data_source", "expected a string, got int 3"),
        ("prompt", MISSING, "prompt", "missing"),
        ("prompt", "What is 1+1?", "prompt", "expected a non-empty list of chat messages"),
        ("prompt", [], "prompt", "expected a non-empty list of chat messages"),
        ("prompt", ["What is 1+1?"], "prompt[0]", "expected a chat message"),
        (
            "prompt",
            [{"role": "bot", "content": "hi"}],
            "prompt[0].role",
            r"expected one of \['system', 'user', 'assistant'\], got str 'bot'",
        ),
        ("prompt", [{"role": "user"}], "prompt[0].content", "expected a string, got NoneType None"),
        ("ability", 1, "ability", "expected a string, got int 1"),
        ("reward_model", MISSING, "reward_model", "missing"),
        ("reward_model", "2", "reward_model", r"expected \{'style': 'rule', 'ground_truth': ...\}, got str '2'"),
        ("reward_model.ground_truth", MISSING, "reward_model.ground_truth", "missing; expected a non-empty string"),
        ("reward_model.ground_truth", " ", "reward_model.ground_truth", "expected a non-empty string"),
        ("reward_model.style", "model", "reward_model.style", "expected 'rule', got str 'model'"),
        ("extra_info", [1], "extra_info", "expected a dict, got list"),
        ("extra_info.index", "3", "extra_info.index", "expected an integer, got str '3'"),
        ("extra_info.index", True, "extra_info.index", "expected an integer, got bool True"),
        ("extra_info.repeat", 1.0, "extra_info.repeat", "expected an integer, got float 1.0"),
    ],
)
def test_each_schema_error_names_the_row_and_the_field(path: str, value: object, field: str, message: str) -> None:
    row = _row_with(path, value)
    with pytest.raises(ValueError, match=rf"^rows\.jsonl: 1 bad row.*\n    row 2: field '{re.escape(field)}': {message}"):
        validate_rows([_valid_row(), row], "rows.jsonl")


@pytest.mark.parametrize("character", ["\f", "\t", "\b", "\r", "\x00", "\x7f"])
def test_control_character_in_a_prompt_is_flagged_with_row_field_and_character(character: str) -> None:
    row = _valid_row()
    row["prompt"][0]["content"] = f"Find ${character}rac{{m}}{{n}}$."
    with pytest.raises(
        ValueError,
        match=rf"^rows\.jsonl: 1 bad row.*\n    row 2: field 'prompt\[0\]\.content': control character {re.escape(repr(character))} at position 6",
    ):
        validate_rows([_valid_row(), row], "rows.jsonl")
