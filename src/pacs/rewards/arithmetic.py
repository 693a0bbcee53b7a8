"""Rule-based reward for integer answers written as ``\\boxed{<integer>}``."""

from __future__ import annotations

import re

BOXED_OPENING = "\\boxed{"
INTEGER_PATTERN = re.compile(r"^([+-]?)([0-9]+)$")


def extract_boxed(text: str) -> str | None:
    """Return the content of the last ``\\boxed{...}`` in ``text`` (nested braces allowed).

    Returns None when there is no ``\\boxed{`` or the last one is never closed.
    """
    start = text.rfind(BOXED_OPENING)
    if start == -1:
        return None
    content_start = start + len(BOXED_OPENING)
    depth = 1
    for position in range(content_start, len(text)):
        if text[position] == "{":
            depth += 1
        elif text[position] == "}":
            depth -= 1
            if depth == 0:
                return text[content_start:position]
    return None


def arithmetic_score(solution_str: str, ground_truth: str) -> float:
    """Return 1.0 if the last boxed answer is an integer literal equal to ``ground_truth``, else 0.0.

    The boxed content is stripped and must match ``[+-]?[0-9]+`` (no expressions are evaluated).
    Literals are compared as text, so any number of digits works (``int()`` refuses over 4300).
    """
    expected = _canonical_integer(ground_truth)
    if expected is None:
        raise ValueError(f"Arithmetic ground truth must be an integer literal, got {ground_truth!r}")
    answer = extract_boxed(solution_str)
    return 1.0 if answer is not None and _canonical_integer(answer) == expected else 0.0


def _canonical_integer(text: str) -> str | None:
    """An integer literal without ``+`` or leading zeros (``"-007"`` -> ``"-7"``, ``"-0"`` -> ``"0"``);
    None when ``text`` (stripped) is not one."""
    literal = INTEGER_PATTERN.match(text.strip())
    if literal is None:
        return None
    sign, digits = literal.groups()
    magnitude = digits.lstrip("0") or "0"
    return "-" + magnitude if sign == "-" and magnitude != "0" else magnitude
