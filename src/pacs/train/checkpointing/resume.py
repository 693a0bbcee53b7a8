"""Where a run starts, decided on rank 0 before anything is loaded or written (`open_run`).

    fresh            no checkpoint in output_dir/checkpoints
    resumed          `resume=auto`, or a process that torchrun restarted (`--max-restarts`): from
                     the newest whole checkpoint, a damaged newer one skipped and named
    extended         the newest is `final` and `train.steps` is larger: on from `final`
    finished         the newest is `final` at `train.steps`: nothing to do, nothing written
    refused          checkpoints with `resume=never`; only damaged ones; a run past `train.steps`;
                     another node that knows of a newer checkpoint than rank 0 has

Changed settings. A run resumed or extended is compared with the run's own `config.yaml`: a
setting that changes the optimisation (everything but `NOT_OPTIMISATION`: the learning rate and
its schedule, batch sizes, the algorithm's options, the model, the training data, the rollouts'
sampling, the seed, ...) given another value is refused, naming each, unless the user allows it
(`pacs train --allow-changes`, `open_run(allow_changes=True)`); the run then goes on with them
and `SEGMENTS` records from which step each set of settings held (`read_segments`; `pacs plot`
marks the steps).

A lost writer. Only rank 0 writes checkpoints, to its own disk (nodes may share nothing but the
network), so a run whose rank-0 machine is replaced would find none and start over. Every other
node's first process therefore records, after each checkpoint, which one rank 0 wrote
(`NODE_RECORD` in the node's own output_dir, `record_checkpoint`), and a run whose rank 0 knows
of no checkpoint as new as one a node recorded is refused, naming that node and the checkpoint,
instead of starting from zero (`check_no_lost_progress`).
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import yaml

from pacs.config import Config, ConfigError, dump_config
from pacs.distributed.collectives import gather_objects
from pacs.distributed.world import World
from pacs.models.loading import resolve_model_path
from pacs.models.lora import ADAPTER_DIR
from pacs.outputs import MARKER, RUN_LOCK, claim_output_dir, claim_run_folder, replace_file
from pacs.train.checkpointing.folders import (
    FINAL,
    FoundCheckpoint,
    checkpoint_problem,
    checkpoints_newest_first,
    remove_dead_staging,
)
from pacs.train.preflight import check_built_model, check_run_inputs

NODE_RECORD = "node_progress.json"
"""In each node's output_dir (nodes other than rank 0's): the newest checkpoint rank 0 wrote."""
SEGMENTS = "config_segments.jsonl"
"""In output_dir, once a resume changed settings: one line per stretch of steps trained with one
set of settings, {"from_step", "changes": {key: [before, after]}, "config"}, oldest first (the
first line, from step 1, with no changes)."""
NOT_OPTIMISATION = (
    "output_dir",
    "resume",
    "train.steps",
    "train.save_every",
    "train.keep_checkpoints",
    "train.eval_every",
    "train.eval_at_start",
    "train.strategy",
    "train.distributed_timeout_s",
    "train.gradient_checkpointing",
    "train.micro_batch_size",
    "train.micro_batch_tokens",
    "train.peak_flops",
    "train.save_rollouts",
    "train.traces_per_step",
    "train.report_to",
    "train.run_name",
    "train.wandb_project",
    "train.wandb_entity",
    "train.mlflow_experiment",
    "train.mlflow_tracking_uri",
    "data.val",
    "eval",
    "reward.num_workers",
    "reward.stop_after_failing_steps",
    "rollout.generation_batch_size",
    "rollout.vllm",
)
"""Dotted config keys (a section: every key in it) that change how a run is executed, logged,
saved or validated, not what it optimises: a resume may change them freely."""
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
"""How many times torchrun has restarted this job's workers (set by torchrun, 0 at first)."""


@dataclass(frozen=True)
class RunStart:
    """What `open_run` decided: the checkpoint to resume (None: from step 0) and its step."""

    checkpoint: Path | None = None
    step: int = 0
    finished: bool = False
    """The run already did `train.steps`: nothing is trained or written."""
    notes: list[str] = field(default_factory=list)
    """What rank 0 says before training: checkpoints skipped, a restart, an extension."""
    writer_host: str = ""
    """The host rank 0 runs on, named in the other nodes' records."""


def restarts() -> int:
    """How many times this node's torchrun agent restarted its workers (0: not restarted, or no
    torchrun). Agents count apart: after one node's failure, the others restart theirs at 0."""
    return int(os.environ.get(RESTART_COUNT) or 0)


@dataclass(frozen=True)
class JobHistory:
    """What every process knows of the job's past, gathered for rank 0's decision (`job_history`)."""

    node_records: list[tuple[str, dict | None]] = field(default_factory=list)
    """(`World.place`, its `NODE_RECORD` or None) of every node's first process."""
    restarts: int = 0
    """The most restarts any node's torchrun agent counts (`restarts`)."""


