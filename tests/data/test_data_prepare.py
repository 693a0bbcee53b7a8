"""Specification of converting the public benchmark files into schema rows, and of row files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from benchmark_data import BENCHMARK_DATA
from running import run

from pacs.data.loading import load_rows
from pacs.data.prepare import (
    PROMPT_SUFFIX,
    SOURCES,
    UNVERIFIABLE_LIMIT,
    check_file,
    prepare_dataset,
    read_records,
    read_rows,
    write_parquet,
)
from pacs.data.schema import FORBIDDEN_CONTROL_CHARACTER, validate_rows
from pacs.rewards.checks import unverifiable_ground_truths

SHARED_FILES = {
    "math500.jsonl": ("math500", 500),
    "aime2024.jsonl": ("aime2024", 30),
    "aime2025.jsonl": ("aime2025", 30),
    "amc23.jsonl": ("amc23", 40),
    "gsm8k_test.jsonl": ("gsm8k", 1319),
    "deepscaler_sample.json": ("deepscaler", 803),
}


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def _content(row: dict) -> str:
    return row["prompt"][0]["content"]


@pytest.mark.parametrize("file_name", SHARED_FILES)
def test_every_shared_file_prepares_every_row_and_passes_the_schema(file_name: str) -> None:
    source, row_count = SHARED_FILES[file_name]
    prepared = prepare_dataset(BENCHMARK_DATA / file_name)
    assert len(prepared.rows) == prepared.report.rows_read == prepared.report.rows_written == row_count
    assert {row["data_source"] for row in prepared.rows} == {source}
    validate_rows(prepared.rows, file_name)


def test_prompt_is_the_problem_as_one_user_message_with_the_boxed_suffix() -> None:
    record = read_records(BENCHMARK_DATA / "math500.jsonl")[0]
    row = prepare_dataset(BENCHMARK_DATA / "math500.jsonl").rows[0]
    assert PROMPT_SUFFIX == " Please reason step by step, and put your final answer within \\boxed{}."
    assert row["prompt"] == [{"role": "user", "content": record["problem"] + PROMPT_SUFFIX}]


def test_rows_are_math_with_a_rule_reward_on_the_source_answer() -> None:
    row = prepare_dataset(BENCHMARK_DATA / "math500.jsonl").rows[0]
    assert row["ability"] == "math"
    assert row["reward_model"] == {"style": "rule", "ground_truth": "\\left( 3, \\frac{\\pi}{2} \\right)"}


def test_extra_info_keeps_the_source_position_and_reference_fields() -> None:
    record = read_records(BENCHMARK_DATA / "math500.jsonl")[7]
    extra_info = prepare_dataset(BENCHMARK_DATA / "math500.jsonl").rows[7]["extra_info"]
    assert extra_info == {
        "split": "test",
        "index": 7,
        "repeat": 0,
        **{key: record[key] for key in ("solution", "answer", "subject", "level", "unique_id")},
    }


def test_deepscaler_defaults_to_the_train_split() -> None:
    rows = prepare_dataset(BENCHMARK_DATA / "deepscaler_sample.json").rows
    assert {row["extra_info"]["split"] for row in rows} == {"train"}
    assert set(rows[0]["extra_info"]) >= {"solution", "answer", "difficulty"}


def test_split_can_be_chosen() -> None:
    rows = prepare_dataset(BENCHMARK_DATA / "aime2025.jsonl", split="val").rows
    assert {row["extra_info"]["split"] for row in rows} == {"val"}


def test_amc23_float_answers_become_integer_text_and_are_counted() -> None:
    prepared = prepare_dataset(BENCHMARK_DATA / "amc23.jsonl")
    assert prepared.rows[0]["reward_model"]["ground_truth"] == "27"
    assert prepared.rows[0]["extra_info"]["answer"] == 27.0
    assert all(re.fullmatch(r"-?\d+", row["reward_model"]["ground_truth"]) for row in prepared.rows)
    assert prepared.report.normalised_answers == 40


@pytest.mark.parametrize(
    ("answer", "text"),
    [
        (2.5, "2.5"),
        (1e-07, "0.0000001"),
        (1.5e-10, "0.00000000015"),
        (-0.25, "-0.25"),
        (1e20, "100000000000000000000"),
        (1e23, "100000000000000000000000"),
        (27.0, "27"),
        (-0.0, "0"),
    ],
)
def test_float_answers_are_written_in_plain_positional_decimal_notation(tmp_path: Path, answer: float, text: str) -> None:
    path = _write_jsonl(tmp_path / "amc23.jsonl", [{"problem": "Compute it.", "answer": answer}])
    assert prepare_dataset(path).rows[0]["reward_model"]["ground_truth"] == text


def test_aime2024_answers_keep_their_leading_zeros() -> None:
    ground_truths = [row["reward_model"]["ground_truth"] for row in prepare_dataset(BENCHMARK_DATA / "aime2024.jsonl").rows]
    assert ground_truths[:3] == ["204", "113", "371"]
    assert {"025", "073", "023", "045", "033", "080", "055"} <= set(ground_truths)


def test_gsm8k_ground_truth_is_the_number_after_the_hashes_without_commas() -> None:
    records = read_records(BENCHMARK_DATA / "gsm8k_test.jsonl")
    prepared = prepare_dataset(BENCHMARK_DATA / "gsm8k_test.jsonl")
    with_commas = [index for index, record in enumerate(records) if record["answer"].endswith("#### 2,125")]
    assert len(with_commas) == 1
    row = prepared.rows[with_commas[0]]
    assert row["reward_model"]["ground_truth"] == "2125"
    assert row["extra_info"]["solution"] == records[with_commas[0]]["answer"]
    assert prepared.rows[0]["reward_model"]["ground_truth"] == "18"
    assert prepared.report.normalised_answers == 14


def test_gsm8k_answer_without_hashes_is_refused_naming_the_row(tmp_path: Path) -> None:
    path = _write_jsonl(
        tmp_path / "gsm8k.jsonl",
        [
            {"question": "1+1?", "answer": "1+1=2\n#### 2"},
            {"question": "2+2?", "answer": "2+2=4, so the answer is 4"},
        ],
    )
    with pytest.raises(
        ValueError,
        match=r"gsm8k\.jsonl: 1 bad row.*\n    line 2: field 'answer': expected a worked solution ending in '#### <answer>'",
    ):
        prepare_dataset(path)


def test_aime2025_broken_latex_escapes_are_repaired_and_reported() -> None:
    prepared = prepare_dataset(BENCHMARK_DATA / "aime2025.jsonl")
    assert prepared.report.repaired_control_characters == [19, 20, 28]  # lines of the file
    assert "\\prod^{63}_{k=4} \\frac{\\log_k (5^{k^2 - 1})}" in _content(prepared.rows[18])
    assert "The circumcircle of $\\triangle DEF$ intersects" in _content(prepared.rows[19])
    assert "can be expressed as $\\frac{m}{n}$ for" in _content(prepared.rows[27])
    assert not any(FORBIDDEN_CONTROL_CHARACTER.search(_content(row)) for row in prepared.rows)
    assert "3 rows (lines 19, 20, 28)" in prepared.report.summary()


def test_whitespace_tabs_become_spaces_and_are_reported() -> None:
    prepared = prepare_dataset(BENCHMARK_DATA / "math500.jsonl")
    assert prepared.report.tabs_replaced == [18, 427]
    assert prepared.report.repaired_control_characters == []
    assert _content(prepared.rows[426]).startswith("A square and an equilateral triangle have equal perimeters. The area")


@pytest.mark.parametrize(
    ("problem", "repaired"),
    [
        ("Find $\x0crac{1}{2}$.", "Find $\\frac{1}{2}$."),
        ("Find $\x08eta$.", "Find $\\beta$."),
        ("Find $3\times 4$.", "Find $3\\times 4$."),
        ("Find $\text{the answer}$.", "Find $\\text{the answer}$."),
        ("Find $\\left(x\right)$.", "Find $\\left(x\\right)$."),
        ("Find\tthe\tanswer.", "Find the answer."),
    ],
    ids=["form-feed-rac", "backspace-eta", "tab-imes", "tab-ext", "carriage-return-ight", "tab-before-words"],
)
def test_control_character_starting_a_latex_command_is_repaired_and_a_tab_before_words_is_a_space(
    tmp_path: Path, problem: str, repaired: str
) -> None:
    path = _write_jsonl(tmp_path / "aime2025.jsonl", [{"problem": problem, "answer": "1"}])
    assert _content(prepare_dataset(path).rows[0]) == repaired + PROMPT_SUFFIX


@pytest.mark.parametrize(
    "problem",
    [
        "A square and\tan equilateral triangle have equal perimeters.",
        "Walk\to the door.",
        "The Greek letter is\tau in French.",
        "Sort by\top score.",
        "The last letter is\tt.",
    ],
)
def test_a_whitespace_tab_before_a_word_that_ends_a_latex_command_stays_whitespace_outside_math(
    tmp_path: Path, problem: str
) -> None:
    prepared = prepare_dataset(_write_jsonl(tmp_path / "aime2025.jsonl", [{"problem": problem, "answer": "1"}]))
    assert _content(prepared.rows[0]) == problem.replace("\t", " ") + PROMPT_SUFFIX
    assert prepared.report.tabs_replaced == [1] and prepared.report.repaired_control_characters == []


@pytest.mark.parametrize(
    ("problem", "repaired"),
    [
        ("Find $\tan x$ and\tan angle.", "Find $\\tan x$ and an angle."),
        ("As \\(x\to 0\\), find $$\tau^2$$.", "As \\(x\\to 0\\), find $$\\tau^2$$."),
        ("Let \\[A^\top B\\].", "Let \\[A^\\top B\\]."),
        ("Cost \\$5 and\tan $x$.", "Cost \\$5 and an $x$."),
    ],
    ids=["inline", "parenthesis-and-display", "bracket-display", "escaped-dollar"],
)
def test_a_tab_before_a_word_that_ends_a_latex_command_is_that_command_inside_math(
    tmp_path: Path, problem: str, repaired: str
) -> None:
    path = _write_jsonl(tmp_path / "aime2025.jsonl", [{"problem": problem, "answer": "1"}])
    assert _content(prepare_dataset(path).rows[0]) == repaired + PROMPT_SUFFIX


@pytest.mark.parametrize("problem", ["Ring \x07 the bell.", "Page\x0c 2.", "Line\rOne ends."])
def test_unrepairable_control_character_is_refused_naming_file_row_field_and_character(tmp_path: Path, problem: str) -> None:
    character = FORBIDDEN_CONTROL_CHARACTER.search(problem).group()
    path = _write_jsonl(tmp_path / "aime2025.jsonl", [{"problem": "Fine.", "answer": "1"}, {"problem": problem, "answer": "2"}])
    with pytest.raises(
        ValueError,
        match=rf"aime2025\.jsonl: 1 bad row.*\n    line 2: field 'problem': control character {re.escape(repr(character))}",
    ):
        prepare_dataset(path)


@pytest.mark.parametrize(
    ("problem", "repaired"),
    [
        ("Show that $a \neq b$.", "Show that $a \\neq b$."),
        ("Is x \neq y?", "Is x \\neq y?"),
        ("The frequency $\nu$ is 2.", "The frequency $\\nu$ is 2."),
    ],
)
def test_a_newline_starting_a_latex_command_is_repaired_and_reported(tmp_path: Path, problem: str, repaired: str) -> None:
    path = _write_jsonl(tmp_path / "aime2025.jsonl", [{"problem": problem, "answer": "1"}])
    prepared = prepare_dataset(path)
    assert _content(prepared.rows[0]) == repaired + PROMPT_SUFFIX
    assert prepared.report.repaired_control_characters == [1]


@pytest.mark.parametrize("problem", ["First line.\nSecond line.", "Lines:\nu and v.", "Read:\ni) one\nii) two"])
def test_a_newline_before_prose_stays_a_newline(tmp_path: Path, problem: str) -> None:
    path = _write_jsonl(tmp_path / "aime2025.jsonl", [{"problem": problem, "answer": "1"}])
    prepared = prepare_dataset(path)
    assert _content(prepared.rows[0]) == problem + PROMPT_SUFFIX
    assert prepared.report.repaired_control_characters == []


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085"])
def test_a_line_separator_inside_a_json_string_does_not_split_the_line(tmp_path: Path, separator: str) -> None:
    path = tmp_path / "aime2025.jsonl"
    path.write_text(
        json.dumps({"problem": f"Find x.{separator}Then y.", "answer": "1"}, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    assert read_records(path) == [{"problem": f"Find x.{separator}Then y.", "answer": "1"}]


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_deeply_nested_json_is_refused_naming_the_file(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"aime2025{suffix}"
    path.write_text('{"problem": ' + "[" * 100_000 + "]" * 100_000 + "}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"aime2025\{suffix}(: 1 bad row.*\n    line 1)?: JSON nested too deeply to read"):
        read_records(path)


def test_parquet_text_that_is_not_utf8_is_refused_naming_the_file_and_column(tmp_path: Path) -> None:
    path = tmp_path / "math500.parquet"
    pq.write_table(pa.table({"problem": pa.array([b"ok", b"bad \xff"], pa.binary()).view(pa.string())}), path)
    with pytest.raises(ValueError, match=r"math500\.parquet: column 'problem' holds text that is not UTF-8"):
        read_records(path)


def test_write_parquet_refuses_a_file_name_that_is_not_parquet(tmp_path: Path) -> None:
    rows = prepare_dataset(BENCHMARK_DATA / "amc23.jsonl").rows
    with pytest.raises(ValueError, match=r"rows\.jsonl: rows are written as parquet; give a file name ending in \.parquet"):
        write_parquet(rows, tmp_path / "rows.jsonl")
    assert not (tmp_path / "rows.jsonl").exists()


def test_aime2024_capitalised_spellings_in_parquet_are_accepted(tmp_path: Path) -> None:
    records = read_records(BENCHMARK_DATA / "aime2024.jsonl")[:3]
    capitalised = [
        {"Problem": record["problem"], "Solution": record["solution"], "Answer": record["answer"]} for record in records
    ]
    path = tmp_path / "AIME_2024.parquet"
    pq.write_table(pa.Table.from_pylist(capitalised), path)
    rows = prepare_dataset(path).rows
    assert [_content(row) for row in rows] == [record["problem"] + PROMPT_SUFFIX for record in records]
    assert [row["reward_model"]["ground_truth"] for row in rows] == [record["answer"] for record in records]
    assert [row["extra_info"]["solution"] for row in rows] == [record["solution"] for record in records]


def test_amc23_with_only_a_question_field_is_accepted(tmp_path: Path) -> None:
    records = [{"id": 0, "question": "How many?", "answer": 27.0}]
    row = prepare_dataset(_write_jsonl(tmp_path / "amc.jsonl", records)).rows[0]
    assert _content(row) == "How many?" + PROMPT_SUFFIX
    assert row["reward_model"]["ground_truth"] == "27"


def test_missing_required_field_names_file_row_and_accepted_spellings(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "aime24.jsonl", [{"Problem": "Find x.", "Answer": "1"}, {"Answer": "2"}])
    with pytest.raises(
        ValueError,
        match=r"aime24\.jsonl: 1 bad row.*\n    line 2: field 'problem': missing; accepted spellings: 'problem', 'Problem', 'question'",
    ):
        prepare_dataset(path)


@pytest.mark.parametrize(
    ("file_name", "source"),
    [
        ("MATH500.jsonl", "math500"),
        ("math_500_test.parquet", "math500"),
        ("math-500.json", "math500"),
        ("aime2024.jsonl", "aime2024"),
        ("AIME24.parquet", "aime2024"),
        ("aime_2024_test.jsonl", "aime2024"),
        ("aime2025.jsonl", "aime2025"),
        ("aime25.jsonl", "aime2025"),
        ("amc23.jsonl", "amc23"),
        ("AMC.parquet", "amc23"),
        ("gsm8k_test.jsonl", "gsm8k"),
        ("DeepScaleR_sample.json", "deepscaler"),
        ("BeyondAIME.parquet", "beyondaime"),
        ("beyond_aime_test.jsonl", "beyondaime"),
    ],
)
def test_a_file_name_that_spells_a_source_labels_the_rows_with_it(tmp_path: Path, file_name: str, source: str) -> None:
    path = tmp_path / file_name
    records = [{"problem": "Find x.", "answer": "7"}]
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(records), path)
    else:
        path.write_text(json.dumps(records) if path.suffix == ".json" else json.dumps(records[0]) + "\n")
    row = prepare_dataset(path).rows[0]
    assert (row["data_source"], row["extra_info"]["split"]) == (source, SOURCES[source].default_split)


def test_a_file_name_that_spells_no_source_labels_the_rows_math_and_the_file_name(tmp_path: Path) -> None:
    row = prepare_dataset(_write_jsonl(tmp_path / "bench.jsonl", [{"problem": "Find x.", "answer": "7"}])).rows[0]
    assert (row["data_source"], row["extra_info"]["split"]) == ("math/bench", "train")


def _reading(row: dict) -> tuple:
    """What a row holds of its source record: everything but the label (data_source, split)."""
    return row["prompt"], row["reward_model"], {key: value for key, value in row["extra_info"].items() if key != "split"}


@pytest.mark.parametrize(
    "file_name", ["gsm8k_test.jsonl", "math500.jsonl", "aime2024.jsonl", "amc23.jsonl", "deepscaler_sample.json"]
)
def test_a_public_sets_layout_is_recognised_from_its_content_under_a_neutral_file_name(tmp_path: Path, file_name: str) -> None:
    records = read_records(BENCHMARK_DATA / file_name)[:20]
    prepared = prepare_dataset(_write_jsonl(tmp_path / "train.jsonl", records))
    assert prepared.report.layout == SHARED_FILES[file_name][0]
    assert [_reading(row) for row in prepared.rows] == [
        _reading(row) for row in prepare_dataset(BENCHMARK_DATA / file_name).rows[:20]
    ]


def test_gsm8k_training_file_named_train_gets_the_final_answers_as_ground_truths(tmp_path: Path) -> None:
    """GSM8K's training file circulates as grade_school_math/data/train.jsonl."""
    records = [
        {"question": "Janet has 16 eggs and eats 3. How many are left?", "answer": "16 - 3 = <<16-3=13>>13\n#### 13"},
        {"question": "A shop sells 1,200 pens a day. How many in 2 days?", "answer": "1,200 * 2 = 2,400\n#### 2,400"},
    ]
    rows = prepare_dataset(_write_jsonl(tmp_path / "train.jsonl", records)).rows
    assert [row["reward_model"]["ground_truth"] for row in rows] == ["13", "2400"]
    assert [row["data_source"] for row in rows] == ["math/train"] * 2


