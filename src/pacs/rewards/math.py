"""Math answers judged by math-verify, as in the PACS paper, under a hard wall-clock limit.

``math_score(solution_str, ground_truth)`` is 1.0 when the model's answer equals the ground truth:

1. Fast path, string work only. When math-verify would read the model's sole ``\\boxed{...}``
   (exactly one ``\\boxed`` and no ``\\fbox`` in the text, and no "final answer ... is" phrase,
   which math-verify ranks at or above boxed answers), its content is compared with the ground
   truth after ``normalize_answer``; equal texts score 1.0 without any symbolic work.
2. Symbolic path: ``verify(parse("\\boxed{" + ground_truth + "}"), parse(solution_str))`` with the
   extraction the paper used (``GOLD_EXTRACTION``, ``ANSWER_EXTRACTION``). math-verify's own
   ``signal.alarm`` timeouts are disabled (they fail off the main thread, are per operation rather
   than per call, and swallow the timeout into a False); instead the step runs in a worker process
   (``pacs.rewards.workers``) killed at ``timeout_s``. Inside such a worker (a ``ScoringPool``'s)
   the step runs directly: the caller that owns the worker already enforces its limit.
3. Any exception inside math-verify scores 0.0; so does a step stopped at the limit.

Timeouts are counted where the limit is enforced. Under a ``ScoringPool`` (training), the pool
kills the worker and reports it in ``BatchScores.timed_out``. A direct call of ``math_score``
uses this module's own single worker and adds to ``math_score_timeouts()``.

math-verify and latex2sympy log whole inputs (sometimes megabytes) when they fail; importing this
module sets their loggers to ERROR.
"""

from __future__ import annotations

import logging
import os
import re
import threading

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from pacs.rewards.arithmetic import extract_boxed
from pacs.rewards.workers import TimeLimitedWorkers, check_timeout_s, inside_time_limited_worker

MATH_DATA_SOURCES = ("math500", "aime2024", "aime2025", "amc23", "gsm8k", "deepscaler", "beyondaime", "math")
GOLD_EXTRACTION = (LatexExtractionConfig(),)
ANSWER_EXTRACTION = (ExprExtractionConfig(), LatexExtractionConfig())
SYMBOLIC_STEP_SPEC = "pacs.rewards.math:symbolic_verify"

FINAL_ANSWER_PHRASE = re.compile(r"final answer.{0,100}?\s+is", re.IGNORECASE | re.DOTALL)
INTEGER_LITERAL = re.compile(r"^([+-]?)([0-9]+)(?:\.0+)?$")
IGNORED_MARKUP = re.compile(r"(?<!\\)\$|\\!|\\left(?![A-Za-z])|\\right(?![A-Za-z])|\^\\circ|\^\{\\circ\}")

for _logger_name in ("math_verify", "latex2sympy2_extended"):
    logging.getLogger(_logger_name).setLevel(logging.ERROR)

_symbolic_worker: TimeLimitedWorkers | None = None
_symbolic_worker_lock = threading.Lock()
_timeouts = 0


def _forget_symbolic_worker() -> None:
    """In a forked child, drop the parent's worker and lock: they belong to the parent."""
    global _symbolic_worker, _symbolic_worker_lock, _timeouts
    _symbolic_worker, _symbolic_worker_lock, _timeouts = None, threading.Lock(), 0


os.register_at_fork(after_in_child=_forget_symbolic_worker)


def normalize_answer(answer: str) -> str:
    """Canonical text of an answer for the fast path; no parsing or evaluation.

    Strips surrounding whitespace and removes unescaped ``$``, ``\\!``, ``\\left``/``\\right`` and
    ``^\\circ``/``^{\\circ}``. An integer literal, optionally with a ``.0...`` tail, becomes its
    plain value: ``"025"``, ``"+25"`` and ``"25.0"`` all give ``"25"``. Deliberately not touched,
    because math-verify 0.9.0 reads them otherwise and the fast path must never disagree with it:
    inner spaces (``1 2`` parses as 3), ``\\,`` (``1\\,000`` is not 1000) and a trailing ``.``
    (``25.`` does not parse).
    """
    text = IGNORED_MARKUP.sub("", answer).strip()
    integer = INTEGER_LITERAL.match(text)
    if integer is None:
        return text
    sign, digits = integer.groups()
    value = digits.lstrip("0") or "0"
    return value if sign == "+" or value == "0" else sign + value


