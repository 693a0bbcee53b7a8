"""Per-step metrics: `metrics.jsonl` (one JSON object a step) and TensorBoard events."""

from __future__ import annotations

import json
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter


class MetricsLogger:
    """Appends to `output_dir/metrics.jsonl`; on resume, lines after `resume_step` are dropped
    first, so the file always describes one uninterrupted run."""

    def __init__(self, output_dir: Path, *, resume_step: int = 0):
        self.path = output_dir / "metrics.jsonl"
        kept = []
        if resume_step and self.path.exists():
            kept = [line for line in self.path.read_text().splitlines() if json.loads(line)["step"] <= resume_step]
        self.path.write_text("".join(line + "\n" for line in kept))
        self.writer = SummaryWriter(log_dir=str(output_dir / "tensorboard"), purge_step=resume_step + 1 if resume_step else None)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        with open(self.path, "a") as handle:
            handle.write(json.dumps({"step": step, **metrics}) + "\n")
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def read_metrics(output_dir: Path) -> list[dict]:
    """The rows of a run's `metrics.jsonl`."""
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines() if line]