def test_a_question_and_a_plain_answer_are_read_as_they_are_whatever_the_file_name(tmp_path: Path) -> None:
    """Answers without GSM8K's '#### N' are no GSM8K layout, even in a file named after GSM8K."""
    rows = prepare_dataset(_write_jsonl(tmp_path / "gsm8k_train.jsonl", [{"question": "1+1?", "answer": "2"}])).rows
    assert rows[0]["reward_model"]["ground_truth"] == "2" and rows[0]["data_source"] == "gsm8k"


def _plain_rows(tmp_path: Path, answers: list[str], field: str = "answer") -> Path:
    return _write_jsonl(
        tmp_path / "rows.jsonl", [{"problem": f"Problem {i}.", field: answer} for i, answer in enumerate(answers)]
    )


@pytest.mark.slow
def test_ground_truths_their_reward_cannot_verify_are_named_by_line_and_written(tmp_path: Path) -> None:
    """DeepScaleR's sample holds such rows (``245 yd.``, ``33\\frac {1}{3}\\%``): every answer to them scores 0."""
    answers = [str(number) for number in range(1, 21)]
    answers[6] = "245 yd."
    prepared = prepare_dataset(_plain_rows(tmp_path, answers), unverifiable=unverifiable_ground_truths)
    assert prepared.report.unverifiable == [7] and len(prepared.rows) == 20
    assert "the ground truth of 1 row (line 7) is no answer its reward can verify" in prepared.report.summary()


