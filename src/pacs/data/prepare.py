"""Convert benchmark files, public or one's own, into rows of the shared schema, and read/write row files.

Any row-shaped file (``.jsonl``, ``.json``, ``.csv`` or ``.parquet``, one record per problem) is
converted. Its problem and answer fields are named (``prompt_field``, ``answer_field``) or
recognised from the first record (``COMMON_PROBLEM_FIELDS``: problem, question, prompt;
``COMMON_ANSWER_FIELDS``: answer, ground_truth, solution; first present wins), and its rows get the
``data_source`` given, else ``math/<file name without suffix>`` (``DEFAULT_DATA_SOURCE``, "math",
and the file's own name: scored by the math verifier, reported apart from other files and never
merged with them as repeats of one problem). A csv file is read as text: every value a string, the
header naming the fields.

A file's layout (how its fields are read) is found from its content, never its name: the first
record's field names and values (``LAYOUTS``, first match wins), else the common fields above;
``source`` (``--source``) reads a file as that set whatever it holds. The named public sources
(``SOURCES``) lay their fields out as follows:

- ``math500``: problem, answer; kept: solution, subject, level, unique_id.
- ``aime2024``: problem | Problem | question, answer | Answer (a string such as ``"025"``, kept as
  is: the verifier compares by value); kept: id, solution | Solution, url.
- ``aime2025``: problem, answer.
- ``amc23``: problem | question, answer (a float such as ``27.0``, written as ``"27"``); kept: id, url.
- ``gsm8k``: question, answer (a worked solution ending in ``#### 1,234``: the ground truth is the
  text after ``####`` without thousands separators, the whole text is kept as ``solution``).
- ``deepscaler``: problem, answer; kept: solution, difficulty. Split ``train`` by default.
- ``beyondaime``: problem, answer (an integer, or its text), as ByteDance-Seed/BeyondAIME publishes
  its 100 problems (split ``test``; the PACS paper's v2 evaluates on it).

The file name only labels the rows: one that spells a source (``SOURCE_FILE_NAMES``, e.g.
``AIME24.jsonl``) gives them that source's ``data_source`` and default split; any other name,
``math/<file name without suffix>`` and split ``train``. So GSM8K's training file, circulating as
``train.jsonl``, is read by its content like ``gsm8k_test.jsonl`` (the ground truth the number after
``####``) and labelled ``math/train``.

Each output row asks the problem as one user message followed by ``PROMPT_SUFFIX``, with
``ability`` "math", ``reward_model = {"style": "rule", "ground_truth": <answer text>}`` and
``extra_info = {"split", "index" (position in the source file), "repeat", <kept fields>}``.
A numeric answer (int, or float such as ``27.0``) is written as plain positional decimal text, the
shortest that reads back as the same float and never in exponent notation, which math-verify would
read otherwise (``1e-07`` as e − 7): ``27.0`` -> ``"27"``, ``0.5`` -> ``"0.5"``, ``1e-07`` ->
``"0.0000001"``, ``1e20`` -> ``"100000000000000000000"``. It is counted in the report as
normalised, as is a gsm8k answer whose commas were removed.

Control characters in problem text. A LaTeX command written with one backslash in a JSON string
decodes as a JSON escape: ``"\\frac"`` becomes a form feed + ``rac``, ``"\\times"`` a tab + ``imes``
(the known defect of aime2025 rows 18, 19 and 27). The converter repairs what it can tell apart:

- a form feed or backspace followed by letters is always a lost ``\\f`` / ``\\b`` command (these
  characters have no use in text): form feed + ``rac`` -> ``\\frac``, backspace + ``eta`` -> ``\\beta``;
- a tab, carriage return or newline followed by letters is a lost ``\\t`` / ``\\r`` / ``\\n``
  command only when the result is a known LaTeX command (``\\times``, ``\\triangle``, ``\\text``,
  ``\\tan``, ``\\right``, ``\\rangle``, ``\\neq``, ``\\nu``, ... see ``TAB_COMMANDS``,
  ``CARRIAGE_RETURN_COMMANDS`` and ``NEWLINE_COMMANDS``): real tabs and newlines also occur as
  whitespace between words (math500 rows 17 and 426, ``"have\\tequal"``). Where the letters after
  the character are themselves a word of prose (``PROSE_WORD_COMMANDS``: tab + ``an`` could be
  ``\\tan`` or a tab before the word "an"), the command is restored only inside math (``$...$``,
  ``$$...$$``, ``\\(...\\)``, ``\\[...\\]``), where those commands live; elsewhere the character
  is whitespace;
- every remaining tab is whitespace and becomes a space;
- any other control character except ``"\\n"`` is refused with a ValueError naming the file, the
  row, the field and the character.

Repaired rows are listed in the report; nothing passes to a model silently. Solutions and other
kept fields are reference text that no prompt contains, and are copied unchanged.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pacs.data.schema import (
    CSV_LINES,
    FILE_LINES,
    FORBIDDEN_CONTROL_CHARACTER,
    LIST_ROWS,
    MAX_REPORTED_ROWS,
    PARQUET_ROWS,
    BadRows,
    Numbering,
    describe_value,
    row_problems,
    validate_rows,
)

PROMPT_SUFFIX = " Please reason step by step, and put your final answer within \\boxed{}."
ABILITY = "math"
RECORD_SUFFIXES = (".json", ".jsonl", ".parquet")
"""File types of prepared rows (what training and evaluation read)."""
INPUT_SUFFIXES = (*RECORD_SUFFIXES, ".csv")
"""File types `prepare_dataset` converts (a csv holds flat records only, never prepared rows)."""
COMMON_PROBLEM_FIELDS = ("problem", "question", "prompt")
COMMON_ANSWER_FIELDS = ("answer", "ground_truth", "solution")
UNVERIFIABLE_LIMIT = 0.05
"""The largest share of a file's rows whose ground truth their reward cannot verify that
`prepare_dataset` writes without ``allow_unverifiable`` (real sets hold a few: DeepScaleR's
``245 yd.``); past it the answers are most likely read from the wrong field."""
DEFAULT_DATA_SOURCE = "math"
"""The kind of data_source of rows converted from a file of no named source (`math/<file name>`):
the math verifier scores them."""

TAB_COMMANDS = frozenset(
    {
        "tan",
        "tanh",
        "tau",
        "tbinom",
        "text",
        "textbf",
        "textit",
        "textnormal",
        "textrm",
        "textsc",
        "textsf",
        "textstyle",
        "texttt",
        "textup",
        "tfrac",
        "therefore",
        "theta",
        "tilde",
        "times",
        "tiny",
        "to",
        "top",
        "triangle",
        "triangledown",
        "triangleleft",
        "trianglelefteq",
        "triangleq",
        "triangleright",
        "trianglerighteq",
        "tt",
    }
)
"""LaTeX commands starting with ``t``: a tab followed by the rest of one of these is repaired."""
NEWLINE_COMMANDS = frozenset(
    {
        "nabla",
        "natural",
        "ne",
        "nearrow",
        "neg",
        "neq",
        "nexists",
        "ngeq",
        "ngtr",
        "ni",
        "nleq",
        "nless",
        "nmid",
        "not",
        "notin",
        "nparallel",
        "nprec",
        "nsim",
        "nsubseteq",
        "nsucc",
        "nsupseteq",
        "ntriangleleft",
        "ntriangleright",
        "nu",
        "nvdash",
        "nwarrow",
    }
)
"""LaTeX commands starting with ``n``: a newline followed by the rest of one of these is repaired."""
PROSE_WORD_COMMANDS = frozenset({"tan", "tau", "to", "top", "tt", "ne", "ni", "nu"})
"""Commands whose letters after the control character are also words of prose ("an", "au", "o",
"op", "t", "e", "i", "u"): repaired only inside math."""
CARRIAGE_RETURN_COMMANDS = frozenset(
    {
        "rangle",
        "rbrace",
        "rbrack",
        "rceil",
        "rfloor",
        "rho",
        "right",
        "rightarrow",
        "rightharpoondown",
        "rightharpoonup",
        "rightleftharpoons",
        "rightrightarrows",
        "rm",
        "rtimes",
        "rvert",
        "rVert",
    }
)
"""LaTeX commands starting with ``r``: a carriage return followed by the rest of one of these is repaired."""
ESCAPE_LETTERS = {"\b": "b", "\f": "f", "\t": "t", "\r": "r", "\n": "n"}
"""Control character -> the letter of the JSON escape that produced it."""
COMMANDS_OF_AMBIGUOUS_ESCAPES = {"\t": TAB_COMMANDS, "\r": CARRIAGE_RETURN_COMMANDS, "\n": NEWLINE_COMMANDS}
BROKEN_ESCAPE = re.compile(r"([\b\f\t\r\n])([A-Za-z]+)")
MATH_DELIMITER = re.compile(r"\\\\|\\\$|\$\$|\$|\\\(|\\\)|\\\[|\\\]")
"""What opens or closes math, and what must not be read as doing so: ``\\\\`` (a line break, as in
``\\\\[2pt]``) and ``\\$`` (a dollar sign)."""
CLOSING_DELIMITERS = {"$": "$", "$$": "$$", "\\(": "\\)", "\\[": "\\]"}

SOURCE_FILE_NAMES = {
    "math500": re.compile(r"math[_-]?500"),
    "aime2024": re.compile(r"aime[_-]?(?:20)?24"),
    "aime2025": re.compile(r"aime[_-]?(?:20)?25"),
    "amc23": re.compile(r"amc"),
    "gsm8k": re.compile(r"gsm8k"),
    "deepscaler": re.compile(r"deepscaler"),
    "beyondaime": re.compile(r"beyond[_-]?aime"),
}
"""Source name -> pattern that recognises it in a (lower-cased) file name."""


def _answer_text(answer: object, location: str) -> tuple[str, bool]:
    """Return ``(ground truth text, normalised)`` for a string, int or finite float answer."""
    if isinstance(answer, str) and answer.strip():
        return answer, False
    if isinstance(answer, int) and not isinstance(answer, bool):
        return str(answer), True
    if isinstance(answer, float) and math.isfinite(answer):
        return _shortest_positional_text(answer), True
    raise ValueError(f"{location}: expected a non-empty string or a finite number, got {describe_value(answer)}")


def _shortest_positional_text(number: float) -> str:
    """The shortest decimal that reads back as ``number``, in positional notation without a
    trailing ``.0``: 27.0 -> "27", 1e23 -> "100000000000000000000000" (not int(1e23)'s
    "99999999999999991611392"), 1e-07 -> "0.0000001", -0.0 -> "0"."""
    text = format(Decimal(repr(number)), "f")
    if "." in text:
        text = text.rstrip("0").removesuffix(".")
    return "0" if text == "-0" else text


def _gsm8k_answer_text(solution: object, location: str) -> tuple[str, bool]:
    """Return ``(ground truth, normalised)`` from a gsm8k solution ending in ``#### 1,234``."""
    if not isinstance(solution, str) or "####" not in solution:
        raise ValueError(f"{location}: expected a worked solution ending in '#### <answer>', got {describe_value(solution)}")
    final_answer = solution.rsplit("####", 1)[1].strip()
    ground_truth = final_answer.replace(",", "")
    if not ground_truth:
        raise ValueError(f"{location}: nothing follows '####'; expected the final answer, e.g. '#### 18'")
    return ground_truth, ground_truth != final_answer


