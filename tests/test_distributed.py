"""Data parallel and FSDP2 with 2 real processes (torchrun, gloo on CPU).

The exactness tests run `tests/distributed_update.py` under torchrun once per strategy (every case
in one launch) and compare each case's weights after one step with the same step in this process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from distributed_update import run_case
from killing import kill_once_checkpointed
from pacs.train.distributed import DistributedConfigError, World, communication_device

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
    """One thread per process; the tests' helpers importable, before any path already set."""
    paths = [str(WORKER.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(paths)}


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
def one_process_results(tiny_model_dir):
    cache: dict[str, tuple[dict[str, torch.Tensor], dict[str, float]]] = {}

    def results(case: str) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        if case not in cache:
            cache[case] = run_case(World.single(), str(tiny_model_dir), case)
        return cache[case]

    return results


@pytest.fixture(scope="module")
def one_process_weights(one_process_results):
    return lambda case: one_process_results(case)[0]


@pytest.fixture(scope="module")
def one_process_metrics(one_process_results):
    return lambda case: one_process_results(case)[1]


@pytest.fixture(scope="module")
def two_process_metrics(two_process_weights) -> dict[str, dict[str, float]]:
    """"strategy/case" -> the metrics 2 processes logged for every ddp and fsdp case."""
    return {
        f"{strategy}/{case}": json.loads((two_process_weights / strategy / f"{case}.json").read_text())
        for strategy, cases in (("ddp", DDP_CASES), ("fsdp", FSDP_CASES))
        for case in cases
    }


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


# ----- the one place for collectives --------------------------------------------------------------


@pytest.mark.parametrize(
    "backend_config, tensor_device, expected",
    [
        ("cuda:nccl", "cpu", "cuda:1"),
        ("cuda:nccl", "cuda:1", "cuda:1"),
        ("cpu:gloo,cuda:nccl", "cpu", "cpu"),
        ("cpu:gloo,cuda:gloo", "cpu", "cpu"),
        ("cuda:gloo", "cpu", "cuda:1"),
    ],
)
def test_a_collective_gets_its_tensor_on_a_device_the_backend_serves(backend_config, tensor_device, expected):
    assert communication_device(backend_config, torch.device(tensor_device), local_rank=1) == torch.device(expected)


def test_a_cpu_tensor_reaches_a_cuda_only_backend_through_the_one_place():
    """A gloo group registered for CUDA alone refuses CPU tensors as NCCL does ("No backend type
    associated with device type cpu"). `World.sum` moves the CPU counts its callers build to the
    CUDA device first: on a machine without CUDA that move is what fails, never the collective."""
    store = dist.HashStore()
    dist.init_process_group(backend="cuda:gloo", store=store, rank=0, world_size=1)
    try:
        counts = torch.tensor([3.0, 5.0], dtype=torch.float64)
        with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
            dist.all_reduce(counts.clone())  # the stand-in refuses CPU tensors
        world = World(rank=0, world_size=2, device=torch.device("cpu"), strategy="ddp")
        if torch.cuda.is_available():
            assert world.sum(counts).tolist() == [3.0, 5.0]
        else:
            with pytest.raises((RuntimeError, AssertionError)) as refused:
                world.sum(counts)
            assert "No backend type associated" not in str(refused.value)
            assert "CUDA" in str(refused.value) or "cuda" in str(refused.value)
    finally:
        dist.destroy_process_group()


# ----- end to end: `pacs train` under torchrun, every path a paper run takes -------------------------

AUDIT = WORKER.with_name("collective_audit.py")
ACCEPTANCE = [
    "rollout.n=4",
    "train.steps=4",
    "train.batch_size=8",
    "train.mini_batch_size=4",
    "train.save_every=1",
    "train.save_rollouts=true",
    "train.eval_every=2",
    "data.val=builtin:arithmetic?size=6&split=val&max_operand=19",
    "eval.n=2",
    "reward.num_workers=0",
    "train.distributed_timeout_s=120",
]
PATHS = {
    "ppo-warmup-kl-bf16-checkpointing": [
        "algorithm.name=ppo", "critic.warmup_steps=1", "algorithm.kl_coef=0.05",
        "model.dtype=bfloat16", "train.gradient_checkpointing=true",
    ],
    "pacs-lora-kl": ["model.lora_rank=8", "algorithm.kl_coef=0.05", "algorithm.kl_estimator=k2"],
}
"""Between them: validation, checkpoints every step, PPO with critic warmup, the KL reference,
LoRA, bf16 mixed precision and activation checkpointing; every run also resumes after kill -9."""


def train_command(output_dir: Path, model_dir: Path, *overrides: str) -> list[str]:
    return ["-m", "pacs.cli", "train", f"model.path={model_dir}", f"output_dir={output_dir}", *ACCEPTANCE, *overrides]


def audited_train(output_dir: Path, model_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """`pacs train` on 2 processes under `collective_audit.py` (fails on any collective that
    pacs calls outside `pacs.train.distributed`), within a timeout: a hang fails the test."""
    return torchrun(str(AUDIT), *train_command(output_dir, model_dir, *overrides)[2:], timeout=360)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def final_tensors(output_dir: Path) -> dict[str, torch.Tensor]:
    """Every file of tensors of the final checkpoint: policy, critic and adapter, by file."""
    final = output_dir / "checkpoints" / "final"
    return {
        f"{path.relative_to(final)}:{key}": value
        for path in sorted(final.rglob("*.safetensors"))
        for key, value in load_file(str(path)).items()
    }


@pytest.fixture(scope="module", params=[(strategy, path) for strategy in ("ddp", "fsdp") for path in PATHS])
def uninterrupted_run(request, tmp_path_factory, warm_model_dir):
    """(strategy, path, output_dir, overrides) of a finished 2-process run."""
    strategy, path = request.param
    output_dir = tmp_path_factory.mktemp(f"{strategy}-{path}")
    overrides = (f"train.strategy={strategy}", *PATHS[path])
    result = audited_train(output_dir, warm_model_dir, *overrides)
    return strategy, path, output_dir, overrides, result


def test_a_two_process_run_shares_the_prompts_and_writes_once(uninterrupted_run):
    from transformers import AutoModelForCausalLM

    strategy, path, output_dir, _, result = uninterrupted_run
    assert result.stdout.count("final checkpoint") == 1
    rollouts = read_jsonl(output_dir / "rollouts" / "step_1.jsonl")
    assert len(rollouts) == 32 and {row["rank"] for row in rollouts} == {0, 1}
    prompts_by_rank = {rank: {json.dumps(row["prompt"]) for row in rollouts if row["rank"] == rank} for rank in (0, 1)}
    assert len(prompts_by_rank[0]) == len(prompts_by_rank[1]) == 4 and not prompts_by_rank[0] & prompts_by_rank[1]
    metrics = read_jsonl(output_dir / "metrics.jsonl")
    assert [line["step"] for line in metrics] == [1, 2, 3, 4]
    for line in metrics:
        step_rewards = [row["reward"] for row in read_jsonl(output_dir / "rollouts" / f"step_{line['step']}.jsonl")]
        assert line["reward/mean"] == pytest.approx(sum(step_rewards) / len(step_rewards), abs=1e-12)
    assert AutoModelForCausalLM.from_pretrained(output_dir / "checkpoints" / "final").config.model_type == "qwen2"


def test_a_two_process_run_validates_every_problem_on_its_schedule(uninterrupted_run):
    _, _, output_dir, _, _ = uninterrupted_run
    validated = [line for line in read_jsonl(output_dir / "metrics.jsonl") if "val/arithmetic/pass@1" in line]
    assert [line["step"] for line in validated] == [2, 4]
    for line in validated:  # 6 problems x 2 samples: pass@1 is a multiple of 1/12
        assert line["val/arithmetic/pass@1"] * 12 == pytest.approx(round(line["val/arithmetic/pass@1"] * 12), abs=1e-9)


def test_a_killed_two_process_run_resumes_to_the_uninterrupted_weights_exactly(uninterrupted_run, tmp_path, warm_model_dir):
    strategy, path, straight, overrides, _ = uninterrupted_run
    killed = tmp_path / "killed"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               *train_command(killed, warm_model_dir, *overrides)]
    job = subprocess.Popen(command, env=process_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    kill_once_checkpointed(job, killed)

    audited_train(killed, warm_model_dir, *overrides, "resume=auto")
    assert [line["step"] for line in read_jsonl(killed / "metrics.jsonl")] == [1, 2, 3, 4]
    resumed, expected = final_tensors(killed), final_tensors(straight)
    assert resumed.keys() == expected.keys()
    assert max_difference(resumed, expected) == 0.0


def test_two_processes_log_the_one_process_metrics(two_process_metrics, one_process_metrics):
    for name, metrics in two_process_metrics.items():
        case = name.split("/", 1)[1]
        expected = one_process_metrics(case)
        assert metrics.keys() == expected.keys()
        for key, value in expected.items():
            if key != "critic/explained_variance":  # a ratio of variances: approximated across ranks
                assert metrics[key] == pytest.approx(value, rel=1e-9, abs=1e-12), (name, key)


@pytest.fixture(scope="module")
def fsdp_checks(tmp_path_factory, tiny_model_dir) -> dict:
    out = tmp_path_factory.mktemp("fsdp-checks") / "checks.json"
    torchrun(str(WORKER.with_name("distributed_checks.py")), str(tiny_model_dir), str(out))
    return json.loads(out.read_text())


def test_fsdp_reads_the_model_on_rank_0_alone_and_fills_every_shard_exactly(fsdp_checks):
    assert fsdp_checks["loads_per_rank"] == [1, 0]
    skeleton, on_disk = fsdp_checks["parameters_of_skeleton_and_disk"]
    assert skeleton == on_disk  # tied input and output embeddings stay one parameter
    assert fsdp_checks["loaded_max_difference"] == 0.0


def test_a_decision_that_fails_on_rank_0_raises_on_every_rank(fsdp_checks):
    assert fsdp_checks["errors_of_a_failed_decision"] == ["FileNotFoundError", "FileNotFoundError"]


def test_fsdp_keeps_gradients_and_the_reference_sharded_and_its_root_gathered(fsdp_checks):
    seen = fsdp_checks
    assert seen["all_gathers_per_forward_after_generation"] == seen["all_gathers_per_forward_before"]
    assert seen["sharded_gradients_between_micro_batches"]
    assert seen["reference_sharded"]


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


# ----- several nodes that share nothing but the network ------------------------------------------

TWO_NODES = ["model.path=builtin:tiny", "output_dir=run", "train.strategy=fsdp", "rollout.n=4", "train.batch_size=8",
             "train.mini_batch_size=4", "train.save_every=1", "data.val=null", "reward.num_workers=0",
             "train.distributed_timeout_s=120"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def train_on_two_nodes(nodes: list[Path], *overrides: str) -> None:
    """One torchrun agent per node (`--nnodes 2`, one process each), each in its own working
    directory with its own empty model cache, started together; both must finish."""
    port = free_port()
    jobs = []
    for node_rank, node in enumerate(nodes):
        node.mkdir(exist_ok=True)
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node_rank),
                   "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port),
                   "-m", "pacs.cli", "train", *TWO_NODES, *overrides]
        env = {**process_env(), "PACS_CACHE_DIR": str(node / "cache")}
        jobs.append(subprocess.Popen(command, cwd=node, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [job.communicate(timeout=360)[0] for job in jobs]
    for job, output in zip(jobs, outputs):
        assert job.returncode == 0, output[-4000:]


def test_two_nodes_with_their_own_disks_resume_to_the_weights_of_one_node(tmp_path):
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    train_on_two_nodes(nodes, "train.steps=2")
    assert not (nodes[1] / "run").exists()  # rank 1 writes nothing; the checkpoint is on node 0 alone
    train_on_two_nodes(nodes, "train.steps=3", "resume=auto")

    one_node = tmp_path / "one-node"
    one_node.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "pacs.cli", "train", *TWO_NODES, "train.steps=3"]
    env = {**process_env(), "PACS_CACHE_DIR": str(one_node / "cache")}
    subprocess.run(command, cwd=one_node, env=env, check=True, capture_output=True, timeout=360)
    resumed = final_tensors(nodes[0] / "run")
    assert resumed.keys() == final_tensors(one_node / "run").keys()
    assert max_difference(resumed, final_tensors(one_node / "run")) == 0.0