def job_history(world: World, output_dir: Path) -> JobHistory:
    """Every process's view of the job's past, on every rank (`JobHistory`)."""
    if world.world_size == 1:
        return JobHistory(restarts=restarts())
    record = read_node_record(output_dir) if world.local_rank == 0 else None
    views = gather_objects(world, (world.place, world.local_rank == 0, record, restarts()))
    return JobHistory([(place, record) for place, first, record, _ in views if first], max(count for *_, count in views))


def open_run(
    config: Config, past: JobHistory, *, allow_changes: bool = False, replace: bool = False
) -> tuple[RunStart, IO[str] | None]:
    """Rank 0's start of a run: every input checked (`check_run_inputs`); then, holding the claim
    of `output_dir` (`pacs.outputs.claiming`, so that no other pacs process moves, claims or locks
    it meanwhile), with `replace` (`--overwrite`) a previous run there moved aside, where the run
    starts decided (`run_start`), a resume's changed settings refused unless `allow_changes`
    (`setting_changes`), then, unless it is finished, `output_dir` claimed
    (`pacs.outputs.claim_output_dir`: a new, empty or own folder) and its run lock taken (returned
    beside the start, held until the run ends; None for a finished run or where locks are not
    supported); then what a killed save left removed, allowed changes recorded (`SEGMENTS`),
    `config.yaml` written. A live writer of `output_dir` is refused, naming it, at any point. The
    model is built first if it is a built-in one not yet cached or a GGUF file
    (`resolve_model_path`, into the cache: a build that fails leaves the disk as it was; outside
    the claim, which a conversion's minute would hold up) and checked (`check_built_model`)."""
    check_run_inputs(config)
    resolve_model_path(config.model.path)
    check_built_model(config)
    output_dir = Path(config.output_dir)
    decided, lock, aside = claim_run_folder(
        output_dir, "pacs train", lambda: _decided_start(config, past, allow_changes, fresh=replace), replace=replace
    )
    start, saved, changes = decided
    if aside is not None:
        start.notes.insert(0, f"the previous run in {output_dir} is now {aside}")
    if start.finished:
        return start, None
    notes = [*start.notes, *remove_dead_staging(output_dir / "checkpoints")]
    if changes:
        record_segment(output_dir, start.step, saved, config, changes)
        notes.append(
            f"settings changed from step {start.step + 1} on ("
            + "; ".join(f"{key}: {before!r} -> {after!r}" for key, (before, after) in changes.items())
            + f"), recorded in {output_dir / SEGMENTS}"
        )
    dump_config(config, output_dir / "config.yaml")
    return RunStart(start.checkpoint, start.step, False, notes, socket.gethostname()), lock


def _decided_start(
    config: Config, past: JobHistory, allow_changes: bool, *, fresh: bool
) -> tuple[tuple[RunStart, dict | None, dict[str, tuple[object, object]]], bool | None]:
    """((where the run starts, the run's saved settings, the settings it changes), whether it writes
    into what `output_dir` holds, None for a finished run, which writes nothing): `run_start` and the
    refusals of a resume's changed settings and of a run that cannot be resumed; reads only.
    `fresh`: the folder was just made for this run."""
    output_dir = Path(config.output_dir)
    start = run_start(config, past)
    if start.finished:
        return (start, None, {}), None
    saved = read_saved_config(output_dir) if start.checkpoint is not None else None
    changes = setting_changes(saved, config) if saved is not None else {}
    if changes and not allow_changes:
        raise ConfigError(
            f"{output_dir} was trained up to step {start.step} with other settings than these: "
            + "; ".join(f"{key}: {before!r} -> {after!r}" for key, (before, after) in changes.items())
            + ". Resume with the run's own settings (its config.yaml), or pass --allow-changes to go on with these "
            f"from step {start.step + 1} (recorded in {output_dir / SEGMENTS}, marked by pacs plot), or choose another "
            "output_dir"
        )
    reuse = fresh or config.resume == "auto" or past.restarts > 0
    if not reuse and start.checkpoint is None and (left := steps_without_checkpoint(output_dir)) is not None:
        if left:
            raise ConfigError(
                f"{output_dir} holds a run that finished {left} step{'s' * (left > 1)} but wrote no checkpoint "
                "(train.save_every=0 saves only at the end), so it cannot be resumed; pass --overwrite to move it "
                "aside and start over, or choose another output_dir"
            )
        reuse = True
        start.notes.append(f"{output_dir} holds a run that stopped before its first step ended: starting it again there")
    return (start, saved, changes), reuse


