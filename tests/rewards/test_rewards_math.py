"""Specification of the math verifier: math-verify's judgement, a string fast path, a hard limit."""

from __future__ import annotations

import threading
import time

import pytest
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from pacs.rewards import REWARD_FUNCTIONS, default_compute_score, math_score, math_score_timeouts
from pacs.rewards import math as math_rewards
from pacs.rewards.math import normalize_answer

TIMEOUT_S = 1.0
SLACK_S = 5.0
"""How far past the limit a cut-off call may return: a busy machine delays the return, not the
cut-off. Unbounded, each pathological answer below runs far longer than this (tens of seconds),
so the bound still fails a missing limit."""
UNDER_LOAD_S = 60.0
"""The limit in the tests of what scores 1 and what 0, not of the limit: under the whole suite's
load a call that is fast on an idle machine can pass the default 1 s, and a correct answer would
then score 0."""

PATHOLOGICAL_ANSWERS = {
    "huge factorial": "\\boxed{(10^{10^{10}})!}",
    "power tower": "\\boxed{9^{9^{9^{9}}}}",
    "nested brackets": "\\boxed{" + "(" * 3000 + "1" + ")" * 3000 + "}",
    "unterminated box": "so the answer is \\boxed{1",
    "control characters": "\\boxed{1\x00\x07\x1b\x7f}",
    "lone surrogate": "\\boxed{\ud800}",
}

AGREEMENT_PAIRS = [
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "In polar form: $\\boxed{\\left(3, \\frac{\\pi}{2}\\right)}$."),
    ("p - q", "Summing the series gives \\boxed{p-q}."),
    ("\\frac{14}{3}", "So $x = \\boxed{\\dfrac{14}{3}}$."),
    ("\\frac{14}{3}", "So $x = \\boxed{\\frac{13}{3}}$."),
    ("\\text{Evelyn}", "Evelyn has the greatest average speed: \\boxed{\\text{Evelyn}}"),
    ("6\\sqrt{2}", "**Final Answer**\n\\[\n\\boxed{\\sqrt{72}}\n\\]"),
    ("(-\\sqrt{3}, \\sqrt{3})", "The solution set is $\\boxed{(-\\sqrt{3},\\sqrt{3})}$."),
    ("(a+5)(b+2)", "Factoring, we get \\boxed{ab+2a+5b+10}."),
    ("0.15", "The probability is \\boxed{\\frac{3}{20}}."),
    ("\\dfrac{33}{100}", "\\boxed{0.34}"),
    ("-41", "The minimum is $\\boxed{-41}$."),
    ("27.0", "They meet \\boxed{27} miles from City $A$."),
    ("025", "Thus $m+n = \\boxed{25}$."),
    ("588", "The area is $\\boxed{585}$."),
    ("18", "She makes 9 * 2 = $18 every day at the farmer's market.\n#### 18"),
    ("9", "The answer is \\boxed{9"),
    ("6", "\\boxed{5}, wait, no: \\boxed{6}"),
    ("7", "Hence \\boxed{25}. The final answer is 7"),
    ("1000", "\\boxed{1\\,000}"),
    ("25", "\\boxed{25.}"),
    ("\\pi", "\\boxed{3.14}"),
    ("[-2, 7]", "\\boxed{[-2,7]}"),
]


def math_verify_judgement(ground_truth: str, solution: str) -> float:
    """math-verify with its default settings (signal timeouts) and the paper's extraction targets."""
    gold = parse("\\boxed{" + ground_truth + "}", [LatexExtractionConfig()])
    answer = parse(solution, [ExprExtractionConfig(), LatexExtractionConfig()])
    return 1.0 if verify(gold, answer) else 0.0


@pytest.fixture(scope="module", autouse=True)
def warm_symbolic_worker() -> None:
    """Start the module's worker once, so timings below measure scoring, not process start-up."""
    math_score("\\boxed{0.5}", "\\frac{1}{2}", timeout_s=UNDER_LOAD_S)