@pytest.mark.slow
def test_a_file_of_mostly_unverifiable_ground_truths_is_refused_naming_each_row_and_the_flag(tmp_path: Path) -> None:
    """Worked solutions read as the answers (the 'solution' field) are the usual cause."""
    records = read_records(BENCHMARK_DATA / "gsm8k_test.jsonl")[:20]
    path = _write_jsonl(
        tmp_path / "rows.jsonl", [{"problem": record["question"], "solution": record["answer"]} for record in records]
    )
    with pytest.raises(
        ValueError, match=r"rows\.jsonl: the ground truth of \d+ of 20 rows .*--answer-field.*--allow-unverifiable"
    ) as error:
        prepare_dataset(path, unverifiable=unverifiable_ground_truths)
    assert "\n    line 1: ground truth str 'Janet sells" in str(error.value)


@pytest.mark.slow
def test_unverifiable_ground_truths_up_to_the_limit_are_written_and_past_it_refused(tmp_path: Path) -> None:
    allowed = round(UNVERIFIABLE_LIMIT * 40)
    answers = ["245 yd."] * allowed + ["12"] * (40 - allowed)
    assert len(prepare_dataset(_plain_rows(tmp_path, answers), unverifiable=unverifiable_ground_truths).rows) == 40
    with pytest.raises(ValueError, match=f"{allowed + 1} of 40 rows"):
        prepare_dataset(_plain_rows(tmp_path, ["245 yd."] + answers[:-1]), unverifiable=unverifiable_ground_truths)