STOPPED_RUN_ENTRIES = {
    "config.yaml",
    "metrics.jsonl",
    "traces.jsonl",
    "tensorboard",
    "checkpoints",
    "rollouts",
    "wandb",
    "mlruns",
    RUN_LOCK,
    MARKER,
}
"""What a `pacs train` run that stopped without a checkpoint may leave in its output_dir."""


def steps_without_checkpoint(output_dir: Path) -> int | None:
    """How many steps the run in `output_dir` finished, when it is a `pacs train` run that
    stopped with no checkpoint (0: it stopped before its first step ended, so it can start again
    in place); None for anything else (no folder, another command's, files of other kinds)."""
    try:
        made_by_train = (output_dir / MARKER).read_text().strip() == "pacs train"
        entries = {entry.name for entry in output_dir.iterdir()}
    except OSError:
        return None
    if not made_by_train or not entries <= STOPPED_RUN_ENTRIES or checkpoints_newest_first(output_dir / "checkpoints"):
        return None
    try:
        lines = (output_dir / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        lines = []
    return sum(1 for line in lines if line.strip() and _logged_step(line) != 0)  # step 0: the validation before step 1


def _logged_step(line: str) -> object:
    """The step of a metrics line; None for a line cut short."""
    try:
        return json.loads(line).get("step")
    except ValueError:
        return None


def read_saved_config(output_dir: Path) -> dict | None:
    """The settings in the run's own `config.yaml` (None: none, or unreadable)."""
    try:
        saved = yaml.safe_load((output_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    return saved if isinstance(saved, dict) else None


def setting_changes(saved: dict, config: Config) -> dict[str, tuple[object, object]]:
    """Dotted key -> (saved value, `config`'s value) for every setting that changes the
    optimisation (not in `NOT_OPTIMISATION`) and differs; a key one side lacks reads as None."""
    return {
        key: values
        for key, values in _differences(saved, yaml.safe_load(yaml.safe_dump(config.model_dump()))).items()
        if not any(key == skip or key.startswith(skip + ".") for skip in NOT_OPTIMISATION)
    }


def _differences(before: dict, after: dict, prefix: str = "") -> dict[str, tuple[object, object]]:
    differences = {}
    for key in dict.fromkeys([*before, *after]):
        old, new = before.get(key), after.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            differences |= _differences(old, new, f"{prefix}{key}.")
        elif old != new:
            differences[f"{prefix}{key}"] = (old, new)
    return differences


def read_segments(output_dir: Path) -> list[dict]:
    """The lines of the run's `SEGMENTS` (none: [], a run trained with one set of settings)."""
    try:
        return [json.loads(line) for line in (Path(output_dir) / SEGMENTS).read_text().splitlines() if line]
    except FileNotFoundError:
        return []


def record_segment(output_dir: Path, step: int, saved: dict, config: Config, changes: dict) -> None:
    """Add to `SEGMENTS` that `config`'s settings hold from `step + 1` on (after a first line for
    the `saved` settings from step 1 when the file is new); lines of segments from a later step
    (a resume from an older checkpoint) are dropped, as their metrics are."""
    segments = [segment for segment in read_segments(output_dir) if segment["from_step"] <= step]
    if not segments:
        segments = [{"from_step": 1, "changes": {}, "config": saved}]
    segments.append(
        {"from_step": step + 1, "changes": {key: list(pair) for key, pair in changes.items()}, "config": config.model_dump()}
    )
    replace_file(output_dir / SEGMENTS, "".join(json.dumps(segment, default=str) + "\n" for segment in segments))


def run_start(config: Config, past: JobHistory) -> RunStart:
    """Where the run in `config.output_dir` starts, from what rank 0 finds on its disk and what
    the other processes know (`past`; see the module's table); raises `ConfigError` for the
    refusals. Reads only."""
    checkpoints_dir = Path(config.output_dir) / "checkpoints"
    found = checkpoints_newest_first(checkpoints_dir)
    check_no_lost_progress(past.node_records, found, checkpoints_dir)
    continues = config.resume == "auto" or past.restarts > 0
    if found and not continues:
        raise ConfigError(
            f"{checkpoints_dir} already holds the checkpoints of a run (up to step {found[0].step}); pass resume=auto "
            "to continue it, --overwrite to move it aside and start over, or choose another output_dir"
        )
    if not found or not continues:
        return RunStart()
    whole, notes = None, []
    for checkpoint in found:  # the newest whole one, every byte checked: one read of each candidate
        problem = checkpoint.problem or checkpoint_problem(checkpoint.path)
        if problem is None:
            whole = checkpoint
            break
        notes.append(f"{checkpoint.path} is damaged ({problem}): skipped")
    if whole is None:
        raise ConfigError(
            f"no checkpoint in {checkpoints_dir} can be resumed: "
            + "; ".join(notes)
            + ". Move them away to start over, or choose another output_dir"
        )
    steps = config.train.steps
    if whole.step > steps:
        raise ConfigError(
            f"{whole.path} is at step {whole.step}, past train.steps={steps}; pass train.steps={whole.step} or more "
            "to continue that run, or choose another output_dir"
        )
    if past.restarts:
        notes.append(f"torchrun restarted the job (restart {past.restarts}): it goes on from its newest checkpoint")
    if whole.path.name == FINAL:
        if whole.step == steps:
            return RunStart(whole.path, whole.step, finished=True, notes=[*notes, finished_note(config, whole)])
        notes.append(extension_note(config, whole))
    check_resumable(whole.path, config.model.lora_rank)
    return RunStart(whole.path, whole.step, notes=notes)


def finished_note(config: Config, final: FoundCheckpoint) -> str:
    return (
        f"{config.output_dir} already finished its {final.step} steps ({final.path}); nothing to do, nothing "
        "written. Raise train.steps to train it further"
    )


def extension_note(config: Config, final: FoundCheckpoint) -> str:
    """What extending a finished run does, and where it differs from a run of the new length."""
    note = f"{config.output_dir} finished {final.step} steps; extending it to {config.train.steps}"
    if config.train.lr_schedule != "constant":
        note += (
            f": train.lr_schedule={config.train.lr_schedule} follows the {config.train.steps} steps from step "
            f"{final.step + 1} on (steps 1-{final.step} took the {final.step}-step schedule's rates)"
        )
    return note


def check_resumable(checkpoint: Path, lora_rank: int) -> None:
    """Refuse to resume a LoRA run from a full-model checkpoint and the other way round."""
    has_adapter = (checkpoint / ADAPTER_DIR).is_dir()
    if has_adapter != (lora_rank > 0):
        written = "with LoRA (it holds adapter/)" if has_adapter else "without LoRA (no adapter/)"
        raise ConfigError(
            f"{checkpoint} was written {written} and cannot be resumed with model.lora_rank={lora_rank}; "
            "resume with the run's own model.lora_rank, or start a new output_dir from its merged weights "
            f"(model.path={checkpoint})"
        )


# ----- what other nodes know of the run --------------------------------------------------------


def read_node_record(output_dir: Path) -> dict | None:
    """This node's record of the run in `output_dir`, or None (none, or unreadable)."""
    try:
        return json.loads((output_dir / NODE_RECORD).read_text())
    except (OSError, ValueError):
        return None


def records_checkpoints(world: World) -> bool:
    """Whether this process keeps its node's record: the first process of a node other than rank 0's."""
    return world.local_rank == 0 and not world.is_writer


def claim_for_node_record(world: World, output_dir: Path) -> None:
    """On the process that keeps its node's record (`records_checkpoints`), claim this node's
    `output_dir` for it (`pacs.outputs.claim_output_dir`: refused, before training, if it holds
    files pacs did not write); nothing elsewhere."""
    if records_checkpoints(world):
        claim_output_dir(output_dir, "pacs train", reuse=True)


def record_checkpoint(output_dir: Path, checkpoint: str, step: int, writer_host: str) -> None:
    """Write this node's record that rank 0 (on `writer_host`) put `checkpoint` at `step` in place
    (atomically: a killed write leaves the previous record), in the output_dir it claimed."""
    record = {
        "step": step,
        "checkpoint": checkpoint,
        "written_on": writer_host,
        "recorded": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }
    replace_file(output_dir / NODE_RECORD, json.dumps(record))


def check_no_lost_progress(records: list[tuple[str, dict | None]], found: list[FoundCheckpoint], checkpoints_dir: Path) -> None:
    """Refuse a start when a node recorded a checkpoint newer than every one rank 0 finds (whole or
    damaged) in `checkpoints_dir`: rank 0 runs on a machine that did not write the run."""
    newest = max((checkpoint.step for checkpoint in found), default=0)
    for place, record in records:
        if record and int(record.get("step", 0)) > newest:
            has = f"checkpoints up to step {newest}" if found else "no checkpoint"
            raise ConfigError(
                f"{place} recorded that this run's rank 0 put checkpoints/{record.get('checkpoint')} (step "
                f"{record['step']}) in place on host {record.get('written_on')} ({record.get('recorded')}), but rank 0 "
                f"({socket.gethostname()}) finds {has} in {checkpoints_dir}: the machine that wrote them is not rank 0's "
                f"now. Copy that checkpoint into {checkpoints_dir} on rank 0's machine and resume=auto, or, to start "
                f"over, choose another output_dir (or delete {NODE_RECORD} from the output_dir of every node)"
            )