@dataclass(frozen=True)
class ConvertedRecord:
    """One source record in schema terms, before the prompt is built and repeats are made."""

    problem_field: str
    problem: str
    answer_field: str
    ground_truth: str
    answer_normalised: bool
    kept_fields: dict


@dataclass(frozen=True)
class SourceFormat:
    """How one benchmark spells its fields: accepted spellings, answer parsing, default split."""

    problem: tuple[str, ...]
    answer: tuple[str, ...]
    kept: dict[str, tuple[str, ...]]
    """extra_info key -> accepted spellings of a source field copied there when present."""
    answer_text: Callable[[object, str], tuple[str, bool]] = _answer_text
    default_split: str = "test"

    def convert(self, record: dict, location: str) -> ConvertedRecord:
        """Convert one ``record``; errors name ``location`` (file and row) and the accepted spellings."""
        problem_field = _present_spelling(record, self.problem, location)
        problem = record[problem_field]
        if not isinstance(problem, str) or not problem.strip():
            raise ValueError(
                f"{location}: field {problem_field!r}: expected the problem as a non-empty string, got {describe_value(problem)}"
            )
        answer_field = _present_spelling(record, self.answer, location)
        ground_truth, normalised = self.answer_text(record[answer_field], f"{location}: field {answer_field!r}")
        kept_fields = {}
        for key, spellings in self.kept.items():
            present = [spelling for spelling in spellings if record.get(spelling) is not None]
            if present:
                kept_fields[key] = record[present[0]]
        return ConvertedRecord(problem_field, problem, answer_field, ground_truth, normalised, kept_fields)


