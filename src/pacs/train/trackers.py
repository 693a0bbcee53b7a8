"""Experiment trackers a run reports its metrics to (`train.report_to`), besides `metrics.jsonl`.

    tensorboard  output_dir/tensorboard/ event files (the default)
    wandb        Weights & Biases (`pip install 'pacs[wandb]'`; files in output_dir/wandb/, or
                 under WANDB_DIR when it is set, and offline with WANDB_MODE=offline)
    mlflow       MLflow (`pip install 'pacs[mlflow]'`), at `train.mlflow_tracking_uri`

Every tracker gets the metrics of `metrics.jsonl` under the same names, at the same steps, finite
values only (MLflow refuses `@` in a name: `pass@k` is logged there as `pass_at_k`, see
`mlflow_metric_name`), and W&B and MLflow get the resolved config as the run's parameters
(nested keys joined with dots). `MetricsLogger` opens them on rank 0 alone.

Resuming (`resume=auto`) continues the same tracker run: its id is kept in the checkpoint's trainer
state (`run_id`), and what the killed process logged after the checkpoint is not duplicated:
TensorBoard purges the steps after it (`purge_step`); W&B rewinds the run to it (`resume_from=
"<id>?_step=N"`), so the resumed process's steps replace the killed one's; MLflow cannot delete
logged values, so the steps the run already holds are not logged again (resuming recomputes them
identically, timings aside). W&B writes its records in the background (its offline log every
15 s by default, `WANDB__TRANSACTION_LOG_FLUSH_INTERVAL`): what it had not written when the
process was killed is missing from the run, never doubled.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from pacs.config import Config

EXTRAS = {"wandb": "wandb", "mlflow": "mlflow"}
"""Tracker -> the module it needs, installed by the pacs extra of the tracker's name."""
MLFLOW_PARAM_CHARS = 6000
"""Longest parameter value MLflow stores."""
_MLFLOW_REFUSED = re.compile(r"[^A-Za-z0-9_\-. :/]")


