"""Load training/evaluation rows from a data spec, and render a row's prompt for a tokenizer.

A data spec is one of:
- a built-in task, optionally with query parameters, e.g.
  ``builtin:arithmetic?digits=3&size=500&operations=+-&split=val&seed=1``
  (``+`` in a value means plus, not space), or ``builtin:multiplication?digits=4&size=500``;
- a prepared ``.parquet``, ``.json`` or ``.jsonl`` file of rows in the row schema (see
  ``pacs.data.schema``; ``pacs prepare``, ``pacs.data.prepare``, converts any file of problems
  and answers into it). Every row is validated on load.
"""

from __future__ import annotations

import functools
import json
import typing
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from pacs.data.arithmetic import SPLITS, generate_multiplications, generate_problems
from pacs.data.prepare import INPUT_SUFFIXES, RECORD_SUFFIXES, read_numbered_records, read_rows

DEFAULT_SIZES = {"train": 2000, "val": 200}
"""Rows per split when the spec gives no size (or all there are, if fewer)."""
ARITHMETIC_PARAMETERS = ("digits", "max_operand", "size", "operations", "split", "seed")
MULTIPLICATION_PARAMETERS = ("digits", "size", "split", "seed")


def _positive_int(spec: str, name: str, value: str) -> int:
    """Parse query parameter ``name`` of ``spec`` as an integer >= 1."""
    if not (value.isascii() and value.isdigit()) or int(value) < 1:
        raise ValueError(f"Parameter {name}={value!r} in {spec!r} must be an integer >= 1")
    return int(value)


def _split_and_seed(spec: str, parameters: dict[str, str], default_split: str, valid: tuple[str, ...]) -> tuple[str, int]:
    """The split and seed of a built-in task's query ``parameters``, after refusing a parameter
    not in ``valid``."""
    unknown = sorted(set(parameters) - set(valid))
    if unknown:
        raise ValueError(f"Unknown parameter(s) {unknown} in {spec!r}; valid: {list(valid)}")
    split = parameters.get("split", default_split)
    if split not in SPLITS:
        raise ValueError(f"Parameter split={split!r} in {spec!r} must be one of {list(SPLITS)}")
    seed_text = parameters.get("seed", "0")
    try:
        return split, int(seed_text)
    except ValueError:
        raise ValueError(f"Parameter seed={seed_text!r} in {spec!r} must be an integer") from None


def _load_arithmetic(spec: str, parameters: dict[str, str], default_split: str) -> list[dict]:
    """Generate ``builtin:arithmetic`` rows from the query ``parameters`` of ``spec``."""
    split, seed = _split_and_seed(spec, parameters, default_split, ARITHMETIC_PARAMETERS)
    if "digits" in parameters and "max_operand" in parameters:
        raise ValueError(f"{spec!r} sets both digits and max_operand; give one of them")
    return generate_problems(
        split,
        _positive_int(spec, "size", parameters.get("size", str(DEFAULT_SIZES[split]))),
        digits=_positive_int(spec, "digits", parameters.get("digits", "2")),
        max_operand=_positive_int(spec, "max_operand", parameters["max_operand"]) if "max_operand" in parameters else None,
        operations=parameters.get("operations", "+-*"),
        seed=seed,
        allow_fewer="size" not in parameters,
    )


def _load_multiplication(spec: str, parameters: dict[str, str], default_split: str) -> list[dict]:
    """Generate ``builtin:multiplication`` rows (4-digit operands unless ``digits`` says) from the
    query ``parameters`` of ``spec``."""
    split, seed = _split_and_seed(spec, parameters, default_split, MULTIPLICATION_PARAMETERS)
    digits = _positive_int(spec, "digits", parameters.get("digits", "4"))
    if digits < 2:
        raise ValueError(f"Parameter digits={digits} in {spec!r} must be an integer >= 2 (one digit: builtin:arithmetic)")
    size = _positive_int(spec, "size", parameters.get("size", str(DEFAULT_SIZES[split])))
    return generate_multiplications(split, size, digits=digits, seed=seed)


