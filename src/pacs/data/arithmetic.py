"""The built-in task ``builtin:arithmetic``: integer arithmetic with a boxed answer.

Each problem is ``a <op> b`` with ``op`` in ``+``, ``-``, ``*``. Difficulty is set by the largest
operand M: ``digits`` gives M = 10**digits - 1, or ``max_operand`` sets M directly (it takes
precedence). For ``+`` and ``-`` both operands are uniform in ``[0, M]``; for ``*`` the first is in
``[0, M]`` and the second is a single digit in ``[0, min(M, 9)]``. Results of ``-`` may be
negative. Prompt and reference response (kept short for a character-level model):

    prompt:   What is 12+34? Put the final answer in \\boxed{}.
    response: \\boxed{46}

Train and val are disjoint: a stable hash of the expression text (``"12+34"``) puts one problem
in ten into val and the rest into train, whatever the seed. Rows follow the shared RLVR row
schema (``data_source``, ``prompt``, ``ability``, ``reward_model``, ``extra_info``).

The built-in task ``builtin:multiplication`` (`generate_multiplications`) is the tool task of
``builtin:tools-demo``: ``a*b`` with both operands of exactly ``digits`` digits, in the same rows,
prompt, answer and split, so large that the tiny model cannot compute the product and must call
a tool to get it right.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator

DATA_SOURCE = "arithmetic"
SPLITS = ("train", "val")
OPERATIONS = "+-*"
VAL_BUCKETS = 10


def _check_operations(operations: str) -> str:
    """Return ``operations`` deduplicated in canonical ``+-*`` order; reject anything else."""
    unknown = sorted(set(operations) - set(OPERATIONS))
    if not operations or unknown:
        raise ValueError(f"operations must be a non-empty subset of {OPERATIONS!r}, got {operations!r}")
    return "".join(op for op in OPERATIONS if op in operations)


def _check_split_and_size(split: str, size: int) -> None:
    """ValueError naming the value unless `split` is one of `SPLITS` and `size` ≥ 1."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    if size < 1:
        raise ValueError(f"size must be an integer >= 1, got {size!r}")


def _split_of(expression: str) -> str:
    """Return ``"val"`` for one expression in ``VAL_BUCKETS`` (by a stable hash), else ``"train"``."""
    digest = hashlib.sha256(expression.encode("ascii")).digest()
    return "val" if int.from_bytes(digest[:8], "big") % VAL_BUCKETS == 0 else "train"


def _second_operand_count(op: str, operand_count: int) -> int:
    """Number of values the second operand of ``op`` takes: ``operand_count``, at most 10 for ``*``."""
    return min(10, operand_count) if op == "*" else operand_count


def _shuffled_indices(count: int, rng: random.Random) -> Iterator[int]:
    """Yield ``range(count)`` in uniformly random order, lazily (sparse Fisher-Yates shuffle)."""
    swapped: dict[int, int] = {}
    for position in range(count):
        chosen = rng.randrange(position, count)
        yield swapped.get(chosen, chosen)
        swapped[chosen] = swapped.get(position, position)


def _compute(a: int, op: str, b: int) -> int:
    """Return ``a op b`` with integer arithmetic."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    return a * b


def generate_problems(
    split: str,
    size: int,
    *,
    digits: int = 2,
    max_operand: int | None = None,
    operations: str = OPERATIONS,
    seed: int = 0,
    allow_fewer: bool = False,
) -> list[dict]:
    """Return ``size`` distinct arithmetic rows of ``split`` ("train" or "val"), in random order.

    Deterministic given the arguments. Problems are drawn without replacement from every
    ``(a, op, b)`` that belongs to ``split``; asking for more than exist raises ValueError, unless
    ``allow_fewer``, which returns all there are.
    """
    _check_split_and_size(split, size)
    if digits < 1:
        raise ValueError(f"digits must be an integer >= 1, got {digits!r}")
    if max_operand is not None and max_operand < 1:
        raise ValueError(f"max_operand must be an integer >= 1, got {max_operand!r}")
    operations = _check_operations(operations)
    operand_count = (max_operand if max_operand is not None else 10**digits - 1) + 1
    block_sizes = [operand_count * _second_operand_count(op, operand_count) for op in operations]
    rng = random.Random(f"arithmetic:{split}:{operand_count}:{operations}:{seed}")
    rows: list[dict] = []
    for problem_index in _shuffled_indices(sum(block_sizes), rng):
        for op, block_size in zip(operations, block_sizes):  # noqa: B007 (op is used after the break)
            if problem_index < block_size:
                break
            problem_index -= block_size
        a, b = divmod(problem_index, _second_operand_count(op, operand_count))
        expression = f"{a}{op}{b}"
        if _split_of(expression) != split:
            continue
        rows.append(_row(split, len(rows), expression, _compute(a, op, b)))
        if len(rows) == size:
            return rows
    if allow_fewer:
        return rows
    raise ValueError(
        f"Requested {size} {split} problems but only {len(rows)} distinct ones exist for "
        f"largest operand {operand_count - 1}, operations={operations!r}; lower size or raise digits/max_operand"
    )


def _row(split: str, index: int, expression: str, answer: int) -> dict:
    """One row of the shared schema for `expression`, whose answer is `answer`."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"What is {expression}? Put the final answer in \\boxed{{}}."}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {"split": split, "index": index, "expression": expression},
    }


def generate_multiplications(split: str, size: int, *, digits: int = 4, seed: int = 0) -> list[dict]:
    """Return ``size`` distinct rows ``a*b`` of ``split`` ("train" or "val"), both operands of
    exactly ``digits`` digits (in ``[10**(digits-1), 10**digits - 1]``), in random order.

    Deterministic given the arguments; split by the same hash as `generate_problems`. Raises
    ValueError for an unknown split, ``digits`` < 2 (one-digit products are the arithmetic task's)
    or ``size`` < 1, or when ``size`` exceeds the problems that exist.
    """
    _check_split_and_size(split, size)
    if digits < 2:
        raise ValueError(f"digits must be an integer >= 2, got {digits!r}")
    smallest = 10 ** (digits - 1)
    operand_count = 10**digits - smallest
    rng = random.Random(f"multiplication:{split}:{digits}:{seed}")
    rows: list[dict] = []
    for problem_index in _shuffled_indices(operand_count**2, rng):
        a, b = (smallest + operand for operand in divmod(problem_index, operand_count))
        expression = f"{a}*{b}"
        if _split_of(expression) == split:
            rows.append(_row(split, len(rows), expression, a * b))
            if len(rows) == size:
                return rows
    raise ValueError(
        f"Requested {size} {split} problems but only {len(rows)} distinct ones exist with {digits}-digit operands; "
        "lower size or raise digits"
    )


def answer_text(row: dict) -> str:
    """Return the reference response of an arithmetic row, e.g. ``\\boxed{46}``."""
    return f"\\boxed{{{row['reward_model']['ground_truth']}}}"