class Tracker(Protocol):
    name: str
    """Its name in `train.report_to`."""
    run_id: str | None
    """What resuming needs to continue this tracker's run (None: nothing, as for TensorBoard)."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """`metrics` (finite values, metrics.jsonl's names) at `step`."""

    def close(self) -> None: ...


def check_tracker_packages(report_to: list[str]) -> None:
    """Raise ValueError naming the pacs extra to install for every tracker whose package is missing
    (found without importing it, so it costs nothing before a run starts)."""
    missing = [name for name in report_to if name in EXTRAS and importlib.util.find_spec(EXTRAS[name]) is None]
    if missing:
        extras = ",".join(missing)
        raise ValueError(
            f"{', '.join(missing)} asked for, but not installed: pip install 'pacs[{extras}]' "
            f"(or leave {', '.join(missing)} out of train.report_to)"
        )


def flat_parameters(config: Config) -> dict[str, Any]:
    """The resolved config as {"section.key": value} (lists and None as their text)."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}{key}.", inner)
        else:
            flat[prefix[:-1]] = value if isinstance(value, (bool, int, float, str)) else str(value)

    walk("", config.model_dump())
    return flat


def run_name(config: Config) -> str:
    """`train.run_name`, or the output_dir's last two path parts (`runs/pacs`, `grpo/seed_0`)."""
    return config.train.run_name or "/".join(Path(config.output_dir).parts[-2:])


def open_trackers(config: Config, output_dir: Path, resume_step: int, resumed_runs: dict[str, str]) -> list[Tracker]:
    """One tracker per name in `config.train.report_to`, new or continuing the run id that
    `resumed_runs` (the checkpoint's) holds for it, at `resume_step`."""
    opened: list[Tracker] = []
    for name in config.train.report_to:
        if name == "tensorboard":
            opened.append(TensorBoardTracker(output_dir, resume_step))
        elif name == "wandb":
            opened.append(WandbTracker(config, output_dir, resume_step, resumed_runs.get(name)))
        else:
            opened.append(MlflowTracker(config, resumed_runs.get(name)))
    return opened


class TensorBoardTracker:
    """Event files in output_dir/tensorboard; what was logged after `resume_step` (0: a new run) is
    purged, so that a run restarted before its first checkpoint does not log its steps twice.

    TensorBoard writes its events from a thread of its own, which keeps an error it meets (a full
    disk, its folder moved away) for the writer's next call: `log` flushes at every step, so the
    error is raised there, in the trainer's thread, where `MetricsLogger` turns a full disk into
    one line (`pacs.outputs.disk_faults`); the thread's own traceback is not printed
    (`_skip_event_writer_threads`), and `close` after such an error raises nothing more."""

    name = "tensorboard"
    run_id = None

    def __init__(self, output_dir: Path, resume_step: int):
        from torch.utils.tensorboard import SummaryWriter

        if threading.excepthook is not _skip_event_writer_threads:
            _hooks_before.append(threading.excepthook)
            threading.excepthook = _skip_event_writer_threads
        purge_step = resume_step + 1 if resume_step else 0  # a run from its start logs step 0 (validation) too
        self.writer = SummaryWriter(log_dir=str(output_dir / "tensorboard"), purge_step=purge_step)
        self.failed = False

    def log(self, step: int, metrics: dict[str, float]) -> None:
        try:
            for metric, value in metrics.items():
                self.writer.add_scalar(metric, value, step)
            self.writer.flush()  # raises what the writer's thread met
        except BaseException:
            self.failed = True
            raise

    def close(self) -> None:
        if self.failed:  # its error was raised by `log`; closing would only raise it again
            with contextlib.suppress(OSError):
                self.writer.close()
            return
        try:
            self.writer.flush()
        except BaseException:
            self.failed = True
            raise
        self.writer.close()


_hooks_before: list[Callable[[threading.ExceptHookArgs], object]] = []
"""`threading.excepthook` as it was before `_skip_event_writer_threads` was put in its place."""


def _skip_event_writer_threads(args: threading.ExceptHookArgs) -> None:
    """`threading.excepthook` that passes every thread's uncaught error to the hook before it,
    except TensorBoard's event writer's (its writer raises it at the next call, see
    `TensorBoardTracker`)."""
    from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread

    if not isinstance(args.thread, _AsyncWriterThread):
        _hooks_before[-1](args)


class WandbTracker:
    """A W&B run in `train.wandb_project` (files under output_dir/wandb, or where WANDB_DIR says
    when the user set it). A resumed run is rewound to `resume_step` (`resume_from`), which drops
    what was logged after it, and continues there."""

    name = "wandb"

    def __init__(self, config: Config, output_dir: Path, resume_step: int, resumed_id: str | None):
        import wandb

        options: dict[str, Any] = {"resume_from": f"{resumed_id}?_step={resume_step}"} if resumed_id else {}
        self.run = wandb.init(
            project=config.train.wandb_project,
            entity=config.train.wandb_entity,
            name=run_name(config),
            dir=None if os.environ.get("WANDB_DIR") else str(output_dir),  # None: W&B reads WANDB_DIR
            config=config.model_dump(),
            **options,
        )
        self.run_id = self.run.id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step, commit=True)  # the step is complete: W&B writes it now, not at the next

    def close(self) -> None:
        self.run.finish()


def mlflow_metric_name(name: str) -> str:
    """`name` as MLflow takes it (letters, digits and `_ - . : /` and spaces): `@` -> `_at_`, any
    other refused character -> `_`. `val/math500/pass@1` -> `val/math500/pass_at_1`."""
    return _MLFLOW_REFUSED.sub("_", name.replace("@", "_at_"))


class MlflowTracker:
    """An MLflow run in experiment `train.mlflow_experiment` at `train.mlflow_tracking_uri`. A
    resumed run logs only the steps after the last one it holds (MLflow cannot delete values)."""

    name = "mlflow"

    def __init__(self, config: Config, resumed_id: str | None):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(config.train.mlflow_tracking_uri)
        self.first_new_step = 0
        if resumed_id:
            self.run_id = resumed_id
            self.first_new_step = self._last_logged_step() + 1
            self.client.update_run(resumed_id, status="RUNNING")
            return
        experiment = self.client.get_experiment_by_name(config.train.mlflow_experiment)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(config.train.mlflow_experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name(config)).info.run_id
        params = [Param(key, str(value)[:MLFLOW_PARAM_CHARS]) for key, value in flat_parameters(config).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 parameters a call
            self.client.log_batch(self.run_id, params=params[start : start + 100])

    def _last_logged_step(self) -> int:
        """The largest step of any metric the run holds (0: none)."""
        keys = self.client.get_run(self.run_id).data.metrics
        return max((entry.step for key in keys for entry in self.client.get_metric_history(self.run_id, key)), default=0)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        if step < self.first_new_step:
            return
        timestamp = int(time.time() * 1000)
        self.client.log_batch(
            self.run_id, metrics=[Metric(mlflow_metric_name(name), value, timestamp, step) for name, value in metrics.items()]
        )

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