BUILTIN_DATASETS: dict[str, Callable[[str, dict[str, str], str], list[dict]]] = {
    "builtin:arithmetic": _load_arithmetic,
    "builtin:multiplication": _load_multiplication,
}


def _parse_query(spec: str, query: str) -> dict[str, str]:
    """Parse ``key=value&...`` into a dict, keeping ``+`` literal; reject repeats and malformed pairs."""
    try:
        pairs = urllib.parse.parse_qsl(query.replace("+", "%2B"), keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise ValueError(f"Malformed parameters {query!r} in {spec!r}; expected key=value&key=value") from None
    parameters: dict[str, str] = {}
    for key, value in pairs:
        if key in parameters:
            raise ValueError(f"Parameter {key!r} is given more than once in {spec!r}")
        parameters[key] = value
    return parameters


def load_rows(spec: str, *, default_split: str) -> list[dict]:
    """Load the rows named by ``spec``; ``default_split`` ("train"/"val") applies to built-in tasks."""
    if spec.startswith("builtin:"):
        name, _, query = spec.partition("?")
        if name not in BUILTIN_DATASETS:
            raise ValueError(f"Unknown built-in dataset {name!r}; valid: {sorted(BUILTIN_DATASETS)}")
        return BUILTIN_DATASETS[name](spec, _parse_query(spec, query) if query else {}, default_split)
    if Path(spec).suffix.lower() in RECORD_SUFFIXES:
        return read_rows(Path(spec).expanduser())
    convert = (
        f"; convert a csv file with `pacs prepare --input {spec} --out FILE.parquet`"
        if Path(spec).suffix.lower() in INPUT_SUFFIXES
        else ""
    )
    raise ValueError(
        f"Unsupported data spec {spec!r}; accepted: a built-in dataset "
        f"({', '.join(sorted(BUILTIN_DATASETS))}, optionally with ?key=value parameters) "
        f"or a path to a prepared file of rows ({', '.join(RECORD_SUFFIXES)}){convert}"
    )


def row_location(spec: str, position: int) -> str:
    """Where the row at `position` (0-based) of ``load_rows(spec)`` lies, numbered as the data
    checks number rows (`pacs.data.prepare.RecordFile`), from 1: "FILE: line 5" in a json, jsonl
    or csv file, "FILE: row 5" in a parquet file, "SPEC: row 5" in a built-in task."""
    if spec.startswith("builtin:"):
        return f"{spec}: row {position + 1}"
    unit, numbers = _numbering(spec)
    return f"{spec}: {unit} {numbers[position]}"


@functools.lru_cache(maxsize=8)
def _numbering(spec: str) -> tuple[str, tuple[int, ...]]:
    """The unit ("line" or "row") and each record's number in the file of `spec` (read once)."""
    read = read_numbered_records(Path(spec).expanduser())
    return read.numbering.unit, tuple(read.numbers)


def render_prompt(tokenizer: PreTrainedTokenizerBase, row: dict) -> str:
    """Render ``row["prompt"]`` with the tokenizer's chat template, ending in the assistant turn.

    Encode the result with ``add_special_tokens=False``: the template already adds every
    special token the model expects.
    """
    text = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
    return typing.cast(str, text)  # tokenize=False: the rendered text


def rendering_comment(tokenizer: PreTrainedTokenizerBase, row: dict, model_path: str) -> str:
    """YAML comment lines that say how the chat template of `model_path`'s tokenizer renders
    prompts (`render_prompt`): the text it writes before a prompt's first message (where a
    template that has a default system prompt, as SmolLM2's and Qwen2.5's do, adds it to a prompt
    without a system message) and `row`'s prompt as the model reads it."""
    text = render_prompt(tokenizer, row)
    first = row["prompt"][0]
    before_first = text[: text.find(first["content"])] if first["content"] in text else ""
    return (
        f"# prompts are rendered by the chat template of {model_path}'s tokenizer, as written there\n"
        f"# before the content of a prompt's first message ({first['role']}) it writes: {json.dumps(before_first)}\n"
        f"# the first training prompt, as the model reads it: {json.dumps(text)}\n"
    )
