"""`train.report_to`: W&B (offline) and MLflow (a local SQLite store) get the run's config and the
metrics of metrics.jsonl, and a run killed with kill -9 and resumed continues the same tracker run
without logging a step twice."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from killing import finished, kill_once_checkpointed

from pacs.config import ConfigError, load_config
from pacs.train.metrics import read_metrics
from pacs.train.trackers import mlflow_metric_name
from pacs.train.trainer import train

TINY_RUN = [
    "model.path=builtin:tiny",
    "data.train=builtin:arithmetic?size=16",
    "data.val=builtin:arithmetic?size=4",
    "train.steps=4",
    "train.batch_size=2",
    "train.mini_batch_size=2",
    "train.save_every=2",
    "rollout.n=2",
    "eval.n=1",
    "data.max_response_length=8",
    "train.run_name=tiny",
]


def pacs_train(output_dir: Path, *options: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`pacs train` of the tiny run in a new process group (one thread), with a W&B service of its
    own as a command typed in a shell has (not one this test process may have started)."""
    command = [
        sys.executable,
        "-m",
        "pacs.cli",
        "train",
        "--config",
        "builtin:demo",
        f"output_dir={output_dir}",
        *TINY_RUN,
        *options,
    ]
    inherited = {name: value for name, value in os.environ.items() if name != "WANDB_SERVICE"}
    environment = {**inherited, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen(
        command, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def killed_and_resumed(output_dir: Path, *options: str, env: dict[str, str] | None = None) -> None:
    """A run whose process group is killed (-9) once `step_2` is written, then resumed with
    `resume=auto` to the end. A tracker's own service (W&B's, in a session of its own) outlives the
    kill, as it does when a user kills the training command."""
    kill_once_checkpointed(pacs_train(output_dir, *options, env=env), output_dir, whole_tree=False)
    finished(pacs_train(output_dir, *options, "resume=auto", env=env))


def logged_names(output_dir: Path) -> set[str]:
    """The names metrics.jsonl holds a value for at some step."""
    return {name for row in read_metrics(output_dir) for name, value in row.items() if name != "step" and value is not None}


# ----- one run reported to both, killed and resumed ------------------------------------------------


@pytest.fixture(scope="module")
def killed_tracked_run(tmp_path_factory) -> tuple[Path, str]:
    """(output_dir, MLflow tracking URI) of one run reported to W&B (offline) and MLflow (a SQLite
    store) at once, killed (-9) once step 2 is checkpointed and resumed to step 4: each launch of
    `pacs train` costs seconds, so both trackers are checked on the same run."""
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    root = tmp_path_factory.mktemp("tracked")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    # W&B writes its offline log every 15 s by default; a kill -9 would lose the steps before it
    offline = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB__TRANSACTION_LOG_FLUSH_INTERVAL": "0.05"}
    killed_and_resumed(
        root / "run",
        "train.report_to=[wandb,mlflow]",
        f"train.mlflow_tracking_uri={uri}",
        "train.mlflow_experiment=tiny-runs",
        env=offline,
    )
    return root / "run", uri


# ----- MLflow ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_killed_mlflow_run_resumes_into_the_same_run_without_repeating_a_step(killed_tracked_run):
    import mlflow

    output_dir, uri = killed_tracked_run
    client = mlflow.tracking.MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("tiny-runs").experiment_id])
    assert run.info.run_name == "tiny"
    assert [entry.step for entry in client.get_metric_history(run.info.run_id, "loss")] == [1, 2, 3, 4]
    assert set(run.data.metrics) == {mlflow_metric_name(name) for name in logged_names(output_dir)}
    assert run.data.params["train.steps"] == "4" and run.data.params["model.path"] == "builtin:tiny"


def test_metric_names_mlflow_refuses_are_spelled_out():
    assert mlflow_metric_name("val/math500/pass@1") == "val/math500/pass_at_1"
    assert mlflow_metric_name("reward/mean") == "reward/mean"


# ----- W&B ---------------------------------------------------------------------------------------

WANDB_BLOCK = 32768
"""The offline .wandb file is a LevelDB-style log: a 7-byte header, then 32 KiB blocks of records,
each with a 7-byte header (checksum, length, type: 1 whole, 2 first, 3 middle, 4 last part)."""


def wandb_records(path: Path) -> list:
    """The protobuf records of an offline run's `run-<id>.wandb` file."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, position = [], b"", 7
    while position + 7 <= len(data):
        room = WANDB_BLOCK - position % WANDB_BLOCK
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if room < 7 or (length, kind) == (0, 0):
            position += room
            continue
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_sessions(output_dir: Path) -> list[dict]:
    """Each process's offline run, oldest first: its run id, the step it rewound the run to (None:
    a new run), its config and its history rows ({metric: value}, with W&B's "_step")."""
    sessions = []
    for path in sorted((output_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        session = {"history": [], "config": {}}
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                session["id"] = record.run.run_id
                session["rewound_to"] = record.run.branch_point.value if record.run.HasField("branch_point") else None
                session["config"] = {item.key: json.loads(item.value_json) for item in record.run.config.update}
            elif kind == "history":
                items = record.history.item
                session["history"].append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items})
        sessions.append(session)
    return sessions


@pytest.mark.slow
def test_a_killed_wandb_run_resumes_into_the_same_run_rewound_to_its_checkpoint(killed_tracked_run):
    output_dir, _ = killed_tracked_run
    first, resumed = wandb_sessions(output_dir)
    assert resumed["id"] == first["id"] and (first["rewound_to"], resumed["rewound_to"]) == (None, 2)
    kept = [row for row in first["history"] if row["_step"] <= 2] + resumed["history"]
    assert [row["_step"] for row in kept] == [0, 1, 2, 3, 4]  # 0: the validation before training
    assert {name for row in kept for name in row if not name.startswith("_")} == logged_names(output_dir)
    assert first["config"]["train"]["steps"] == 4 and first["config"]["model"]["path"] == "builtin:tiny"


# ----- missing packages --------------------------------------------------------------------------


@pytest.mark.parametrize("tracker", ["wandb", "mlflow"])
def test_a_tracker_whose_package_is_missing_is_refused_naming_the_extra_before_anything_is_written(
    tmp_path, monkeypatch, tracker
):
    monkeypatch.setitem(sys.modules, tracker, None)  # what importlib sees when the package is not installed
    config = load_config(
        "builtin:demo", [f"output_dir={tmp_path / 'run'}", *TINY_RUN, f"train.report_to=[tensorboard,{tracker}]"]
    )
    with pytest.raises(
        ConfigError, match=rf"train.report_to: {tracker} asked for, but not installed: pip install 'pacs\[{tracker}\]'"
    ):
        train(config, show_progress=False)
    assert not (tmp_path / "run").exists()


def test_a_tracker_named_twice_is_refused():
    with pytest.raises(ConfigError, match="names a tracker twice"):
        load_config("builtin:demo", ["train.report_to=[wandb,wandb]"])
