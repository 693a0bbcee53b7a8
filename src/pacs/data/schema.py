"""The row schema shared by RLVR tools (verl's), and its validation.

A row is one prompt with its verifiable answer::

    {
        "data_source": "math500",                       # non-empty string: picks the reward function
        "prompt": [{"role": "user", "content": "..."}], # non-empty list of chat messages
        "ability": "math",                              # optional string
        "reward_model": {"style": "rule", "ground_truth": "27"},  # ground_truth: non-empty string
        "extra_info": {"split": "test", "index": 17, "repeat": 0, ...},  # optional
    }

Optional keys may also be null: a parquet column cannot tell an absent key from a null one.
Message contents must not hold control characters other than ``"\\n"``: in benchmark text they
almost always mean a broken JSON escape upstream (``"\\frac"`` written with a single backslash
decodes to a form feed followed by ``"rac"``), which a model would then see instead of LaTeX.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CHAT_ROLES = ("system", "user", "assistant")
REWARD_STYLE = "rule"
FORBIDDEN_CONTROL_CHARACTER = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")
"""Unicode control characters (category Cc) except the newline ``"\\n"``."""


def describe_value(value: object) -> str:
    """Return ``"<type> <repr>"`` of ``value``, the repr cut to 60 characters."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _check_string(value: object, location: str, field: str, *, non_empty: bool = True) -> str:
    """``value``; raise naming ``location`` and ``field`` unless it is a (non-empty) string."""
    if not isinstance(value, str):
        raise ValueError(f"{location}: field {field!r}: expected a string, got {describe_value(value)}")
    if non_empty and not value.strip():
        raise ValueError(f"{location}: field {field!r}: expected a non-empty string, got {value!r}")
    return value