def _sole_boxed_answer(solution_str: str) -> str | None:
    """The content of the only ``\\boxed{...}`` when math-verify would read exactly that, else None."""
    if solution_str.count("\\boxed") != 1 or "\\fbox" in solution_str:
        return None
    if FINAL_ANSWER_PHRASE.search(solution_str):
        return None
    return extract_boxed(solution_str)


def _gold_answer(ground_truth: str) -> list:
    """math-verify's reading of a ground truth, as the reward reads it: boxed, gold extraction."""
    return parse("\\boxed{" + ground_truth + "}", GOLD_EXTRACTION, parsing_timeout=None)


def reads_as_math(ground_truth: str) -> bool:
    """Whether math-verify reads ``ground_truth``, as ``math_score`` reads a gold answer, as a
    mathematical answer (a number, an expression, a set, ...) rather than as its text alone.

    A ground truth read only as text (a GSM8K worked solution, ``245 yd.``, unbalanced LaTeX such
    as ``\\sqrt{``) is matched by no answer but that very text: its row scores 0 whatever the
    model answers. False on any exception inside math-verify. No time limit: call it in a
    time-limited worker (``pacs.rewards.checks.unverifiable_ground_truths``).
    """
    try:
        return any(not isinstance(reading, str) for reading in _gold_answer(ground_truth))
    except Exception:
        return False


def symbolic_verify(solution_str: str, ground_truth: str) -> bool:
    """math-verify's judgement, without its signal-based timeouts; False on any exception."""
    try:
        gold = _gold_answer(ground_truth)
        answer = parse(solution_str, ANSWER_EXTRACTION, parsing_timeout=None)
        return verify(gold, answer, timeout_seconds=None)
    except Exception:
        return False


def _verifies_within(solution_str: str, ground_truth: str, timeout_s: float | None) -> bool:
    """The symbolic step, in this module's worker process killed after ``timeout_s`` seconds.

    Runs directly when ``timeout_s`` is None or when already inside a time-limited worker.
    """
    global _symbolic_worker, _timeouts
    if timeout_s is None or inside_time_limited_worker():
        return symbolic_verify(solution_str, ground_truth)
    with _symbolic_worker_lock:
        if _symbolic_worker is None:
            _symbolic_worker = TimeLimitedWorkers(SYMBOLIC_STEP_SPEC, num_workers=1)
        outcome = _symbolic_worker.run([(solution_str, ground_truth)], timeout_s=timeout_s)
        _timeouts += outcome.timed_out + outcome.crashed
    return outcome.results[0] is True  # NO_RESULT when stopped at the limit


def math_score(solution_str: str, ground_truth: str, *, timeout_s: float | None = 1.0) -> float:
    """Return 1.0 if the model's final answer equals ``ground_truth`` (LaTeX), else 0.0.

    ``timeout_s`` bounds the symbolic step in wall-clock seconds, from any thread; a step stopped
    there scores 0.0 and is counted in ``math_score_timeouts()``. ``None`` runs it in this process
    without a limit. Inside a ``ScoringPool`` worker the step always runs directly, under the
    pool's limit. Concurrent callers share one worker and take turns.
    """
    if not isinstance(ground_truth, str):
        raise ValueError(f"Math ground truth must be a string, got {type(ground_truth).__name__} {ground_truth!r}")
    if timeout_s is not None:
        check_timeout_s(timeout_s)
    boxed_answer = _sole_boxed_answer(solution_str)
    if boxed_answer is not None:
        normalized_answer = normalize_answer(boxed_answer)
        if normalized_answer and normalized_answer == normalize_answer(ground_truth):
            return 1.0
    return 1.0 if _verifies_within(solution_str, ground_truth, timeout_s) else 0.0


def math_score_timeouts() -> int:
    """How many symbolic steps of direct ``math_score`` calls in this process got no answer.

    Each was stopped at its ``timeout_s`` (or lost with a crashed worker) and scored 0.0.
    Calls made inside a ``ScoringPool`` worker are counted by that pool instead.
    """
    return _timeouts


def math_compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """Adapt ``math_score`` (default 1 s limit) to the reward-function signature."""
    return math_score(solution_str, ground_truth)