def _present_spelling(record: dict, spellings: tuple[str, ...], location: str) -> str:
    """Return the first of ``spellings`` that ``record`` has (not null); else raise naming them all."""
    for spelling in spellings:
        if record.get(spelling) is not None:
            return spelling
    raise ValueError(
        f"{location}: field {spellings[0]!r}: missing; accepted spellings: {', '.join(map(repr, spellings))} "
        f"(the record has: {', '.join(map(repr, record)) or 'no fields'}); name the fields with --prompt-field "
        "and --answer-field"
    )


SOURCES: dict[str, SourceFormat] = {
    "math500": SourceFormat(
        problem=("problem",),
        answer=("answer",),
        kept={key: (key,) for key in ("solution", "answer", "subject", "level", "unique_id")},
    ),
    "aime2024": SourceFormat(
        problem=("problem", "Problem", "question"),
        answer=("answer", "Answer"),
        kept={"id": ("id",), "solution": ("solution", "Solution"), "answer": ("answer", "Answer"), "url": ("url",)},
    ),
    "aime2025": SourceFormat(problem=("problem",), answer=("answer",), kept={"answer": ("answer",)}),
    "amc23": SourceFormat(
        problem=("problem", "question"),
        answer=("answer",),
        kept={"id": ("id",), "answer": ("answer",), "url": ("url",)},
    ),
    "gsm8k": SourceFormat(
        problem=("question",),
        answer=("answer",),
        kept={"solution": ("answer",)},
        answer_text=_gsm8k_answer_text,
    ),
    "deepscaler": SourceFormat(
        problem=("problem",),
        answer=("answer",),
        kept={key: (key,) for key in ("solution", "answer", "difficulty")},
        default_split="train",
    ),
    "beyondaime": SourceFormat(problem=("problem",), answer=("answer",), kept={"answer": ("answer",)}),
}
"""Source name (the rows' ``data_source``) -> its converter."""


GSM8K_FINAL_ANSWER = re.compile(r"####[ \t]*[^\s#][^\n]*\s*$")
"""How a GSM8K worked solution ends: ``#### 18`` (the final answer, nothing after it)."""


def _has_all(record: dict, *fields: str) -> bool:
    return all(record.get(name) is not None for name in fields)


def _has_any(record: dict, *fields: str) -> bool:
    return any(record.get(name) is not None for name in fields)