@pytest.mark.slow
def test_allow_unverifiable_writes_a_file_of_unverifiable_ground_truths(tmp_path: Path) -> None:
    path = _plain_rows(tmp_path, ["245 yd.", "\\sqrt{"])
    prepared = prepare_dataset(path, unverifiable=unverifiable_ground_truths, allow_unverifiable=True)
    assert prepared.report.unverifiable == [1, 2] and len(prepared.rows) == 2


def test_a_json_list_on_one_line_numbers_its_rows_by_position(tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([{"problem": "Find x.", "answer": "1"}, {"problem": "Find y."}]))
    with pytest.raises(ValueError, match=r"position in the list of rows.*\n    row 2: field 'answer': missing"):
        prepare_dataset(path)


def test_explicit_source_is_used_whatever_the_file_name(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "bench.jsonl", [{"problem": "Find x.", "answer": "7"}])
    assert prepare_dataset(path, source="aime2025").rows[0]["data_source"] == "aime2025"


def test_unknown_source_is_refused_listing_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"Unknown source 'aime2026'; valid: math500, .*deepscaler"):
        prepare_dataset(BENCHMARK_DATA / "aime2025.jsonl", source="aime2026")


def test_beyondaime_rows_in_its_published_layout_prepare_to_math_rows(tmp_path: Path) -> None:
    """ByteDance-Seed/BeyondAIME publishes a `test` split of records {problem, answer}, the answer an
    integer; these three rows are written in that layout (the data itself is not shipped)."""
    records = [
        {"problem": "Find the number of ordered pairs $(a, b)$ of positive integers with $a + b = 2025$.", "answer": 2024},
        {"problem": "Let $N = \\frac{10^{6}}{8}$. Find $N$.", "answer": 125000},
        {"problem": "What is $3^{3}$?", "answer": "27"},
    ]
    path = tmp_path / "BeyondAIME.parquet"
    pq.write_table(pa.Table.from_pylist(records[:2]), path)
    prepared = prepare_dataset(path)
    rows = prepared.rows + prepare_dataset(_write_jsonl(tmp_path / "beyond_aime.jsonl", records[2:])).rows
    assert [row["data_source"] for row in rows] == ["beyondaime"] * 3
    assert [row["reward_model"]["ground_truth"] for row in rows] == ["2024", "125000", "27"]
    assert rows[1]["prompt"][0]["content"] == "Let $N = \\frac{10^{6}}{8}$. Find $N$." + PROMPT_SUFFIX
    assert rows[0]["extra_info"]["split"] == "test" and prepared.report.normalised_answers == 2


