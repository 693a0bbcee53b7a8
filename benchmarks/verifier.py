"""How fast the math verifier scores, in this process and in a ScoringPool, and its worst case.

Responses are built from MATH-500 answers in the formats models write: correct answers (as given,
so mostly the string fast path), incorrect ones (the answer perturbed, so math-verify's symbolic
step runs) and malformed boxes (unterminated, empty, junk). They are scored sequentially
(``num_workers=0``: the fast path in this process, the symbolic step in the math module's own
time-limited worker) and by a pool of worker processes. A second table times each adversarial
answer, alone, with a 1 s limit. Run: `.venv/bin/python benchmarks/verifier.py [--rows 300]`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pacs.rewards import ScoringPool, math_score

MATH500 = Path(__file__).resolve().parents[1] / "data" / "benchmarks" / "math500.jsonl"
CORRECT_FORMATS = [
    "We simplify step by step. Therefore, the result is $\\boxed{ANSWER}$.",
    "Putting it together:\n\n**Final Answer**\n\\[\n\\boxed{ANSWER}\n\\]",
    "So the value we want is \\boxed{ANSWER}.",
]
MALFORMED_FORMATS = [
    "The answer is \\boxed{ANSWER",
    "The answer is \\boxed{}.",
    "So we get \\boxed{\\frac{ANSWER}{}} \\right)",
    "\\boxed{ANSWER}}}}} and then $$$",
]
ADVERSARIAL_ANSWERS = {
    "\\boxed{(10^{10^{10}})!}": "\\boxed{(10^{10^{10}})!}",
    "\\boxed{9^{9^{9^{9}}}}": "\\boxed{9^{9^{9^{9}}}}",
    "3000 nested ( )": "\\boxed{" + "(" * 3000 + "1" + ")" * 3000 + "}",
    "unterminated \\boxed{": "so the answer is \\boxed{1",
    "control characters": "\\boxed{1\x00\x07\x1b\x7f}",
    "lone surrogate \\ud800": "\\boxed{\ud800}",
}


def math500_row(ground_truth: str, index: int) -> dict:
    return {
        "data_source": "math500",
        "reward_model": {"ground_truth": ground_truth},
        "extra_info": {"index": index},
    }


def perturbed(answer: str, generator: random.Random) -> str:
    """A wrong answer near ``answer``: an integer off by a little, or the expression plus one."""
    if answer.lstrip("-").isdigit():
        return str(int(answer) + generator.choice([-2, -1, 1, 10]))
    return answer + "+1"


def build_batch(count: int, seed: int) -> tuple[list[dict], list[str], dict[str, int]]:
    """Rows and responses: 40% correct, 40% incorrect, 20% malformed, in a shuffled order."""
    generator = random.Random(seed)
    answers = [json.loads(line)["answer"] for line in MATH500.read_text(encoding="utf-8").splitlines()]
    rows, responses, kinds = [], [], {"correct": 0, "incorrect": 0, "malformed": 0}
    for index in range(count):
        answer = generator.choice(answers)
        kind = generator.choices(list(kinds), weights=[4, 4, 2])[0]
        kinds[kind] += 1
        if kind == "malformed":
            response = generator.choice(MALFORMED_FORMATS).replace("ANSWER", answer)
        else:
            shown = answer if kind == "correct" else perturbed(answer, generator)
            response = generator.choice(CORRECT_FORMATS).replace("ANSWER", shown)
        rows.append(math500_row(answer, index))
        responses.append(response)
    return rows, responses, kinds


def timed_batch(pool: ScoringPool, rows: list[dict], responses: list[str]) -> tuple[float, float, int]:
    """Seconds to score the batch (after a warm-up call), mean score, and timeouts."""
    pool.score(rows[:1], responses[:1])
    start = time.perf_counter()
    batch = pool.score(rows, responses)
    seconds = time.perf_counter() - start
    return seconds, sum(batch.scores) / len(batch.scores), batch.timed_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows, responses, kinds = build_batch(args.rows, args.seed)
    console = Console(width=100)

    throughput = Table(
        title=f"{args.rows} MATH-500 verifications, limit {args.timeout_s} s",
        caption=", ".join(f"{count} {kind}" for kind, count in kinds.items())
        + f"; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start",
    )
    for column in ("scorer", "verifications / s", "seconds", "mean score", "timed out"):
        throughput.add_column(column, justify="right" if column != "scorer" else "left")
    scorers = [("sequential (num_workers=0)", 0), (f"ScoringPool (num_workers={args.workers})", args.workers)]
    for label, num_workers in scorers:
        with ScoringPool(num_workers=num_workers, timeout_s=args.timeout_s) as pool:
            seconds, mean_score, timed_out = timed_batch(pool, rows, responses)
        throughput.add_row(label, f"{args.rows / seconds:.0f}", f"{seconds:.2f}", f"{mean_score:.3f}", str(timed_out))
    console.print(throughput)

    latency = Table(title=f"seconds to score an adversarial answer (truth '1', limit {args.timeout_s} s)")
    for column in ("answer", "math_score", "ScoringPool (1 worker)", "score"):
        latency.add_column(column, justify="right" if column != "answer" else "left")
    worst_direct = worst_pool = 0.0
    adversarial_row = math500_row("1", 0)
    with ScoringPool(num_workers=1, timeout_s=args.timeout_s) as pool:
        pool.score([adversarial_row], ["\\boxed{1}"])
        for label, answer in ADVERSARIAL_ANSWERS.items():
            start = time.perf_counter()
            direct_score = math_score(answer, "1", timeout_s=args.timeout_s)
            direct_s = time.perf_counter() - start
            start = time.perf_counter()
            pool_score = pool.score([adversarial_row], [answer]).scores[0]
            pool_s = time.perf_counter() - start
            worst_direct, worst_pool = max(worst_direct, direct_s), max(worst_pool, pool_s)
            scores = f"{direct_score:.0f} / {pool_score:.0f}"
            latency.add_row(label, f"{direct_s:.3f}", f"{pool_s:.3f}", scores)
    latency.add_row("worst case", f"{worst_direct:.3f}", f"{worst_pool:.3f}", "", style="bold")
    console.print(latency)


if __name__ == "__main__":
    main()
