"""What a run writes about itself: `metrics.jsonl` (one strict-JSON object a step), the trackers
of `train.report_to` (TensorBoard events by default, W&B, MLflow: `pacs.train.trackers`) and,
with `train.save_rollouts`, `rollouts/step_N.jsonl`. Rank 0 alone writes and reports; every rank
calls the same methods (the rollouts of all ranks are gathered to rank 0).

A metric that is undefined at a step (a ratio over zero variance, such as PPO's explained
variance when every return is equal) or not finite is written as `null` in `metrics.jsonl`, never
as the non-standard `NaN`/`Infinity` tokens, and is left out of the trackers for that step.

A write that finds the disk full stops the run with `pacs.outputs.DiskFull` (one line: the folder,
what, its size, the free space); a line of `metrics.jsonl` or a rollouts file written in part is
removed first.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from pacs.config import Config
from pacs.distributed.collectives import gather_objects
from pacs.distributed.world import World
from pacs.outputs import disk_faults, replace_file
from pacs.train.trackers import Tracker, open_trackers


class MetricsLogger:
    """Appends to `output_dir/metrics.jsonl` and reports to the trackers of `config.train.report_to`
    (TensorBoard alone without a config); on resume, lines after `resume_step` are dropped first,
    so the file always describes one uninterrupted run, and each tracker continues the run whose id
    `resumed_runs` (the checkpoint's trainer state) holds for it."""

    def __init__(
        self,
        output_dir: Path,
        world: World | None = None,
        *,
        resume_step: int = 0,
        config: Config | None = None,
        resumed_runs: dict[str, str] | None = None,
    ):
        self.world = world or World.single()
        self.path = output_dir / "metrics.jsonl"
        self.rollouts_dir = output_dir / "rollouts"
        self.trackers: list[Tracker] | None = None
        if not self.world.is_writer:
            return
        kept = []
        if resume_step and self.path.exists():
            kept = [line for line in _complete_lines(self.path) if json.loads(line)["step"] <= resume_step]
        replace_file(self.path, "".join(line + "\n" for line in kept))  # a kill here keeps the old lines
        self.trackers = open_trackers(config or Config(), output_dir, resume_step, resumed_runs or {})

    @property
    def run_ids(self) -> dict[str, str]:
        """tracker name -> its run id, for the checkpoint's trainer state (empty on ranks > 0)."""
        return {tracker.name: tracker.run_id for tracker in self.trackers or [] if tracker.run_id}

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """One line of `metrics` for `step` (the same global metrics on every rank)."""
        if self.trackers is None:
            return
        defined = {name: value if math.isfinite(value) else None for name, value in metrics.items()}
        line = json.dumps({"step": step, **defined}, allow_nan=False) + "\n"
        with disk_faults(self.path.parent, f"step {step}'s line of {self.path.name}", len(line)):
            with open(self.path, "a") as handle:
                end = handle.tell()
                try:
                    handle.write(line)
                    handle.flush()
                except BaseException:
                    handle.truncate(end)  # no part of a line left behind
                    raise
        finite = {name: value for name, value in defined.items() if value is not None}
        for tracker in self.trackers:
            with disk_faults(self.path.parent, f"step {step}'s {tracker.name} events"):
                tracker.log(step, finite)

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
        gathered = [record for rank_records in gather_objects(self.world, records) for record in rank_records]
        if self.trackers is None:
            return
        text = "".join(json.dumps({"step": step, **record}, allow_nan=False) + "\n" for record in gathered)
        path = self.rollouts_dir / f"step_{step}.jsonl"
        with disk_faults(self.rollouts_dir, path.name, len(text.encode())):
            self.rollouts_dir.mkdir(parents=True, exist_ok=True)
            try:
                path.write_text(text)
            except BaseException:
                path.unlink(missing_ok=True)
                raise

    def close(self) -> None:
        for tracker in self.trackers or []:
            with disk_faults(self.path.parent, f"the last of {tracker.name}'s events"):
                tracker.close()


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
