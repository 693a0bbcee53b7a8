"""A data file's errors: every bad row at once (up to `MAX_REPORTED_ROWS`, the rest counted), one
numbering stated once in the message's header (the file's lines, from 1; a csv's header is line 1;
a parquet file's rows), unreadable records and bad fields in one list by line."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pacs.data.loading import row_location
from pacs.data.prepare import prepare_dataset, read_rows
from pacs.data.schema import MAX_REPORTED_ROWS


def _row(ground_truth: object = "7") -> dict:
    return {
        "data_source": "arithmetic",
        "prompt": [{"role": "user", "content": "What is 3 + 4?"}],
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
    }


def _error(read, path: Path) -> str:
    with pytest.raises(ValueError) as error:
        read(path)
    return str(error.value)


def test_rows_5_and_6_bad_are_both_reported_by_line_a_parse_error_and_a_bad_field_in_one_list(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(_row()) + "\n" for _ in range(4)) + "{oops\n" + json.dumps(_row(7)) + "\n")
    assert _error(read_rows, path).splitlines() == [
        f"{path}: 2 bad rows, numbered by line of the file, the first line being 1:",
        "    line 5: invalid JSON (Expecting property name enclosed in double quotes)",
        "    line 6: field 'reward_model.ground_truth': expected a string, got int 7",
    ]


def test_blank_lines_count_as_lines(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(_row()) + "\n\n\n" + json.dumps(_row(7)) + "\n")
    assert _error(read_rows, path).splitlines()[1].startswith("    line 4: field 'reward_model.ground_truth'")


def test_a_csv_row_is_named_by_the_physical_line_it_starts_on_the_header_being_line_1(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text('problem,answer\n"A long\nproblem?",1\nB?,\n"C?",3,extra\n')
    assert _error(prepare_dataset, path).splitlines() == [
        f"{path}: 2 bad rows, numbered by line of the file, the header being line 1:",
        "    line 4: field 'answer': expected a non-empty string or a finite number, got str ''",
        "    line 5: more fields than the header's 2 (problem, answer)",
    ]


def test_a_json_list_names_each_object_by_the_line_it_starts_on(tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    path.write_text("[\n" + json.dumps(_row()) + ",\n" + json.dumps(_row(), indent=1) + ",\n" + json.dumps(_row(7)) + "\n]")
    starts_on = 3 + json.dumps(_row(), indent=1).count("\n") + 1
    assert _error(read_rows, path).splitlines()[1].startswith(f"    line {starts_on}: field 'reward_model.ground_truth'")


def test_a_parquet_file_is_numbered_by_row_and_says_it_has_no_lines(tmp_path: Path) -> None:
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([_row(), _row(), {**_row(), "data_source": ""}]), path)
    assert _error(read_rows, path).splitlines() == [
        f"{path}: 1 bad row, numbered by row of the file, the first row being 1 (a parquet file has no lines):",
        "    row 3: field 'data_source': expected a non-empty string, got ''",
    ]


def test_past_the_cap_the_other_bad_rows_are_counted(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(_row(number)) + "\n" for number in range(MAX_REPORTED_ROWS + 5)))
    lines = _error(read_rows, path).splitlines()
    assert lines[0].startswith(f"{path}: {MAX_REPORTED_ROWS + 5} bad rows")
    assert [line.split(":")[0].strip() for line in lines[1:-1]] == [f"line {n}" for n in range(1, MAX_REPORTED_ROWS + 1)]
    assert lines[-1] == "    ... and 5 more bad rows"


def test_prepare_reports_every_row_it_cannot_convert(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    records = [
        {"question": "A?", "answer": "1"},
        {"question": "B?"},
        {"question": "C?", "answer": "3"},
        {"question": "", "answer": 4},
    ]
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    lines = _error(prepare_dataset, path).splitlines()
    assert lines[0] == f"{path}: 2 bad rows, numbered by line of the file, the first line being 1:"
    assert lines[1].startswith("    line 2: field 'answer': missing") and lines[2].startswith("    line 4: field 'question'")


def test_a_loaded_rows_location_is_numbered_as_the_data_checks_number_it(tmp_path: Path) -> None:
    """What names a row once it loaded (a reward probe, pacs eval) uses the checks' numbering."""
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text(json.dumps(_row()) + "\n\n" + json.dumps(_row()) + "\n")
    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([_row(), _row()]), parquet)
    assert [row_location(str(jsonl), position) for position in (0, 1)] == [f"{jsonl}: line 1", f"{jsonl}: line 3"]
    assert row_location(str(parquet), 1) == f"{parquet}: row 2"
    assert row_location("builtin:arithmetic", 0) == "builtin:arithmetic: row 1"