@pytest.mark.slow
def test_beyondaime_answers_are_scored_by_the_math_verifier() -> None:
    from pacs.rewards import default_compute_score

    assert default_compute_score("beyondaime", "so the answer is \\boxed{125000}", "125000", None) == 1.0
    assert default_compute_score("beyondaime", "so the answer is \\boxed{12500}", "125000", None) == 0.0


def test_repeat_writes_consecutive_copies_that_share_the_source_index() -> None:
    prepared = prepare_dataset(BENCHMARK_DATA / "aime2024.jsonl", repeat=4)
    assert len(prepared.rows) == prepared.report.rows_written == 120
    assert [(row["extra_info"]["index"], row["extra_info"]["repeat"]) for row in prepared.rows[:8]] == [
        (0, 0),
        (0, 1),
        (0, 2),
        (0, 3),
        (1, 0),
        (1, 1),
        (1, 2),
        (1, 3),
    ]
    first, second = prepared.rows[:2]
    assert {**first["extra_info"], "repeat": 1} == second["extra_info"] and first["prompt"] == second["prompt"]


@pytest.mark.parametrize("repeat", [0, -1, 1.5, True])
def test_repeat_below_one_or_not_an_integer_is_refused(repeat: object) -> None:
    with pytest.raises(ValueError, match="repeat must be an integer >= 1"):
        prepare_dataset(BENCHMARK_DATA / "aime2024.jsonl", repeat=repeat)