@pytest.mark.parametrize(
    ("ground_truth", "solution"),
    [
        pytest.param("\\frac{1}{2}", "\\boxed{0.5}", id="fraction-decimal"),
        pytest.param("025", "\\boxed{25}", id="leading-zeros"),
        pytest.param("27.0", "\\boxed{27}", id="float-integer"),
        pytest.param("(1, 2]", "\\boxed{(1,2]}", id="interval"),
        pytest.param("(1,2)", "\\boxed{(1, 2)}", id="tuple"),
        pytest.param("\\{1,2,3\\}", "\\boxed{\\{3,2,1\\}}", id="set"),
        pytest.param("2\\sqrt{2}", "\\boxed{\\sqrt{8}}", id="radical"),
        pytest.param("30^\\circ", "\\boxed{30}", id="degrees"),
        pytest.param("\\text{(B)}", "\\boxed{B}", id="text-choice"),
        pytest.param("-\\frac{1}{2}", "\\boxed{-0.5}", id="negative"),
        pytest.param("-3", "\\boxed{-3}", id="negative-integer"),
    ],
)
def test_equivalent_answers_score_one(ground_truth: str, solution: str) -> None:
    assert math_score(solution, ground_truth, timeout_s=UNDER_LOAD_S) == 1.0


@pytest.mark.parametrize(
    ("ground_truth", "solution"),
    [
        pytest.param("\\frac{1}{2}", "\\boxed{0.6}", id="fraction-decimal"),
        pytest.param("25", "\\boxed{250}", id="integer"),
        pytest.param("(1,2]", "\\boxed{(1,2)}", id="interval-ends"),
        pytest.param("\\{1,2,3\\}", "\\boxed{\\{1,2\\}}", id="set"),
        pytest.param("2\\sqrt{2}", "\\boxed{\\sqrt{2}}", id="radical"),
        pytest.param("-3", "\\boxed{3}", id="sign"),
        pytest.param("\\text{(B)}", "\\boxed{C}", id="text-choice"),
    ],
)
def test_different_answers_score_zero(ground_truth: str, solution: str) -> None:
    assert math_score(solution, ground_truth, timeout_s=UNDER_LOAD_S) == 0.0


def test_a_final_plain_number_without_a_box_is_read_by_math_verify() -> None:
    assert math_score("Janet makes 9 * 2 = 18 dollars every day.", "18", timeout_s=UNDER_LOAD_S) == 1.0


def test_a_response_without_any_answer_scores_zero() -> None:
    assert math_score("I am not sure how to solve this.", "18", timeout_s=UNDER_LOAD_S) == 0.0


def test_two_boxed_answers_are_read_together_as_math_verify_does() -> None:
    assert math_score("\\boxed{5}, wait, no: \\boxed{6}", "6", timeout_s=UNDER_LOAD_S) == 0.0


