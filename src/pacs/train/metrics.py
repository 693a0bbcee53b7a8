"""What a run writes about itself: `metrics.jsonl` (one strict-JSON object a step), the trackers
of `train.report_to` (TensorBoard events by default, W&B, MLflow: `pacs.train.trackers`) and,
with `train.save_rollouts`, `rollouts/step_N.jsonl`; with `rollout.tools`, `traces.jsonl` (a few
trajectories a step, for a person to read). Rank 0 alone writes and reports; every rank calls the
same methods (the rollouts of all ranks are gathered to rank 0; traces are rank 0's own).

A metric that is undefined at a step (a ratio over zero variance, such as PPO's explained
variance when every return is equal) or not finite is written as `null` in `metrics.jsonl`, never
as the non-standard `NaN`/`Infinity` tokens, and is left out of the trackers for that step.

A write that finds the disk full stops the run with `pacs.outputs.DiskFull` (one line: the folder,
what, its size, the free space); a line of `metrics.jsonl` or a rollouts file written in part is
removed first. On resume, `metrics.jsonl` and `traces.jsonl` keep their lines up to the resumed
step only, so a step is never written twice.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pacs.config import Config
from pacs.distributed.collectives import gather_objects
from pacs.distributed.world import World
from pacs.outputs import RunMoved, disk_faults, replace_file
from pacs.rollout.base import Rollouts
from pacs.rollout.multiturn import trajectory_turns
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
        self.traces_path = output_dir / "traces.jsonl"
        self.rollouts_dir = output_dir / "rollouts"
        self.trackers: list[Tracker] | None = None
        if not self.world.is_writer:
            return
        replace_file(self.path, _lines_up_to(self.path, resume_step))  # a kill here keeps the old lines
        if self.traces_path.exists():
            replace_file(self.traces_path, _lines_up_to(self.traces_path, resume_step))
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
        _append_line(self.path, step, json.dumps({"step": step, **defined}, allow_nan=False) + "\n")
        finite = {name: value for name, value in defined.items() if value is not None}
        for tracker in self.trackers:
            what = f"step {step}'s {tracker.name} events"
            with disk_faults(self.path.parent, what), _folder_gone(self.path.parent, what):
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

    def log_traces(self, step: int, rows: list[dict], rollouts: Rollouts, rewards: list[float], tokenizer, count: int) -> None:
        """One line of `traces.jsonl` for `step`: the first response to each of the first `count`
        prompts of this rank's share (`rows` and `rewards` are per response; rank 0's alone is
        written), each with its data_source, prompt text, ground truth, turns (`trajectory_turns`:
        {"model": text} and {"tool": text} in order) and reward."""
        if self.trackers is None:
            return
        traces = [
            {
                "data_source": rows[row]["data_source"],
                "prompt": tokenizer.decode(rollouts.prompt_ids[row][rollouts.prompt_mask[row].bool()].tolist()),
                "ground_truth": rows[row]["reward_model"]["ground_truth"],
                "turns": trajectory_turns(rollouts, row, tokenizer),
                "reward": rewards[row],
            }
            for row in range(0, min(count * rollouts.group_size, len(rewards)), rollouts.group_size)
        ]
        _append_line(self.traces_path, step, json.dumps({"step": step, "trajectories": traces}, allow_nan=False) + "\n")

    def close(self) -> None:
        for tracker in self.trackers or []:
            with disk_faults(self.path.parent, f"the last of {tracker.name}'s events"):
                tracker.close()


@contextmanager
def _folder_gone(output_dir: Path, what: str) -> Iterator[None]:
    """A tracker that writes by path (TensorBoard's event file) and finds its file gone: the run's
    folder was moved away or replaced while it ran; `RunMoved`, one line, instead."""
    try:
        yield
    except FileNotFoundError:
        raise RunMoved(
            f"{output_dir}, which this run writes, was moved away or replaced while it ran: writing {what} found its "
            "file gone; stopping. Continue the run where its folder is now with output_dir=THERE resume=auto"
        ) from None


def read_metrics(output_dir: Path) -> list[dict]:
    """The rows of a run's `metrics.jsonl`."""
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines() if line]


def summary_lines(output_dir: Path, config: Config) -> list[str]:
    """What a finished run says at its end, for people: the training reward at its first and last
    logged step, each data source's validation pass@1 at the first and last step it was
    validated, then the commands that show the rest (`pacs plot`, TensorBoard)."""
    rows = read_metrics(output_dir) if (output_dir / "metrics.jsonl").is_file() else []
    lines = []

    def first_and_last(key: str, label: str, shown: str) -> None:
        points = [(row["step"], row[key]) for row in rows if row.get(key) is not None]
        if points:
            (first_step, first), (last_step, last) = points[0], points[-1]
            change = f" -> {shown.format(last)} at step {last_step}" if last_step != first_step else ""
            lines.append(f"{label}: {shown.format(first)} at step {first_step}{change}")

    first_and_last("reward/mean", "training reward (mean)", "{:.3f}")
    for key in sorted({key for row in rows for key in row if key.startswith("val/") and key.endswith("/pass@1")}):
        first_and_last(key, f"validation {key.removeprefix('val/')}", "{:.1%}")
    lines.append(f"next: pacs plot {output_dir}   (PNG curves into {output_dir / 'plots'})")
    if "tensorboard" in config.train.report_to:
        lines.append(f"      tensorboard --logdir {output_dir / 'tensorboard'}")
    return lines


def _append_line(path: Path, step: int, line: str) -> None:
    """Append `line`, `step`'s, to `path`, whole or not at all."""
    with disk_faults(path.parent, f"step {step}'s line of {path.name}", len(line.encode())):
        with open(path, "a") as handle:
            end = handle.tell()
            try:
                handle.write(line)
                handle.flush()
            except BaseException:
                handle.truncate(end)  # no part of a line left behind
                raise


def _lines_up_to(path: Path, resume_step: int) -> str:
    """The complete lines of `path` (one JSON object with its "step" a line) whose step is at most
    `resume_step`; none on a fresh run (resume_step 0) or without the file."""
    if not resume_step or not path.exists():
        return ""
    return "".join(line + "\n" for line in _complete_lines(path) if json.loads(line)["step"] <= resume_step)


def _complete_lines(path: Path) -> list[str]:
    """The lines of a metrics or traces file, without a last line cut short by a killed process (it can only
    describe a step after the checkpoint being resumed); any other unreadable line is an error."""
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines, start=1):
        try:
            json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):
                return lines[:-1]
            raise ValueError(f"{path}, line {number}: not a JSON object ({error}); cannot resume it") from None
    return lines