@pytest.mark.parametrize("file_name", SHARED_FILES)
def test_written_parquet_reads_back_identical_and_checks_clean(tmp_path: Path, file_name: str) -> None:
    rows = prepare_dataset(BENCHMARK_DATA / file_name, repeat=2).rows
    path = tmp_path / "prepared" / "rows.parquet"
    write_parquet(rows, path)
    assert read_records(path) == rows
    assert check_file(path) == len(rows)


def test_write_parquet_refuses_invalid_rows_naming_row_and_field(tmp_path: Path) -> None:
    rows = prepare_dataset(BENCHMARK_DATA / "aime2025.jsonl").rows
    rows[3]["reward_model"]["ground_truth"] = 27.0
    with pytest.raises(
        ValueError,
        match=r"out\.parquet: 1 bad row, numbered by position in the list of rows, the first being 1:\n    row 4: field 'reward_model\.ground_truth': expected a string",
    ):
        write_parquet(rows, tmp_path / "out.parquet")
    assert not (tmp_path / "out.parquet").exists()


def test_write_parquet_keeps_keys_that_the_first_row_lacks_as_nulls(tmp_path: Path) -> None:
    rows = prepare_dataset(BENCHMARK_DATA / "aime2025.jsonl").rows[:2]
    del rows[0]["ability"]
    write_parquet(rows, tmp_path / "rows.parquet")
    assert [row["ability"] for row in read_records(tmp_path / "rows.parquet")] == [None, "math"]