def _is_gsm8k_record(record: dict) -> bool:
    answer = record.get("answer")
    return _has_all(record, "question") and isinstance(answer, str) and GSM8K_FINAL_ANSWER.search(answer) is not None


@dataclass(frozen=True)
class Layout:
    """A public set's way of laying out a record, told from a record's field names and values."""

    source: str
    """The source in `SOURCES` whose format reads it."""
    signs: str
    """What gives it away, for the report."""
    matches: Callable[[dict], bool]


LAYOUTS = (
    Layout("gsm8k", "'question' and an 'answer' that is a worked solution ending in '#### N'", _is_gsm8k_record),
    Layout(
        "math500",
        "'problem', 'answer' and MATH's 'subject', 'level' or 'unique_id'",
        lambda record: _has_all(record, "problem", "answer") and _has_any(record, "subject", "level", "unique_id"),
    ),
    Layout(
        "deepscaler",
        "'problem', 'answer' and DeepScaleR's 'difficulty'",
        lambda record: _has_all(record, "problem", "answer", "difficulty"),
    ),
    Layout(
        "aime2024",
        "'Problem' or 'Answer' capitalised, or 'id', 'problem', 'solution', 'answer' and 'url'",
        lambda record: _has_any(record, "Problem", "Answer") or _has_all(record, "id", "problem", "solution", "answer", "url"),
    ),
    Layout(
        "amc23",
        "'id', 'problem' or 'question', 'answer' and 'url' (no solution)",
        lambda record: _has_all(record, "id", "answer", "url") and _has_any(record, "problem", "question"),
    ),
)
"""The layouts of public sets that differ from the common fields, in the order they are tried:
GSM8K's answer is a worked solution; the others keep reference fields (solution, subject, id, url, ...)
in ``extra_info``. A record of only a problem and an answer (AIME 2025, BeyondAIME, one's own file)
is read by the common fields."""


def recognised_layout(record: dict) -> Layout | None:
    """The first of `LAYOUTS` that `record` (a file's first record) matches, or None."""
    return next((layout for layout in LAYOUTS if layout.matches(record)), None)


def _named_source(path: str | Path) -> str | None:
    """The source name the file name of ``path`` spells (case-insensitive), a label only, or None
    if it spells none; ValueError if it spells several."""
    file_name = Path(path).name.lower()
    matches = [name for name, pattern in SOURCE_FILE_NAMES.items() if pattern.search(file_name)]
    if len(matches) > 1:
        raise ValueError(
            f"Cannot tell the source of {str(path)!r} from its file name (it matches {matches}); "
            f"give it explicitly with --source, one of: {', '.join(SOURCES)}"
        )
    return matches[0] if matches else None


def _recognised_field(read: RecordFile, given: str | None, common: tuple[str, ...], what: str) -> str:
    """The field that holds each record's `what` ("problem", "answer"): `given`, else the first of
    `common` that the first record holds (not null); ValueError naming the file, the record's line
    and the options."""
    if given is not None:
        return given
    first = read.records[0]
    for spelling in common:
        if first.get(spelling) is not None:
            return spelling
    option = "--prompt-field" if what == "problem" else "--answer-field"
    raise ValueError(
        f"{read.path}: {read.location(0)} (the first record): no {what} field recognised (looked for "
        f"{', '.join(map(repr, common))}; the record has: {', '.join(map(repr, first)) or 'no fields'}); "
        f"name it with {option} FIELD"
    )


def _read_text(path: Path) -> str:
    """Return the UTF-8 text of ``path``; errors name the file and the line and column of the
    first byte that is not UTF-8."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise ValueError(
            f"{path}: line {line}, column {column}: not UTF-8 text (byte {data[error.start]:#04x}: {error.reason}); "
            "save the file as UTF-8"
        ) from None


@dataclass
class RecordFile:
    """The records of one file, each with its number, and those that could not be read."""

    path: Path
    numbering: Numbering
    records: list[dict]
    numbers: list[int]
    """Each record's line in the file (where it starts), or its row for a parquet file; from 1."""
    unreadable: list[tuple[int, str]] = field(default_factory=list)
    """(number, "line 4: why") of each record that could not be read."""

    def location(self, position: int) -> str:
        """ "line 5" or "row 5": the record at ``position`` (0-based) by the file's numbering."""
        return f"{self.numbering.unit} {self.numbers[position]}"


def _json_lines(path: Path, text: str) -> RecordFile:
    """One JSON object per non-blank line of ``text``; a line that is not one is unreadable."""
    read = RecordFile(path, FILE_LINES, [], [])
    for line_number, line in enumerate(text.split("\n"), start=1):  # not splitlines(): U+2028 may sit in a string
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            read.unreadable.append((line_number, f"line {line_number}: invalid JSON ({error.msg})"))
            continue
        except RecursionError:
            read.unreadable.append((line_number, f"line {line_number}: JSON nested too deeply to read"))
            continue
        if not isinstance(record, dict):
            read.unreadable.append((line_number, f"line {line_number}: expected a JSON object, got {describe_value(record)}"))
            continue
        read.records.append(record)
        read.numbers.append(line_number)
    return read


def _past_whitespace(text: str, position: int) -> int:
    """The first position from `position` on that is not JSON whitespace."""
    while position < len(text) and text[position] in " \t\n\r":
        position += 1
    return position


