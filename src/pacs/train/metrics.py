"""What a run writes about itself: `metrics.jsonl` (one strict-JSON object a step), TensorBoard
events and, with `train.save_rollouts`, `rollouts/step_N.jsonl`. Rank 0 alone writes; every rank
calls the same methods (the rollouts of all ranks are gathered to rank 0).

A metric that is undefined at a step (a ratio over zero variance, such as PPO's explained
variance when every return is equal) or not finite is written as `null` in `metrics.jsonl`, never
as the non-standard `NaN`/`Infinity` tokens, and is left out of TensorBoard for that step.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from pacs.train.distributed import World


class MetricsLogger:
    """Appends to `output_dir/metrics.jsonl`; on resume, lines after `resume_step` are dropped
    first, so the file always describes one uninterrupted run."""

    def __init__(self, output_dir: Path, world: World | None = None, *, resume_step: int = 0):
        self.world = world or World.single()
        self.path = output_dir / "metrics.jsonl"
        self.rollouts_dir = output_dir / "rollouts"
        self.writer = None
        if not self.world.is_writer:
            return
        kept = []
        if resume_step and self.path.exists():
            kept = [line for line in _complete_lines(self.path) if json.loads(line)["step"] <= resume_step]
        self.path.write_text("".join(line + "\n" for line in kept))
        self.writer = SummaryWriter(log_dir=str(output_dir / "tensorboard"), purge_step=resume_step + 1 if resume_step else None)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """One line of `metrics` for `step` (the same global metrics on every rank)."""
        if self.writer is None:
            return
        defined = {name: value if math.isfinite(value) else None for name, value in metrics.items()}
        with open(self.path, "a") as handle:
            handle.write(json.dumps({"step": step, **defined}, allow_nan=False) + "\n")
        for name, value in defined.items():
            if value is not None:
                self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def log_rollouts(self, step: int, rows: list[dict], responses: list[str], rewards: list[float]) -> None:
        """`rollouts/step_N.jsonl`: one line per response of every rank, in rank order, with the
        prompt's chat messages, data_source and ground truth, the response text, its reward and
        the rank that produced it."""
        records = [
            {
                "rank": self.world.rank,
                "data_source": row["data_source"],
                "prompt": row["prompt"],
                "ground_truth": row["reward_model"]["ground_truth"],
                "response": response,
                "reward": reward,
            }
            for row, response, reward in zip(rows, responses, rewards)
        ]
        gathered = [record for rank_records in self.world.gather_objects(records) for record in rank_records]
        if self.writer is None:
            return
        self.rollouts_dir.mkdir(parents=True, exist_ok=True)
        lines = (json.dumps({"step": step, **record}, allow_nan=False) for record in gathered)
        (self.rollouts_dir / f"step_{step}.jsonl").write_text("".join(line + "\n" for line in lines))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_metrics(output_dir: Path) -> list[dict]:
    """The rows of a run's `metrics.jsonl`."""
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines() if line]


def _complete_lines(path: Path) -> list[str]:
    """The lines of a metrics file, without a last line cut short by a killed process (it can only
    describe a step after the checkpoint being resumed); any other unreadable line is an error."""
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines, start=1):
        try:
            json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):
                return lines[:-1]
            raise ValueError(f"{path}, line {number}: not a JSON object ({error}); cannot resume its metrics") from None
    return lines