def test_check_file_refuses_a_raw_benchmark_file_naming_row_and_field() -> None:
    with pytest.raises(ValueError, match=r"math500\.jsonl: 500 bad rows.*\n    line 1: field 'data_source': missing") as error:
        check_file(BENCHMARK_DATA / "math500.jsonl")
    assert str(error.value).endswith("    ... and 480 more bad rows")


@pytest.mark.parametrize("suffix", [".parquet", ".json", ".jsonl"])
def test_load_rows_reads_every_prepared_file_type(tmp_path: Path, suffix: str) -> None:
    rows = prepare_dataset(BENCHMARK_DATA / "amc23.jsonl").rows
    path = tmp_path / f"amc23_prepared{suffix}"
    if suffix == ".parquet":
        write_parquet(rows, path)
    elif suffix == ".json":
        path.write_text(json.dumps(rows), encoding="utf-8")
    else:
        _write_jsonl(path, rows)
    assert load_rows(str(path), default_split="val") == rows


def test_json_file_may_hold_one_object_per_line(tmp_path: Path) -> None:
    records = [{"problem": "Find x.", "answer": "1"}, {"problem": "Find y.", "answer": "2"}]
    path = _write_jsonl(tmp_path / "aime25.json", records)
    assert read_records(path) == records


def test_invalid_json_list_is_refused_naming_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "deepscaler.json"
    path.write_text('[{"problem": "Find x.", "answer": "1"},\n {"problem": oops}]', encoding="utf-8")
    with pytest.raises(
        ValueError, match=r"deepscaler\.json: 1 bad row.*\n    line 2: invalid JSON \(Expecting value, column 14\)"
    ):
        read_records(path)


