"""Data parallel and FSDP2 with 2 real processes (torchrun, gloo on CPU).

The exactness tests run `tests/distributed_update.py` under torchrun once per strategy (every case
in one launch) and compare each case's weights after one step with the same step in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from distributed_update import run_case
from killing import kill_once_checkpointed
from pacs.train.distributed import DistributedConfigError, World

WORKER = Path(__file__).with_name("distributed_update.py")
ALGORITHMS = ("pacs", "grpo", "rloo", "ppo")
LOSS_AGGS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
DDP_CASES = [f"{name}:{agg}" for name in ALGORITHMS for agg in LOSS_AGGS]
FSDP_CASES = [f"{name}:{agg}" for name, agg in zip(ALGORITHMS, LOSS_AGGS)]
EXACT = 1e-9
"""Largest weight difference accepted between 2 processes and 1 (float64)."""
LORA_CASES = ["pacs:token-mean:lora", "ppo:seq-mean-token-sum-norm:lora"]
LOCAL_TOTALS_CASES = ["pacs:token-mean", "pacs:seq-mean-token-sum-norm", "grpo:seq-mean-token-sum", "ppo:seq-mean-token-mean"]


def torchrun(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node 2 ARGS` with one thread per process; raises with
    the output when it fails."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args]
    result = subprocess.run(command, env=process_env(), capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}")
    return result


def process_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(WORKER.parent)}


@pytest.fixture(scope="module")
def two_process_weights(tiny_model_dir, tmp_path_factory):
    """Directory per mode ("ddp", "fsdp", "ddp-local-totals") of CASE.safetensors from 2 processes."""
    out = tmp_path_factory.mktemp("two-process")
    runs = {
        "ddp": ("ddp", DDP_CASES + LORA_CASES, []),
        "fsdp": ("fsdp", FSDP_CASES + LORA_CASES, []),
        "ddp-local-totals": ("ddp", LOCAL_TOTALS_CASES, ["--local-totals"]),
    }
    for mode, (strategy, cases, flags) in runs.items():
        torchrun(str(WORKER), str(tiny_model_dir), str(out / mode), strategy, *cases, *flags)
    return out


def max_difference(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> float:
    assert first.keys() == second.keys()
    return max(float((first[key] - second[key]).abs().max()) for key in first)


@pytest.fixture(scope="module")
def one_process_weights(tiny_model_dir):
    cache: dict[str, dict[str, torch.Tensor]] = {}

    def weights(case: str) -> dict[str, torch.Tensor]:
        if case not in cache:
            cache[case] = run_case(World.single(), str(tiny_model_dir), case)
        return cache[case]

    return weights


@pytest.mark.parametrize("case", DDP_CASES)
def test_two_ddp_processes_update_exactly_like_one(case, two_process_weights, one_process_weights, tiny_model_dir):
    expected = one_process_weights(case)
    initial = load_file(str(tiny_model_dir / "model.safetensors"))
    assert max(float((expected[key] - initial[key]).abs().max()) for key in initial) > 1e-3  # the step moved the weights
    assert max_difference(load_file(str(two_process_weights / "ddp" / f"{case}.safetensors")), expected) <= EXACT


@pytest.mark.parametrize("case", FSDP_CASES)
def test_two_fsdp_processes_update_exactly_like_one(case, two_process_weights, one_process_weights):
    got = load_file(str(two_process_weights / "fsdp" / f"{case}.safetensors"))
    assert max_difference(got, one_process_weights(case)) <= EXACT


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("case", LORA_CASES)
def test_two_processes_update_lora_adapters_exactly_like_one(case, strategy, two_process_weights, one_process_weights):
    expected = one_process_weights(case)
    moved = [key for key in expected if "lora_B" in key and float(expected[key].abs().max()) > 1e-3]
    assert moved  # the step trained the adapters (B starts at 0)
    got = load_file(str(two_process_weights / strategy / f"{case}.safetensors"))
    assert max_difference(got, expected) <= EXACT


@pytest.mark.parametrize("case", LOCAL_TOTALS_CASES)
def test_the_exactness_check_catches_per_rank_normalisation(case, two_process_weights, one_process_weights):
    got = load_file(str(two_process_weights / "ddp-local-totals" / f"{case}.safetensors"))
    assert max_difference(got, one_process_weights(case)) > EXACT


def test_a_mini_batch_that_cannot_be_split_evenly_is_refused():
    world = World(rank=0, world_size=2, device=torch.device("cpu"), strategy="ddp")
    with pytest.raises(DistributedConfigError, match=r"train.mini_batch_size=3 prompts cannot be split evenly across 2 processes"):
        world.check_divisible(6, 3)


def test_each_rank_takes_its_slice_of_every_mini_batch():
    prompts = list(range(8))
    shares = [World(rank=r, world_size=2, device=torch.device("cpu"), strategy="ddp").shard_prompts(prompts, 4) for r in (0, 1)]
    assert shares == [[0, 1, 4, 5], [2, 3, 6, 7]]


# ----- end to end: `pacs train` under torchrun ------------------------------------------------------

ACCEPTANCE = [
    "rollout.n=4",
    "train.steps=3",
    "train.batch_size=8",
    "train.mini_batch_size=4",
    "train.save_rollouts=true",
    "data.val=null",
    "reward.num_workers=0",
]


def train_command(output_dir: Path, model_dir: Path, *overrides: str) -> list[str]:
    return ["-m", "pacs.cli", "train", f"model.path={model_dir}", f"output_dir={output_dir}", *ACCEPTANCE, *overrides]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(
    "options",
    [
        ["train.strategy=ddp"],
        ["train.strategy=fsdp"],
        ["train.strategy=fsdp", "model.dtype=bfloat16", "train.gradient_checkpointing=true"],
        ["train.strategy=ddp", "model.dtype=bfloat16", "train.gradient_checkpointing=true"],
    ],
    ids=["ddp", "fsdp", "fsdp-bf16-checkpointing", "ddp-bf16-checkpointing"],
)
def test_two_process_training_shares_the_prompts_and_writes_once(options, tmp_path, warm_model_dir):
    from transformers import AutoModelForCausalLM

    result = torchrun(*train_command(tmp_path, warm_model_dir, *options))
    assert result.stdout.count("final checkpoint") == 1

    rollouts = read_jsonl(tmp_path / "rollouts" / "step_1.jsonl")
    assert len(rollouts) == 32 and {row["rank"] for row in rollouts} == {0, 1}
    prompts_by_rank = {rank: {json.dumps(row["prompt"]) for row in rollouts if row["rank"] == rank} for rank in (0, 1)}
    assert len(prompts_by_rank[0]) == len(prompts_by_rank[1]) == 4 and not prompts_by_rank[0] & prompts_by_rank[1]

    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert [line["step"] for line in metrics] == [1, 2, 3]
    for line in metrics:
        step_rewards = [row["reward"] for row in read_jsonl(tmp_path / "rollouts" / f"step_{line['step']}.jsonl")]
        assert line["reward/mean"] == pytest.approx(sum(step_rewards) / len(step_rewards), abs=1e-12)
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoints" / "final")
    assert final.config.model_type == "qwen2"
    assert {value.dtype for value in load_file(str(tmp_path / "checkpoints" / "final" / "model.safetensors")).values()} == {torch.float32}


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_process_lora_training_writes_the_merged_model_and_the_adapter(strategy, tmp_path, warm_model_dir):
    from transformers import AutoModelForCausalLM

    lora = ["model.lora_rank=8", "model.dtype=bfloat16", "train.gradient_checkpointing=true", "algorithm.kl_coef=0.05",
            "algorithm.kl_estimator=k2", "train.steps=2"]
    torchrun(*train_command(tmp_path, warm_model_dir, f"train.strategy={strategy}", *lora))
    final = tmp_path / "checkpoints" / "final"
    assert AutoModelForCausalLM.from_pretrained(final).config.model_type == "qwen2"
    adapter = load_file(str(final / "adapter" / "adapter_model.safetensors"))
    assert {value.dtype for value in adapter.values()} == {torch.float32}  # trained in fp32 on a bf16 base
    assert any(float(value.abs().max()) > 0 for name, value in adapter.items() if "lora_B" in name)


def test_a_killed_fsdp_job_resumes_to_the_weights_of_an_uninterrupted_one(tmp_path, warm_model_dir):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    options = ("train.strategy=fsdp", "train.steps=4", "train.save_every=1")
    torchrun(*train_command(straight, warm_model_dir, *options))

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               *train_command(killed, warm_model_dir, *options)]
    job = subprocess.Popen(command, env=process_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    kill_once_checkpointed(job, killed)

    torchrun(*train_command(killed, warm_model_dir, *options, "resume=auto"))
    assert [line["step"] for line in read_jsonl(killed / "metrics.jsonl")] == [1, 2, 3, 4]
    resumed = load_file(str(killed / "checkpoints" / "final" / "model.safetensors"))
    expected = load_file(str(straight / "checkpoints" / "final" / "model.safetensors"))
    assert max_difference(resumed, expected) <= 1e-6


def test_a_failing_rank_ends_the_job_with_its_error(tmp_path, warm_model_dir):
    (tmp_path / "rank_one_fails.py").write_text(
        "import os\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if os.environ['RANK'] == '1':\n"
        "        raise RuntimeError('verifier broke on rank 1')\n"
        "    return 0.0\n"
    )
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               *train_command(tmp_path / "run", warm_model_dir, "reward.function=rank_one_fails:compute_score")]
    env = {**process_env(), "PYTHONPATH": f"{tmp_path}{os.pathsep}{WORKER.parent}"}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "verifier broke on rank 1" in result.stderr
