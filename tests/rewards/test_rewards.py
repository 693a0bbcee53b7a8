"""Specification of verifiable rewards: boxed-answer scoring, the registry and plug-ins."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pacs.rewards import (
    REWARD_FUNCTIONS,
    arithmetic_score,
    default_compute_score,
    extract_boxed,
    load_reward_function,
    score_responses,
)

PLUGIN_SOURCE = """
def half_credit(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": 0.5, "note": "plug-in"}

NOT_A_FUNCTION = 3
"""


@pytest.fixture
def plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "pacs_test_reward_plugin.py").write_text(PLUGIN_SOURCE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "pacs_test_reward_plugin"
    sys.modules.pop("pacs_test_reward_plugin", None)


def _row(ground_truth: str, index: int = 0, data_source: str = "arithmetic") -> dict:
    return {
        "data_source": data_source,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"index": index},
    }


def test_extract_boxed_returns_the_content() -> None:
    assert extract_boxed("so \\boxed{42}.") == "42"


def test_extract_boxed_keeps_nested_braces() -> None:
    assert extract_boxed("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"


def test_extract_boxed_takes_the_last_of_several() -> None:
    assert extract_boxed("\\boxed{1} then \\boxed{2}") == "2"


def test_extract_boxed_without_box_is_none() -> None:
    assert extract_boxed("the answer is 42") is None


def test_extract_boxed_unterminated_is_none() -> None:
    assert extract_boxed("\\boxed{1} and \\boxed{4{2}") is None


def test_correct_answer_scores_one() -> None:
    assert arithmetic_score("\\boxed{46}", "46") == 1.0


def test_wrong_answer_scores_zero() -> None:
    assert arithmetic_score("\\boxed{45}", "46") == 0.0


def test_negative_answer_is_compared_as_an_integer() -> None:
    assert arithmetic_score("\\boxed{-22}", "-22") == 1.0


def test_explicit_plus_sign_is_accepted() -> None:
    assert arithmetic_score("\\boxed{+5}", "5") == 1.0


def test_surrounding_spaces_in_the_box_are_ignored() -> None:
    assert arithmetic_score("\\boxed{ 7 }", "7") == 1.0


@pytest.mark.parametrize("answer", ["3+4", "7.0", "seven", "", "0x7"])
def test_non_integer_answer_scores_zero(answer: str) -> None:
    assert arithmetic_score(f"\\boxed{{{answer}}}", "7") == 0.0


def test_an_integer_of_more_digits_than_int_reads_is_compared() -> None:
    digits = "9" * 4301
    assert arithmetic_score(f"\\boxed{{{digits}}}", digits) == 1.0
    assert arithmetic_score(f"\\boxed{{{digits}}}", "7") == 0.0
    assert arithmetic_score("\\boxed{-007}", "-7") == 1.0


def test_missing_box_scores_zero() -> None:
    assert arithmetic_score("7", "7") == 0.0


def test_non_integer_ground_truth_is_rejected() -> None:
    with pytest.raises(ValueError, match="'seven'"):
        arithmetic_score("\\boxed{7}", "seven")


def test_default_compute_score_dispatches_on_data_source() -> None:
    assert default_compute_score("arithmetic", "\\boxed{3}", "3") == 1.0


def test_registered_data_source_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REWARD_FUNCTIONS, "constant", lambda *args: 0.25)
    assert default_compute_score("constant", "anything", "x") == 0.25


def test_unknown_data_source_lists_known_ones_and_plugins() -> None:
    with pytest.raises(ValueError, match=r"'geometry'.*'arithmetic'.*module:function"):
        default_compute_score("geometry", "\\boxed{3}", "3")


def test_no_spec_loads_the_default() -> None:
    assert load_reward_function(None) is default_compute_score


def test_plugin_function_is_imported(plugin_module: str) -> None:
    function = load_reward_function(f"{plugin_module}:half_credit")
    assert function("any", "text", "1", None) == {"score": 0.5, "note": "plug-in"}


@pytest.mark.parametrize("spec", ["no_colon", "a:b:c", "mod:", ":func", "mod:func()", "os; import x:y"])
def test_malformed_plugin_spec_is_rejected(spec: str) -> None:
    with pytest.raises(ValueError, match="package.module:function"):
        load_reward_function(spec)


def test_missing_plugin_module_is_named() -> None:
    with pytest.raises(ValueError, match="Cannot import module 'pacs_no_such_module'"):
        load_reward_function("pacs_no_such_module:score")


def test_missing_plugin_attribute_lists_callables(plugin_module: str) -> None:
    with pytest.raises(ValueError, match=r"no attribute 'score'.*\['half_credit'\]"):
        load_reward_function(f"{plugin_module}:score")


def test_non_callable_plugin_attribute_is_rejected(plugin_module: str) -> None:
    with pytest.raises(ValueError, match=r"not callable \(it is a int\)"):
        load_reward_function(f"{plugin_module}:NOT_A_FUNCTION")


def test_score_responses_scores_each_row() -> None:
    rows = [_row("3"), _row("4", index=1)]
    assert score_responses(default_compute_score, rows, ["\\boxed{3}", "\\boxed{5}"]) == [1.0, 0.0]


def test_score_responses_passes_the_verl_arguments() -> None:
    calls = []
    score_responses(lambda *args: calls.append(args) or 1.0, [_row("3", index=7)], ["text"])
    assert calls == [("arithmetic", "text", "3", {"index": 7})]


def test_score_responses_reads_score_from_a_dict(plugin_module: str) -> None:
    function = load_reward_function(f"{plugin_module}:half_credit")
    assert score_responses(function, [_row("1")], ["x"]) == [0.5]


def test_score_responses_accepts_booleans() -> None:
    assert score_responses(lambda *args: True, [_row("1")], ["x"]) == [1.0]


@pytest.mark.parametrize("bad_score", [1.5, -0.1, float("nan")])
def test_score_out_of_range_names_data_source_and_index(bad_score: float) -> None:
    with pytest.raises(ValueError, match=r"data_source 'arithmetic', extra_info index 5.*\[0, 1\]"):
        score_responses(lambda *args: bad_score, [_row("1", index=5)], ["x"])


def test_non_numeric_score_is_rejected() -> None:
    with pytest.raises(ValueError, match="must be a number.*'high'"):
        score_responses(lambda *args: "high", [_row("1")], ["x"])


def test_dict_without_score_is_rejected() -> None:
    with pytest.raises(ValueError, match="no 'score' key"):
        score_responses(lambda *args: {"reward": 1.0}, [_row("1")], ["x"])


def test_rows_and_responses_must_pair_up() -> None:
    with pytest.raises(ValueError, match="2 rows but 1 responses"):
        score_responses(default_compute_score, [_row("1"), _row("2")], ["x"])
