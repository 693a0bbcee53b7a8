"""What a command checks about scoring before it loads a model (`check_scoring`).

- Without a reward function of the user's, every row's `data_source` must have one in
  `REWARD_FUNCTIONS` (itself, or its kind: `reward_function_for`); the first row of each that has
  none is named.
- With one (`"package.module:function"`), it must take the verl signature
  `(data_source, solution_str, ground_truth, extra_info)`, and, called in a worker process on the
  first row of each data source with that row's own answer as the response (`probe_response`), it
  must return a score in [0, 1] within `probe_limit_s`. A function that raises, returns
  something else, never answers or kills its process is refused, naming it and the row: a
  training run would otherwise find out after the model loaded, or score every answer 0.

`unverifiable_ground_truths` finds the rows whose ground truth their reward can never match
(`pacs prepare` reports them, and refuses a file of mostly such rows).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from pacs.rewards.math import math_compute_score
from pacs.rewards.pool import ScoringPool
from pacs.rewards.registry import REWARD_FUNCTIONS, load_reward_function, reward_function_for
from pacs.rewards.workers import TimeLimitedWorkers

PROBE_LIMIT_S = 10.0
"""The least time a reward function gets to score the probe answer: its worker's first call
may pay for imports that later calls do not."""
SIGNATURE = ("data_source", "solution_str", "ground_truth", "extra_info")
GROUND_TRUTH_READING_LIMIT_S = 5.0
"""How long math-verify may take to read one ground truth (`unverifiable_ground_truths`); one it
has not read by then is counted as unverifiable."""


def probe_response(row: dict) -> str:
    """The answer a reward function is first called with: the row's ground truth, boxed."""
    return "\\boxed{" + row["reward_model"]["ground_truth"] + "}"


RowLocation = Callable[[str, int], str]
"""Where the row at a 0-based position of a data spec lies, e.g. "data/train.jsonl: line 5"
(`pacs.data.loading.row_location`)."""


def row_number(spec: str, position: int) -> str:
    """The location of rows that come with none: their position from 1, "SPEC: row 5"."""
    return f"{spec}: row {position + 1}"


def first_row_of_each_source(rows_by_spec: dict[str, list[dict]], where: RowLocation = row_number) -> dict[str, tuple[str, dict]]:
    """data_source -> (where its first row is, by `where`, e.g. "data/train.jsonl: line 5", the row)."""
    first: dict[str, tuple[str, dict]] = {}
    for spec, rows in rows_by_spec.items():
        for position, row in enumerate(rows):
            if row["data_source"] not in first:
                first[row["data_source"]] = (where(spec, position), row)
    return first


def check_scoring(
    rows_by_spec: dict[str, list[dict]],
    function_spec: str | None,
    *,
    timeout_s: float,
    memory_limit_mib: int | None = None,
    where: RowLocation = row_number,
) -> None:
    """Raise ValueError unless every row of `rows_by_spec` (data spec -> its rows) can be scored:
    by the built-in reward function of its data_source (`function_spec` None), or by
    `function_spec`, probed on one real row per data source (module docstring) with a limit of
    max(`timeout_s`, `PROBE_LIMIT_S`). Errors name a source's first row by `where`."""
    first_rows = first_row_of_each_source(rows_by_spec, where)
    if function_spec is None:
        unscored = {source: location for source, (location, _) in first_rows.items() if reward_function_for(source) is None}
        if unscored:
            named = "; ".join(f"{source!r} (first at {location})" for source, location in unscored.items())
            raise ValueError(
                f"no reward function for data_source {named}; built-in: {', '.join(sorted(REWARD_FUNCTIONS))}, "
                "each also as KIND/NAME (math/algebra is scored as math). Give a reward function of your own as "
                "package.module:function (reward.function=, or --reward-function), or prepare the file with "
                "`pacs prepare --data-source math/NAME` to score it with the math verifier"
            )
        return
    _check_signature(function_spec)
    limit_s = max(timeout_s, PROBE_LIMIT_S)
    with ScoringPool(function_spec, num_workers=1, timeout_s=limit_s, memory_limit_mib=memory_limit_mib) as pool:
        for location, row in first_rows.values():
            _probe(pool, function_spec, location, row, limit_s)


def _check_signature(function_spec: str) -> None:
    function = load_reward_function(function_spec)
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin or C function without one: the probe call tells
        return
    try:
        signature.bind(*SIGNATURE)
    except TypeError as error:
        raise ValueError(
            f"reward function {function_spec} takes {signature}, but pacs calls it as "
            f"compute_score({', '.join(SIGNATURE)}) ({error})"
        ) from None


def _probe(pool: ScoringPool, function_spec: str, where: str, row: dict, limit_s: float) -> None:
    response = probe_response(row)
    try:
        outcome = pool.score([row], [response])
    except ValueError as error:
        raise ValueError(f"{where}, scoring the answer {response!r}: {error}") from None
    if outcome.timed_out:
        raise ValueError(
            f"reward function {function_spec} gave no score within {limit_s:g} s for {where} (the answer {response!r}); "
            "it would time out on every answer and score it 0. Fix it (or raise reward.timeout_s / "
            "--reward-timeout if it is slow by design)"
        )
    if outcome.crashed:
        raise ValueError(
            f"reward function {function_spec} ended its process while scoring {where} (the answer {response!r}): "
            "it crashed or went past reward.memory_limit_mib"
        )


def unverifiable_ground_truths(rows: list[dict], *, timeout_s: float = GROUND_TRUTH_READING_LIMIT_S) -> list[int]:
    """The positions in `rows` of those whose ground truth their built-in reward can never match:
    rows the math verifier scores (by data_source) whose ground truth math-verify reads only as
    text (`pacs.rewards.math.reads_as_math`), or does not read within `timeout_s` seconds. Rows
    of other data sources are not checked: each reward function reads its ground truth its own way."""
    positions = [position for position, row in enumerate(rows) if reward_function_for(row["data_source"]) is math_compute_score]
    if not positions:
        return []
    calls = [(rows[position]["reward_model"]["ground_truth"],) for position in positions]
    with TimeLimitedWorkers("pacs.rewards.math:reads_as_math", num_workers=1) as workers:
        readings = workers.run(calls, timeout_s=timeout_s).results
    return [position for position, reads in zip(positions, readings, strict=True) if reads is not True]