def _json_list_lines(text: str) -> list[int]:
    """The line on which each element of the JSON list ``text`` (valid JSON) starts."""
    decoder = json.JSONDecoder()
    position = _past_whitespace(text, _past_whitespace(text, 0) + 1)  # past "["
    lines, line, counted = [], 1, 0
    while text[position] != "]":
        line += text.count("\n", counted, position)
        counted = position
        lines.append(line)
        position = _past_whitespace(text, decoder.raw_decode(text, position)[1])
        if text[position] == ",":
            position = _past_whitespace(text, position + 1)
    return lines


def _json_document(path: Path, text: str) -> RecordFile:
    """Parse a ``.json`` file: a list of objects, one object, or (failing that) one object per line."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        if text.lstrip().startswith("["):
            problem = f"line {error.lineno}: invalid JSON ({error.msg}, column {error.colno})"
            return RecordFile(path, FILE_LINES, [], [], [(error.lineno, problem)])
        return _json_lines(path, text)
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deeply to read") from None
    if isinstance(document, dict):
        return RecordFile(path, FILE_LINES, [document], [text.count("\n", 0, _past_whitespace(text, 0)) + 1])
    if not isinstance(document, list):
        raise ValueError(f"{path}: expected a JSON list of objects or one object per line, got {describe_value(document)}")
    lines = _json_list_lines(text)
    if len(set(lines)) == len(lines):
        read, numbers = RecordFile(path, FILE_LINES, [], []), lines
    else:  # several records on one line (a list written on one line): a line would name no one record
        read, numbers = RecordFile(path, LIST_ROWS, [], []), list(range(1, len(lines) + 1))
    for number, record in zip(numbers, document, strict=True):
        if isinstance(record, dict):
            read.records.append(record)
            read.numbers.append(number)
        else:
            unit = read.numbering.unit
            read.unreadable.append((number, f"{unit} {number}: expected a JSON object, got {describe_value(record)}"))
    return read


def _parquet_rows(path: Path) -> RecordFile:
    """Read every row of a parquet file as a dict; errors name the file (and a column not UTF-8)."""
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as error:
        raise ValueError(f"{path}: not a readable parquet file ({error})") from None
    try:
        records = table.to_pylist()
    except UnicodeDecodeError as error:
        column = next(name for name in table.column_names if not _decodes(table.column(name)))
        raise ValueError(f"{path}: column {column!r} holds text that is not UTF-8 ({error})") from None
    return RecordFile(path, PARQUET_ROWS, records, list(range(1, len(records) + 1)))


def _decodes(column: pa.ChunkedArray) -> bool:
    """Whether every value of ``column`` converts to Python (text columns: valid UTF-8)."""
    try:
        column.to_pylist()
    except UnicodeDecodeError:
        return False
    return True


def _csv_records(path: Path, text: str) -> RecordFile:
    """One record per data line of a csv with a header line (line 1), every value a string,
    numbered by the line it starts on (a quoted value may span lines). A line with more or
    fewer fields than the header is unreadable; text that is not csv stops the reading there."""
    reader = csv.reader(text.splitlines(keepends=True), strict=True)
    read = RecordFile(path, CSV_LINES, [], [])
    header: list[str] | None = None
    try:
        while True:
            start = reader.line_num + 1
            try:
                values = next(reader)
            except StopIteration:
                break
            if not values:
                continue
            if header is None:
                header = values
            elif len(values) != len(header):
                more_or_fewer = "more" if len(values) > len(header) else "fewer"
                read.unreadable.append(
                    (start, f"line {start}: {more_or_fewer} fields than the header's {len(header)} ({', '.join(header)})")
                )
            else:
                read.records.append(dict(zip(header, values, strict=True)))
                read.numbers.append(start)
    except csv.Error as error:
        read.unreadable.append((reader.line_num, f"line {reader.line_num}: not valid csv ({error}); read no further"))
    return read


def read_numbered_records(path: str | Path, *, suffixes: tuple[str, ...] = RECORD_SUFFIXES) -> RecordFile:
    """Read the records of a ``.json`` (a list of objects, or one per line), ``.jsonl``, ``.parquet``
    or, where `suffixes` admits it, ``.csv`` file, each with its number; a record that cannot be
    read is listed in ``unreadable`` and the reading goes on.

    Raises FileNotFoundError if there is no such file, and ValueError naming the file when it
    cannot be read at all or holds no records (``BadRows`` when every record was unreadable).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in suffixes:
        raise ValueError(f"{path}: unsupported file type {suffix or '(none)'!r}; expected one of {list(suffixes)}")
    if not path.is_file():
        raise FileNotFoundError(f"Data file {path} does not exist")
    if suffix == ".parquet":
        read = _parquet_rows(path)
    elif suffix == ".json":
        read = _json_document(path, _read_text(path))
    elif suffix == ".csv":
        read = _csv_records(path, _read_text(path))
    else:
        read = _json_lines(path, _read_text(path))
    if not read.records:
        if read.unreadable:
            raise BadRows(str(path), read.numbering, read.unreadable)
        raise ValueError(f"Data file {path} contains no rows")
    return read