def test_a_sole_boxed_answer_equal_to_the_truth_skips_symbolic_work(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_symbolic_work(*args: object) -> bool:
        raise AssertionError("the symbolic step ran")

    monkeypatch.setattr(math_rewards, "_verifies_within", no_symbolic_work)
    assert math_score("Thus $m+n = \\boxed{025}$.", "25.0", timeout_s=UNDER_LOAD_S) == 1.0


@pytest.mark.parametrize(
    ("answer", "normalized"),
    [
        ("025", "25"),
        ("+25", "25"),
        ("27.00", "27"),
        ("-0", "0"),
        (" $\\left(1,2\\right)$ ", "(1,2)"),
        ("30^{\\circ}", "30"),
        ("1\\!000", "1000"),
        ("1\\,000", "1\\,000"),
        ("25.", "25."),
        ("\\leftarrow", "\\leftarrow"),
    ],
)
def test_normalize_answer_removes_only_markup_math_verify_ignores(answer: str, normalized: str) -> None:
    assert normalize_answer(answer) == normalized


@pytest.mark.parametrize(("ground_truth", "solution"), AGREEMENT_PAIRS)
def test_math_score_agrees_with_math_verify(ground_truth: str, solution: str) -> None:
    assert math_score(solution, ground_truth, timeout_s=UNDER_LOAD_S) == math_verify_judgement(ground_truth, solution)


@pytest.mark.parametrize("solution", PATHOLOGICAL_ANSWERS.values(), ids=PATHOLOGICAL_ANSWERS.keys())
def test_pathological_answer_scores_zero_within_the_limit_on_the_main_thread(solution: str) -> None:
    start = time.monotonic()
    score = math_score(solution, "1", timeout_s=TIMEOUT_S)
    assert score == 0.0
    assert time.monotonic() - start < TIMEOUT_S + SLACK_S


@pytest.mark.parametrize("solution", PATHOLOGICAL_ANSWERS.values(), ids=PATHOLOGICAL_ANSWERS.keys())
def test_pathological_answer_scores_zero_within_the_limit_in_a_thread(solution: str) -> None:
    outcome: dict[str, float] = {}

    def score_in_thread() -> None:
        start = time.monotonic()
        outcome["score"] = math_score(solution, "1", timeout_s=TIMEOUT_S)
        outcome["elapsed_s"] = time.monotonic() - start

    thread = threading.Thread(target=score_in_thread)
    thread.start()
    thread.join(timeout=TIMEOUT_S + 10)
    assert not thread.is_alive()
    assert outcome["score"] == 0.0
    assert outcome["elapsed_s"] < TIMEOUT_S + SLACK_S


def test_a_timeout_is_counted() -> None:
    before = math_score_timeouts()
    math_score(PATHOLOGICAL_ANSWERS["huge factorial"], "1", timeout_s=0.2)
    assert math_score_timeouts() == before + 1


def test_scoring_continues_normally_after_a_timeout() -> None:
    math_score(PATHOLOGICAL_ANSWERS["power tower"], "1", timeout_s=0.2)
    assert math_score("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", timeout_s=UNDER_LOAD_S) == 1.0  # a fresh worker


def test_no_limit_runs_the_symbolic_step_in_this_process() -> None:
    assert math_score("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", timeout_s=None) == 1.0


@pytest.mark.parametrize("timeout_s", [0, -1.0, float("nan"), float("inf")])
def test_a_limit_that_is_not_positive_and_finite_is_rejected(timeout_s: float) -> None:
    with pytest.raises(ValueError, match="timeout_s must be a positive, finite number"):
        math_score("\\boxed{1}", "1", timeout_s=timeout_s)


def test_a_ground_truth_that_is_not_a_string_is_rejected() -> None:
    with pytest.raises(ValueError, match="must be a string, got float 27.0"):
        math_score("\\boxed{27}", 27.0)  # a float where the signature asks for a string


@pytest.mark.parametrize("data_source", ["math500", "aime2024", "aime2025", "amc23", "gsm8k", "deepscaler", "math"])
def test_math_data_sources_are_scored_by_the_math_verifier(data_source: str) -> None:
    assert data_source in REWARD_FUNCTIONS
    assert default_compute_score(data_source, "\\boxed{27}", "27.0") == 1.0


@pytest.mark.parametrize(
    "ground_truth", ["18", "025", "\\frac{1}{2}", "(3, \\frac{\\pi}{2})", "\\text{(C)}", "5\\%", "\\{1,2\\}"]
)
def test_a_ground_truth_math_verify_reads_as_an_answer_reads_as_math(ground_truth: str) -> None:
    assert math_rewards.reads_as_math(ground_truth)


@pytest.mark.parametrize(
    "ground_truth",
    [
        "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18",
        "245 yd.",
        "\\sqrt{",
        "",
    ],
)
def test_a_ground_truth_math_verify_reads_as_text_only_does_not_read_as_math(ground_truth: str) -> None:
    """No answer but this very text matches it: `\\boxed{18}` scores 0 against the worked solution."""
    assert not math_rewards.reads_as_math(ground_truth)