def _check_optional_int(value: object, location: str, field: str) -> None:
    """Raise naming ``location`` and ``field`` unless ``value`` is null or an integer (not a bool)."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"{location}: field {field!r}: expected an integer, got {describe_value(value)}")


def _check_message(message: object, location: str, field: str) -> None:
    """Raise unless ``message`` is ``{"role": one of CHAT_ROLES, "content": text without control characters}``."""
    if not isinstance(message, dict):
        raise ValueError(
            f"{location}: field {field!r}: expected a chat message {{'role': ..., 'content': ...}}, got {describe_value(message)}"
        )
    role = message.get("role")
    if role not in CHAT_ROLES:
        raise ValueError(f"{location}: field '{field}.role': expected one of {list(CHAT_ROLES)}, got {describe_value(role)}")
    content = _check_string(message.get("content"), location, f"{field}.content", non_empty=False)
    control = FORBIDDEN_CONTROL_CHARACTER.search(content)
    if control:
        raise ValueError(
            f"{location}: field '{field}.content': control character {control.group()!r} at position "
            f"{control.start()} (in {content[max(0, control.start() - 20) : control.end() + 20]!r}); only '\\n' is "
            "allowed. It usually means a broken JSON escape upstream, e.g. '\\frac' read as form feed + 'rac'"
        )


def _check_row(row: object, location: str) -> None:
    """Raise ValueError naming ``location`` and the field at fault unless ``row`` follows the schema."""
    if not isinstance(row, dict):
        raise ValueError(f"{location}: expected a row object (a dict), got {describe_value(row)}")
    for key in ("data_source", "prompt", "reward_model"):
        if key not in row:
            raise ValueError(
                f"{location}: field {key!r}: missing; a row needs data_source, prompt and "
                "reward_model.ground_truth. A file of problems and answers (e.g. {'problem': ..., 'answer': ...} "
                "per line) is converted with `pacs prepare --input FILE --out FILE.parquet`"
            )
    _check_string(row["data_source"], location, "data_source")
    prompt = row["prompt"]
    if not isinstance(prompt, list) or not prompt:
        raise ValueError(
            f"{location}: field 'prompt': expected a non-empty list of chat messages "
            f"[{{'role': 'user', 'content': ...}}], got {describe_value(prompt)}"
        )
    for position, message in enumerate(prompt):
        _check_message(message, location, f"prompt[{position}]")
    if row.get("ability") is not None:
        _check_string(row["ability"], location, "ability")
    reward_model = row["reward_model"]
    if not isinstance(reward_model, dict):
        raise ValueError(
            f"{location}: field 'reward_model': expected {{'style': 'rule', 'ground_truth': ...}}, "
            f"got {describe_value(reward_model)}"
        )
    if "ground_truth" not in reward_model:
        raise ValueError(f"{location}: field 'reward_model.ground_truth': missing; expected a non-empty string")
    _check_string(reward_model["ground_truth"], location, "reward_model.ground_truth")
    style = reward_model.get("style")
    if style is not None and style != REWARD_STYLE:
        raise ValueError(f"{location}: field 'reward_model.style': expected {REWARD_STYLE!r}, got {describe_value(style)}")
    extra_info = row.get("extra_info")
    if extra_info is None:
        return
    if not isinstance(extra_info, dict):
        raise ValueError(f"{location}: field 'extra_info': expected a dict, got {describe_value(extra_info)}")
    for key in ("index", "repeat"):
        _check_optional_int(extra_info.get(key), location, f"extra_info.{key}")


MAX_REPORTED_ROWS = 20
"""Bad rows a data error lists one per line; the rest are counted ("... and 7 more bad rows")."""


@dataclass(frozen=True)
class Numbering:
    """How a data error numbers rows: by ``unit`` ("line" or "row"), ``meaning`` said once in its header."""

    unit: str
    meaning: str


FILE_LINES = Numbering("line", "line of the file, the first line being 1")
CSV_LINES = Numbering("line", "line of the file, the header being line 1")
PARQUET_ROWS = Numbering("row", "row of the file, the first row being 1 (a parquet file has no lines)")
LIST_ROWS = Numbering("row", "position in the list of rows, the first being 1")


class BadRows(ValueError):
    """Every bad row of one data file (``problems``: (number, "line 5: why") pairs, any order),
    in one message: a header naming the file, the count and the numbering, then one row per
    line by number, at most ``MAX_REPORTED_ROWS`` of them::

        rows.jsonl: 2 bad rows, numbered by line of the file, the first line being 1:
            line 5: invalid JSON (Expecting value)
            line 6: field 'prompt': expected a non-empty list of chat messages ..., got str 'hi'
    """

    def __init__(self, source: str, numbering: Numbering, problems: list[tuple[int, str]]) -> None:
        self.source, self.numbering = source, numbering
        self.problems = sorted(problems, key=lambda problem: problem[0])
        count = len(self.problems)
        lines = [f"{source}: {count} bad row{'s' * (count > 1)}, numbered by {numbering.meaning}:"]
        lines += [f"    {text}" for _, text in self.problems[:MAX_REPORTED_ROWS]]
        if count > MAX_REPORTED_ROWS:
            lines.append(f"    ... and {count - MAX_REPORTED_ROWS} more bad rows")
        super().__init__("\n".join(lines))


def row_problems(rows: list, numbers: list[int], numbering: Numbering) -> list[tuple[int, str]]:
    """(number, "line 5: why") for each of ``rows`` (numbered ``numbers``) that breaks the schema
    (its first problem)."""
    problems = []
    for number, row in zip(numbers, rows, strict=True):
        try:
            _check_row(row, f"{numbering.unit} {number}")
        except ValueError as error:
            problems.append((number, str(error)))
    return problems


def validate_rows(
    rows: list,
    source: str,
    *,
    numbers: list[int] | None = None,
    numbering: Numbering = LIST_ROWS,
    unreadable: list[tuple[int, str]] | None = None,
) -> None:
    """Check every row of ``rows`` (read from ``source``, a file name) against the row schema.

    ``numbers`` are the rows' numbers in ``numbering`` (default: 1, 2, ... by position);
    ``unreadable`` the problems of records that could not even be read (bad JSON, a csv line
    with too many fields), reported with the others. Raises ``BadRows`` listing every bad row,
    e.g. ``math500.parquet: 1 bad row, numbered by row of the file, the first row being 1 (a
    parquet file has no lines):`` then ``    row 18: field 'reward_model.ground_truth':
    expected a string, got float 27.0``.
    """
    numbers = list(range(1, len(rows) + 1)) if numbers is None else numbers
    problems = [*(unreadable or []), *row_problems(rows, numbers, numbering)]
    if problems:
        raise BadRows(source, numbering, problems)