def read_records(path: str | Path, *, suffixes: tuple[str, ...] = RECORD_SUFFIXES) -> list[dict]:
    """The records of a file (``read_numbered_records``); ``BadRows`` lists every one that cannot be read."""
    read = read_numbered_records(path, suffixes=suffixes)
    if read.unreadable:
        raise BadRows(str(read.path), read.numbering, read.unreadable)
    return read.records


def _math_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each stretch of math in ``text``, from an opening ``$``, ``$$``, ``\\(``
    or ``\\[`` to its closing delimiter (or the end of the text, if it never closes)."""
    spans, opened, start = [], None, 0
    for delimiter in MATH_DELIMITER.finditer(text):
        token = delimiter.group()
        if opened is None and token in CLOSING_DELIMITERS:
            opened, start = token, delimiter.end()
        elif opened is not None and token == CLOSING_DELIMITERS[opened]:
            spans.append((start, delimiter.start()))
            opened = None
    return spans if opened is None else [*spans, (start, len(text))]


def _restore_command(broken_escape: re.Match, math_spans: list[tuple[int, int]]) -> str:
    """Return ``\\`` + command for a control character + letters that spell a lost LaTeX command,
    following the rules in the module docstring; else the text unchanged."""
    character, letters = broken_escape.groups()
    command = ESCAPE_LETTERS[character] + letters
    if character in COMMANDS_OF_AMBIGUOUS_ESCAPES and command not in COMMANDS_OF_AMBIGUOUS_ESCAPES[character]:
        return broken_escape.group()
    if command in PROSE_WORD_COMMANDS and not any(start <= broken_escape.start() < end for start, end in math_spans):
        return broken_escape.group()
    return "\\" + command


def _clean_problem_text(text: str, location: str) -> tuple[str, bool, bool]:
    """Return ``(text, escapes repaired, tabs replaced)`` following the rules in the module docstring."""
    math_spans = _math_spans(text)
    repaired = BROKEN_ESCAPE.sub(lambda broken_escape: _restore_command(broken_escape, math_spans), text)
    spaced = repaired.replace("\t", " ")
    control = FORBIDDEN_CONTROL_CHARACTER.search(spaced)
    if control:
        raise ValueError(
            f"{location}: control character {control.group()!r} at position {control.start()} "
            f"(in {spaced[max(0, control.start() - 20) : control.end() + 20]!r}) cannot be repaired; only a "
            "form feed, backspace, tab or carriage return starting a LaTeX command name (e.g. form feed + "
            "'rac' for '\\frac') is repaired, and only '\\n' may stay. Fix the source file"
        )
    return spaced, repaired != text, spaced != repaired


@dataclass
class PrepareReport:
    """What ``prepare_dataset`` read, wrote and changed; ``summary()`` says it in one line."""

    input_path: str
    layout: str
    """The source whose layout was read (`--source`, else recognised from the content), or "" for
    the common fields."""
    data_source: str
    split: str
    repeat: int
    rows_read: int
    rows_written: int
    problem_field: str = ""
    answer_field: str = ""
    """The fields problems and answers were read from (the first row's, for a named source)."""
    numbering: Numbering = FILE_LINES
    """How the input's rows are numbered (its lines; a parquet file's rows)."""
    repaired_control_characters: list[int] = field(default_factory=list)
    """Rows (by ``numbering``) whose problem text had broken LaTeX escapes repaired."""
    tabs_replaced: list[int] = field(default_factory=list)
    """Rows (by ``numbering``) whose problem text had whitespace tabs replaced by spaces."""
    normalised_answers: int = 0
    """Answers rewritten as plain numbers (float 27.0 -> "27", "1,234" -> "1234")."""
    ground_truths_checked: bool = False
    """Whether each ground truth was checked against its reward (`prepare_dataset`'s ``unverifiable``)."""
    unverifiable: list[int] = field(default_factory=list)
    """Rows (by ``numbering``) whose ground truth their reward cannot verify: every answer scores 0."""

    def summary(self) -> str:
        """Return a one-paragraph human-readable account of the preparation."""
        copies = "1 copy" if self.repeat == 1 else f"{self.repeat} consecutive copies"
        read_as = f"rows in the {self.layout} layout" if self.layout else "rows"
        return (
            f"{self.input_path}: {self.rows_read} {read_as} read, {self.rows_written} written "
            f"(problems from field {self.problem_field!r}, answers from {self.answer_field!r}; data_source "
            f"{self.data_source!r}, split {self.split!r}, {copies} of each); broken LaTeX escapes (control "
            f"characters) repaired in {_rows_text(self.repaired_control_characters, self.numbering)}; whitespace tabs "
            f"replaced by spaces in {_rows_text(self.tabs_replaced, self.numbering)}; {self.normalised_answers} answers "
            f"normalised to plain numbers{self._ground_truths_text()}."
        )

    def _ground_truths_text(self) -> str:
        if not self.ground_truths_checked:
            return ""
        if not self.unverifiable:
            return "; every ground truth is an answer its reward can verify"
        return (
            f"; warning: the ground truth of {_rows_text(self.unverifiable, self.numbering)} is no answer its reward can "
            "verify (math-verify reads it as text only): every answer to them scores 0"
        )


def _rows_text(numbers: list[int], numbering: Numbering) -> str:
    """Return e.g. ``"no rows"``, ``"1 row (line 7)"`` or ``"3 rows (lines 19, 20, 28)"``."""
    if not numbers:
        return "no rows"
    plural = "s" if len(numbers) > 1 else ""
    return f"{len(numbers)} row{plural} ({numbering.unit}{plural} {', '.join(map(str, numbers))})"


@dataclass
class PreparedDataset:
    """Rows in the shared schema (each source row ``repeat`` times in a row) and the report."""

    rows: list[dict]
    report: PrepareReport


def _row(
    data_source: str, problem: str, prompt_suffix: str, converted: ConvertedRecord, split: str, index: int, repeat: int
) -> dict:
    """Build one schema row (fresh dicts, so repeats never share mutable state)."""
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": problem + prompt_suffix}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": converted.ground_truth},
        "extra_info": {"split": split, "index": index, "repeat": repeat, **converted.kept_fields},
    }


OWN_FORMAT = SourceFormat(problem=COMMON_PROBLEM_FIELDS, answer=COMMON_ANSWER_FIELDS, kept={}, default_split="train")
"""How a file of no named source is read (its fields fixed by `_recognised_field` first)."""


@dataclass(frozen=True)
class FileReading:
    """How a file is read and labelled: the format its records are read with, the layout that was
    recognised (a source's name, "" for the common fields), and the source that names its rows."""

    source_format: SourceFormat
    layout: str
    labelled_as: str
    """The named source (`--source`, else the one the file name spells) or ""."""


def _file_reading(read: RecordFile, source: str | None, prompt_field: str | None, answer_field: str | None) -> FileReading:
    """`source`'s format (fields given replace its spellings); else, with neither field named,
    the layout the first record shows (`recognised_layout`); else `OWN_FORMAT` with the fields
    given or recognised. The label is `source`, else (no field named) the file name's."""
    if source is not None and source not in SOURCES:
        raise ValueError(f"Unknown source {source!r}; valid: {', '.join(SOURCES)}")
    fields_named = prompt_field is not None or answer_field is not None
    if source is not None:
        source_format = SOURCES[source]
        if prompt_field is not None:
            source_format = replace(source_format, problem=(prompt_field,))
        if answer_field is not None:
            source_format = replace(source_format, answer=(answer_field,))
        return FileReading(source_format, source, source)
    labelled_as = "" if fields_named else _named_source(read.path) or ""
    layout = None if fields_named else recognised_layout(read.records[0])
    if layout is not None:
        return FileReading(SOURCES[layout.source], layout.source, labelled_as)
    fields, unrecognised = [], []
    for given, common, what in ((prompt_field, COMMON_PROBLEM_FIELDS, "problem"), (answer_field, COMMON_ANSWER_FIELDS, "answer")):
        try:
            fields.append(_recognised_field(read, given, common, what))
        except ValueError as error:
            unrecognised.append(str(error))
    if unrecognised:  # both fields named at once when neither is found
        raise ValueError("; and ".join(unrecognised))
    problem, answer = fields
    return FileReading(replace(OWN_FORMAT, problem=(problem,), answer=(answer,)), "", labelled_as)


def _check_text_option(value: object, name: str, example: str, *, non_empty: bool = True) -> None:
    if not isinstance(value, str) or (non_empty and not value.strip()):
        raise ValueError(
            f"{name} must be a {'non-empty ' if non_empty else ''}string such as {example}, got {describe_value(value)}"
        )


def prepare_dataset(
    input_path: str | Path,
    *,
    source: str | None = None,
    repeat: int = 1,
    split: str | None = None,
    prompt_field: str | None = None,
    answer_field: str | None = None,
    data_source: str | None = None,
    prompt_suffix: str = PROMPT_SUFFIX,
    unverifiable: Callable[[list[dict]], list[int]] | None = None,
    allow_unverifiable: bool = False,
) -> PreparedDataset:
    """Convert a file of problems into schema rows, each source row ``repeat`` times consecutively.

    The format (module docstring): ``source``'s, else the layout the first record shows, else
    the fields ``prompt_field`` and ``answer_field`` or the common ones (naming either field reads
    the file by those fields, whatever it holds). ``data_source`` defaults to ``source``, else the
    source the file name spells, else ``math/<file stem>``; ``split`` to that source's default
    ("train" for deepscaler and files whose name spells no source, "test" for the others). Each
    prompt is the problem followed by ``prompt_suffix``. Repeats of a row share
    ``extra_info.index`` and count ``extra_info.repeat`` from 0, so evaluation can merge their samples.

    ``unverifiable`` (`pacs.rewards.checks.unverifiable_ground_truths`, which this layer cannot
    import) gives the positions of the rows whose ground truth their reward cannot verify; they
    are named in the report, and past `UNVERIFIABLE_LIMIT` of the rows refused unless
    ``allow_unverifiable``.
    """
    path = Path(input_path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
        raise ValueError(f"repeat must be an integer >= 1, got {describe_value(repeat)}")
    if data_source is not None:
        _check_text_option(data_source, "data_source", "'math' or 'my_task'")
    _check_text_option(prompt_suffix, "prompt_suffix", repr(PROMPT_SUFFIX), non_empty=False)
    read = read_numbered_records(path, suffixes=INPUT_SUFFIXES)
    records = read.records
    reading = _file_reading(read, source, prompt_field, answer_field)
    source_format = reading.source_format
    if split is None:
        split = SOURCES[reading.labelled_as].default_split if reading.labelled_as else OWN_FORMAT.default_split
    _check_text_option(split, "split", "'test' or 'train'")
    data_source = data_source or reading.labelled_as or f"{DEFAULT_DATA_SOURCE}/{path.stem}"
    report = PrepareReport(str(path), reading.layout, data_source, split, repeat, rows_read=len(records), rows_written=0)
    report.numbering = read.numbering
    rows: list[dict] = []
    problems = list(read.unreadable)
    converted_numbers = []
    for index, record in enumerate(records):
        location, number = read.location(index), read.numbers[index]
        try:
            converted = source_format.convert(record, location)
            problem, escapes_repaired, tabs_replaced = _clean_problem_text(
                converted.problem, f"{location}: field {converted.problem_field!r}"
            )
        except ValueError as error:
            problems.append((number, str(error)))
            continue
        if escapes_repaired:
            report.repaired_control_characters.append(number)
        if tabs_replaced:
            report.tabs_replaced.append(number)
        report.normalised_answers += converted.answer_normalised
        if not report.problem_field:
            report.problem_field, report.answer_field = converted.problem_field, converted.answer_field
        converted_numbers.append(number)
        rows.extend(_row(data_source, problem, prompt_suffix, converted, split, index, copy) for copy in range(repeat))
    problems += row_problems(rows[::repeat], converted_numbers, read.numbering)  # one copy per source row
    if problems:
        raise BadRows(str(path), read.numbering, problems)
    if unverifiable is not None:
        report.ground_truths_checked = True
        report.unverifiable = [converted_numbers[position] for position in unverifiable(rows[::repeat])]
        if len(report.unverifiable) > UNVERIFIABLE_LIMIT * len(converted_numbers) and not allow_unverifiable:
            raise ValueError(_unverifiable_refusal(path, report, rows[::repeat], converted_numbers))
    report.rows_written = len(rows)
    return PreparedDataset(rows, report)


def _unverifiable_refusal(path: Path, report: PrepareReport, rows: list[dict], numbers: list[int]) -> str:
    """The refusal of a file with too many ground truths that cannot be verified, naming each row."""
    ground_truths = dict(zip(numbers, (row["reward_model"]["ground_truth"] for row in rows), strict=True))
    count, total = len(report.unverifiable), len(rows)
    lines = [
        f"{path}: the ground truth of {count} of {total} rows ({count / total:.0%}; at most {UNVERIFIABLE_LIMIT:.0%} "
        f"are written) is no answer its reward can verify: math-verify reads it as text only, so every answer would "
        f"score 0. The answers were read from field {report.answer_field!r}"
        + (f" in the {report.layout} layout" if report.layout else "")
        + "; name the field that holds the final answer with --answer-field, or the set's layout with --source "
        f"({', '.join(SOURCES)}); --allow-unverifiable writes the rows as they are. Numbered by {report.numbering.meaning}:"
    ]
    lines += [
        f"    {report.numbering.unit} {number}: ground truth {describe_value(ground_truths[number])}"
        for number in report.unverifiable[:MAX_REPORTED_ROWS]
    ]
    if count > MAX_REPORTED_ROWS:
        lines.append(f"    ... and {count - MAX_REPORTED_ROWS} more rows")
    return "\n".join(lines)


def write_parquet(rows: list[dict], out_path: str | Path) -> None:
    """Validate ``rows`` and write them to ``out_path`` as parquet; ``read_records`` reads them back.

    A column holds every key that any row has (``pa.Table.from_pylist`` alone would keep only the
    first row's keys); a key that a row lacks reads back as null.
    """
    out_path = Path(out_path)
    if out_path.suffix.lower() != ".parquet":
        raise ValueError(f"{out_path}: rows are written as parquet; give a file name ending in .parquet")
    if not rows:
        raise ValueError(f"{out_path}: no rows to write")
    validate_rows(rows, str(out_path))
    column_names = dict.fromkeys(key for row in rows for key in row)
    try:
        table = pa.Table.from_pydict({name: [row.get(name) for row in rows] for name in column_names})
    except pa.ArrowException as error:
        raise ValueError(f"{out_path}: rows disagree on the type of a field ({error}); write one source per file") from None
    out_path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out_path)


def read_rows(path: str | Path) -> list[dict]:
    """Read a prepared ``.parquet``/``.json``/``.jsonl`` file and check every row against the schema;
    ``BadRows`` lists every record that cannot be read or breaks the schema, by the file's lines
    (rows for parquet)."""
    read = read_numbered_records(path)
    validate_rows(read.records, str(read.path), numbers=read.numbers, numbering=read.numbering, unreadable=read.unreadable)
    return read.records


def check_file(path: str | Path) -> int:
    """Validate a prepared file (see ``read_rows``) and return its number of rows."""
    return len(read_rows(path))