def test_unsupported_file_type_is_refused_listing_the_accepted_ones(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"rows\.csv: unsupported file type '\.csv'; expected one of \['\.json', '\.jsonl', '\.parquet'\]"
    ):
        read_records(tmp_path / "rows.csv")


def test_unreadable_parquet_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "math500.parquet"
    path.write_text("not parquet", encoding="utf-8")
    with pytest.raises(ValueError, match=r"math500\.parquet: not a readable parquet file"):
        read_records(path)


def test_every_source_is_registered() -> None:
    assert list(SOURCES) == ["math500", "aime2024", "aime2025", "amc23", "gsm8k", "deepscaler", "beyondaime"]


@pytest.mark.slow
def test_pacs_prepare_refuses_unverifiable_ground_truths_leaving_no_file_and_writes_them_with_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = _plain_rows(tmp_path, ["245 yd.", "\\sqrt{"])
    out = tmp_path / "rows.parquet"
    assert run(["prepare", "--input", str(path), "--out", str(out)]) == 2
    assert "--allow-unverifiable writes the rows" in capsys.readouterr().err and not out.exists()
    assert run(["prepare", "--input", str(path), "--out", str(out), "--allow-unverifiable"]) == 0
    assert "warning: the ground truth of 2 rows (lines 1, 2)" in capsys.readouterr().out and len(read_rows(out)) == 2


def test_a_file_that_is_not_utf8_is_refused_naming_the_line_and_column_of_the_first_bad_byte(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"problem": "a", "answer": "1"}\n{"problem": "caf\xe9", "answer": "1"}\n')
    with pytest.raises(ValueError, match=r"rows\.jsonl: line 2, column 17: not UTF-8 text \(byte 0xe9"):
        prepare_dataset(path)


def test_a_csv_header_with_neither_field_names_both_missing_fields(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("q,final\n1+1?,2\n")
    with pytest.raises(
        ValueError,
        match=r"no problem field recognised .*--prompt-field FIELD; and .*no answer field recognised .*--answer-field FIELD",
    ):
        prepare_dataset(path)
