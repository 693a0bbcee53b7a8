"""Several nodes that share nothing but the network: one torchrun agent per node, each in its own
working directory with its own model cache, on this machine, under the collective audit
(tests/helpers/collective_audit.py). Between them, the resume tests cover both strategies and both kinds
of checkpoint (full weights with PPO's critic, LoRA adapters) and both writers (one node, two
nodes), each launch costing seconds of start-up: FSDP with LoRA written by two nodes, DDP with
full weights and a critic written by one. Each run goes to step 3; its step-3 and final
checkpoints are then put aside, and the run resumed from step 2 must reach the same weights."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from killing import kill_job
from torchrun_jobs import AUDIT, EXACT, final_tensors, max_difference, process_env

from pacs.outputs import MARKER
from pacs.train.checkpointing.resume import NODE_RECORD

TWO_NODES = [
    "model.path=builtin:tiny",
    "model.dtype=float64",
    "output_dir=run",
    "rollout.n=4",
    "train.batch_size=8",
    "train.mini_batch_size=4",
    "train.save_every=1",
    "data.val=null",
    "reward.num_workers=0",
    "train.distributed_timeout_s=120",
]
"""Cheap runs (`builtin:tiny`, 8 prompts x 4 samples a step) in float64, each node in its own
working directory with its own model cache (`PACS_CACHE_DIR`) and a relative output_dir."""
FSDP_LORA = ["train.strategy=fsdp", "model.lora_rank=4"]
DDP_CRITIC = ["train.strategy=ddp", "algorithm.name=ppo"]
NODE_TIMEOUT_S = 360
RESUMED_FROM_STEP_2 = "resuming from run/checkpoints/step_2 (step 2)"
"""What node 0 prints when a run resumes from its step-2 checkpoint (an uninterrupted rerun would
reach the same weights, so the tests check that it resumed)."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def pacs_on_two_nodes(nodes: list[Path], *args: str) -> list[tuple[int, str]]:
    """(exit code, output) of one torchrun agent per node (`--nnodes 2`, one process each) running
    `pacs ARGS` under the collective audit, each in its own working directory with its own model
    cache, started together; a job that outlives `NODE_TIMEOUT_S` is killed and fails the test."""
    port = free_port()
    jobs, logs = [], []
    for node_rank, node in enumerate(nodes):
        node.mkdir(exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--node_rank",
            str(node_rank),
            "--nproc_per_node",
            "1",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(port),
            str(AUDIT),
            *args,
        ]
        env = {**process_env(), "PACS_CACHE_DIR": str(node / "cache")}
        logs.append(node.parent / f"{node.name}.log")
        with open(logs[-1], "w") as log:
            jobs.append(
                subprocess.Popen(command, cwd=node, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            )
    try:
        return [(job.wait(timeout=NODE_TIMEOUT_S), log.read_text()) for job, log in zip(jobs, logs)]
    finally:
        for job in jobs:
            if job.poll() is None:
                kill_job(job)  # its workers too: torchrun starts each in a session of its own


def train_on_two_nodes(nodes: list[Path], *overrides: str) -> str:
    """`pacs train` on two nodes; node 0's output."""
    outcomes = pacs_on_two_nodes(nodes, "train", *TWO_NODES, *overrides)
    for exit_code, output in outcomes:
        assert exit_code == 0, output[-4000:]
    return outcomes[0][1]


def train_on_one_node(directory: Path, *overrides: str) -> Path:
    """The run of 2 processes on one node, in `directory` with its own model cache: its output_dir."""
    directory.mkdir(exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "pacs.cli",
        "train",
        *TWO_NODES,
        *overrides,
    ]
    env = {**process_env(), "PACS_CACHE_DIR": str(directory / "cache")}
    subprocess.run(command, cwd=directory, env=env, check=True, capture_output=True, timeout=NODE_TIMEOUT_S)
    return directory / "run"


def rewind_to_step_2(run: Path, uninterrupted: Path, other_node_run: Path | None = None) -> None:
    """Move the final checkpoint of a finished 3-step `run` to `uninterrupted` and remove its
    step-3 checkpoint: `run` now holds the run as it was after step 2, and so does the other
    node's record of it (`other_node_run`, when it has one)."""
    (uninterrupted / "checkpoints").mkdir(parents=True)
    shutil.move(run / "checkpoints" / "final", uninterrupted / "checkpoints" / "final")
    shutil.rmtree(run / "checkpoints" / "step_3")
    if other_node_run is not None:
        record = json.loads((other_node_run / NODE_RECORD).read_text())
        (other_node_run / NODE_RECORD).write_text(json.dumps({**record, "step": 2, "checkpoint": "step_2"}))


def assert_same_final_weights(resumed: Path, uninterrupted: Path) -> None:
    resumed_tensors, expected = final_tensors(resumed), final_tensors(uninterrupted)
    assert resumed_tensors.keys() == expected.keys()
    assert max_difference(resumed_tensors, expected) <= EXACT


@pytest.mark.slow
def test_two_nodes_with_their_own_disks_checkpoint_on_node_0_resume_exactly_and_refuse_a_node_0_without_them(tmp_path):
    """FSDP with LoRA adapters: the checkpoint two nodes write (on node 0 alone; node 1 records
    which) resumes on two nodes; a node 0 whose disk lacks the run (a replaced machine) is refused,
    naming node 1's record, instead of starting the run over."""
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    train_on_two_nodes(nodes, *FSDP_LORA, "train.steps=3")
    assert sorted(path.name for path in (nodes[1] / "run").iterdir()) == [MARKER, NODE_RECORD]
    assert json.loads((nodes[1] / "run" / NODE_RECORD).read_text())["checkpoint"] == "final"
    rewind_to_step_2(nodes[0] / "run", tmp_path / "uninterrupted", nodes[1] / "run")
    assert RESUMED_FROM_STEP_2 in train_on_two_nodes(nodes, *FSDP_LORA, "train.steps=3", "resume=auto")
    assert_same_final_weights(nodes[0] / "run", tmp_path / "uninterrupted")

    (nodes[0] / "run").rename(tmp_path / "lost")
    for exit_code, output in pacs_on_two_nodes(nodes, "train", *TWO_NODES, *FSDP_LORA, "train.steps=3", "resume=auto"):
        assert exit_code != 0
        assert "node 1 (host" in output and "recorded that this run's rank 0 put checkpoints/final (step 3)" in output, output[
            -4000:
        ]
    assert not (nodes[0] / "run").exists()


@pytest.mark.slow
def test_a_checkpoint_one_node_wrote_resumes_on_two_nodes_from_rank_0s_disk_alone(tmp_path):
    """DDP with PPO's critic: a run of one node, stopped after step 2, goes on with a second node
    that has no copy of it (policy, critic and their optimizers from rank 0's disk alone)."""
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    rewind_to_step_2(train_on_one_node(nodes[0], *DDP_CRITIC, "train.steps=3"), tmp_path / "uninterrupted")
    assert RESUMED_FROM_STEP_2 in train_on_two_nodes(nodes, *DDP_CRITIC, "train.steps=3", "resume=auto")
    assert sorted(path.name for path in (nodes[1] / "run").iterdir()) == [MARKER, NODE_RECORD]  # no checkpoint
    assert_same_final_weights(nodes[0] / "run", tmp_path / "uninterrupted")


@pytest.mark.slow
def test_a_node_without_the_data_file_stops_every_node_with_one_error_naming_it(tmp_path):
    from pacs.data.loading import load_rows

    nodes = [tmp_path / "node0", tmp_path / "node1"]
    nodes[0].mkdir()
    rows = load_rows("builtin:arithmetic?size=8", default_split="train")
    (nodes[0] / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    outcomes = pacs_on_two_nodes(nodes, "train", *TWO_NODES, "train.strategy=ddp", "train.steps=1", "data.train=train.jsonl")
    for exit_code, output in outcomes:
        assert exit_code != 0
        assert "node 1 (host" in output and "Data file train.jsonl does not exist" in output, output[-4000:]
        assert "at the same paths" in output
    assert not (nodes[0] / "run").exists()  # stopped before rank 0 claimed the output folder
