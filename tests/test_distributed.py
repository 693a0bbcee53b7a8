"""Data parallel and FSDP2 with 2 real processes (torchrun, gloo on CPU).

The exactness tests run `tests/distributed_update.py` under torchrun once (every strategy and case,
and `tests/distributed_checks.py`'s checks, in one launch: each launch pays seconds of start-up)
and compare each case's weights after one step with the same step in this process.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from distributed_update import run_case
from killing import kill_job, kill_once_checkpointed
from running import run
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
    """Directory per mode ("ddp", "fsdp", "ddp-local-totals") of CASE.safetensors from 2 processes,
    and checks.json of `distributed_checks.observe`: every mode and the checks in one launch."""
    out = tmp_path_factory.mktemp("two-process")
    torchrun(str(WORKER), str(tiny_model_dir), str(out), "ddp", *DDP_CASES, *LORA_CASES, "fsdp", *FSDP_CASES,
             *LORA_CASES, "ddp-local-totals", *LOCAL_TOTALS_CASES, "--checks", str(out / "checks.json"),
             timeout=1200)  # the four launches' limits it replaces, 300 s each: a busy machine slows it alike
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


RUNS = [(strategy, path) for strategy in ("ddp", "fsdp") for path in PATHS]
KILLED_RUNS = [("fsdp", "ppo-warmup-kl-bf16-checkpointing"), ("ddp", "pacs-lora-kl")]
"""The runs that are also killed and resumed here: FSDP with a critic, bf16 and activation
checkpointing, and DDP with LoRA; FSDP with LoRA and DDP without resume on two nodes (below)."""


def run_id(run: tuple[str, str]) -> str:
    return "-".join(run)


@pytest.fixture(scope="module")
def finished_runs(tmp_path_factory, warm_model_dir):
    """(strategy, path) -> (output_dir, overrides, result) of a finished 2-process run, made on
    first use and then shared by every test that asks for it."""
    runs = {}

    def finished(strategy: str, path: str):
        if (strategy, path) not in runs:
            output_dir = tmp_path_factory.mktemp(f"{strategy}-{path}")
            overrides = (f"train.strategy={strategy}", *PATHS[path])
            runs[strategy, path] = output_dir, overrides, audited_train(output_dir, warm_model_dir, *overrides)
        return runs[strategy, path]

    return finished


@pytest.fixture(params=RUNS, ids=run_id)
def uninterrupted_run(request, finished_runs):
    """(strategy, path, output_dir, overrides, result) of a finished 2-process run."""
    strategy, path = request.param
    return strategy, path, *finished_runs(strategy, path)


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_two_process_run_validates_every_problem_on_its_schedule(uninterrupted_run):
    _, _, output_dir, _, _ = uninterrupted_run
    validated = [line for line in read_jsonl(output_dir / "metrics.jsonl") if "val/arithmetic/pass@1" in line]
    assert [line["step"] for line in validated] == [2, 4]
    for line in validated:  # 6 problems x 2 samples: pass@1 is a multiple of 1/12
        assert line["val/arithmetic/pass@1"] * 12 == pytest.approx(round(line["val/arithmetic/pass@1"] * 12), abs=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("run", KILLED_RUNS, ids=run_id)
def test_a_killed_two_process_run_resumes_to_the_uninterrupted_weights_exactly(run, finished_runs, tmp_path, warm_model_dir):
    straight, overrides, _ = finished_runs(*run)
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
def fsdp_checks(two_process_weights) -> dict:
    """What `distributed_checks.observe` saw, in the exactness tests' launch."""
    return json.loads((two_process_weights / "checks.json").read_text())


def test_fsdp_reads_the_model_on_rank_0_alone_and_fills_every_shard_exactly(fsdp_checks):
    assert fsdp_checks["loads_per_rank"] == [1, 0]
    skeleton, on_disk = fsdp_checks["parameters_of_skeleton_and_disk"]
    assert skeleton == on_disk  # tied input and output embeddings stay one parameter
    assert fsdp_checks["loaded_max_difference"] == 0.0


def test_ddp_reads_the_model_on_rank_0_alone_and_keeps_tied_weights_tied(fsdp_checks):
    loaded = fsdp_checks["ddp_loaded"]
    assert loaded["loads_per_rank"] == [1, 0]
    assert loaded["tied"]  # otherwise DDP trains the output embedding apart from the input one
    assert loaded["max_difference"] == 0.0


def test_a_decision_that_fails_on_rank_0_raises_on_every_rank(fsdp_checks):
    assert fsdp_checks["errors_of_a_failed_decision"] == ["FileNotFoundError", "FileNotFoundError"]


def test_a_failure_on_one_rank_stops_every_rank_with_one_error_naming_it(fsdp_checks):
    first, second = fsdp_checks["errors_of_a_failure_on_rank_1"]
    assert first == second
    assert first.startswith("1 of 2 processes could not go on:\nnode 0 (host ")  # torchrun --standalone: one node
    assert "rank 1: FileNotFoundError:" in first and "no-such-file" in first and "rank 0:" not in first


def test_fsdp_keeps_gradients_and_the_reference_sharded_and_its_root_gathered(fsdp_checks):
    seen = fsdp_checks
    assert seen["all_gathers_per_forward_after_generation"] == seen["all_gathers_per_forward_before"]
    assert seen["sharded_gradients_between_micro_batches"]
    assert seen["reference_sharded"]


@pytest.mark.slow
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


# ----- `pacs eval` under torchrun ------------------------------------------------------------------

EVAL = ["--data", "builtin:arithmetic?max_operand=19&size=24&split=val", "-n", "4", "--max-tokens", "16",
        "--reward-workers", "0"]
"""`-n`, not `--n`: torchrun's own parser would take `--n` for an abbreviation of its options."""


def samples_by_problem(out: Path) -> dict[tuple[str, int], list[int]]:
    """(data_source, index) -> the sample numbers `pacs eval` wrote for it, sorted."""
    samples = defaultdict(list)
    for record in read_jsonl(out / "eval_rollout.jsonl"):
        samples[(record["data_source"], record["index"])].append(record["sample"])
    return {problem: sorted(numbers) for problem, numbers in samples.items()}


@pytest.mark.slow
def test_two_processes_evaluate_every_problem_once_with_its_samples_and_agree_with_one(tmp_path, warm_model_dir):
    one, two = tmp_path / "one", tmp_path / "two"
    assert run(["eval", "--model", str(warm_model_dir), *EVAL, "--out", str(one)]) == 0
    torchrun("-m", "pacs.cli", "eval", "--model", str(warm_model_dir), *EVAL, "--out", str(two))

    problems = samples_by_problem(one)
    assert len(problems) == 24 and all(numbers == [0, 1, 2, 3] for numbers in problems.values())
    assert samples_by_problem(two) == problems
    reports = [json.loads((out / "eval_metrics.json").read_text())["data_sources"]["arithmetic"] for out in (one, two)]
    assert reports[0]["problems"] == reports[1]["problems"] == 24
    # Sampling noise of pass@1 (a mean over P problems of c_i / n): variance sum_i p_i (1 - p_i) / n / P^2 per run,
    # p_i pooled over both runs; the two runs sample independently.
    correct = defaultdict(int)
    for out in (one, two):
        for record in read_jsonl(out / "eval_rollout.jsonl"):
            correct[record["index"]] += record["score"] == 1.0
    pooled = [count / 8 for count in correct.values()]
    standard_error = math.sqrt(2 * sum(p * (1 - p) for p in pooled) / 4) / 24
    assert abs(reports[1]["pass@k"]["pass@1"] - reports[0]["pass@k"]["pass@1"]) <= 4 * standard_error + 1e-12


# ----- several nodes that share nothing but the network ------------------------------------------

TWO_NODES = ["model.path=builtin:tiny", "model.dtype=float64", "output_dir=run", "rollout.n=4", "train.batch_size=8",
             "train.mini_batch_size=4", "train.save_every=1", "data.val=null", "reward.num_workers=0",
             "train.distributed_timeout_s=120"]
"""Cheap runs (`builtin:tiny`, 8 prompts x 4 samples a step) in float64, each node in its own
working directory with its own model cache (`PACS_CACHE_DIR`) and a relative output_dir."""
NODE_TIMEOUT_S = 360


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def pacs_on_two_nodes(nodes: list[Path], *args: str) -> list[tuple[int, str]]:
    """(exit code, output) of one torchrun agent per node (`--nnodes 2`, one process each), each
    in its own working directory with its own model cache, started together; a job that outlives
    `NODE_TIMEOUT_S` is killed and fails the test."""
    port = free_port()
    jobs, logs = [], []
    for node_rank, node in enumerate(nodes):
        node.mkdir(exist_ok=True)
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node_rank),
                   "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port),
                   "-m", "pacs.cli", *args]
        env = {**process_env(), "PACS_CACHE_DIR": str(node / "cache")}
        logs.append(node.parent / f"{node.name}.log")
        with open(logs[-1], "w") as log:
            jobs.append(subprocess.Popen(command, cwd=node, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True))
    try:
        return [(job.wait(timeout=NODE_TIMEOUT_S), log.read_text()) for job, log in zip(jobs, logs)]
    finally:
        for job in jobs:
            if job.poll() is None:
                kill_job(job)  # its workers too: torchrun starts each in a session of its own


def train_on_two_nodes(nodes: list[Path], *overrides: str) -> None:
    for exit_code, output in pacs_on_two_nodes(nodes, "train", *TWO_NODES, *overrides):
        assert exit_code == 0, output[-4000:]


def train_on_one_node(directory: Path, *overrides: str) -> Path:
    """The run of 2 processes on one node, in `directory` with its own model cache: its output_dir."""
    directory.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "pacs.cli", "train", *TWO_NODES, *overrides]
    env = {**process_env(), "PACS_CACHE_DIR": str(directory / "cache")}
    subprocess.run(command, cwd=directory, env=env, check=True, capture_output=True, timeout=NODE_TIMEOUT_S)
    return directory / "run"


@pytest.mark.slow
def test_two_nodes_with_their_own_disks_resume_to_the_weights_of_one_node(tmp_path):
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    train_on_two_nodes(nodes, "train.strategy=fsdp", "train.steps=2")
    assert not (nodes[1] / "run").exists()  # rank 1 writes nothing; the checkpoint is on node 0 alone
    train_on_two_nodes(nodes, "train.strategy=fsdp", "train.steps=3", "resume=auto")

    one_node = train_on_one_node(tmp_path / "one-node", "train.strategy=fsdp", "train.steps=3")
    resumed, expected = final_tensors(nodes[0] / "run"), final_tensors(one_node)
    assert resumed.keys() == expected.keys()
    assert max_difference(resumed, expected) <= EXACT


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy", [["train.strategy=ddp"], ["train.strategy=fsdp", "model.lora_rank=4"]], ids=["ddp", "fsdp-lora"]
)
def test_a_checkpoint_on_rank_0s_disk_alone_resumes_on_two_nodes(strategy, tmp_path):
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    straight = train_on_one_node(nodes[0], *strategy, "train.steps=3")
    uninterrupted = tmp_path / "uninterrupted"
    (uninterrupted / "checkpoints").mkdir(parents=True)
    shutil.move(straight / "checkpoints" / "final", uninterrupted / "checkpoints" / "final")
    shutil.rmtree(straight / "checkpoints" / "step_3")  # node 0 now holds the run as it was after step 2
    train_on_two_nodes(nodes, *strategy, "train.steps=3", "resume=auto")
    assert not (nodes[1] / "run").exists()
    resumed, expected = final_tensors(nodes[0] / "run"), final_tensors(uninterrupted)
    assert resumed.keys() == expected.keys()
    assert max_difference(resumed, expected) <= EXACT


@pytest.mark.slow
def test_a_node_without_the_data_file_stops_every_node_with_one_error_naming_it(tmp_path):
    from pacs.data.loading import load_rows

    nodes = [tmp_path / "node0", tmp_path / "node1"]
    nodes[0].mkdir()
    rows = load_rows("builtin:arithmetic?size=8", default_split="train")
    (nodes[0] / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    outcomes = pacs_on_two_nodes(nodes, "train", *TWO_NODES, "train.strategy=ddp", "train.steps=1",
                                 "data.train=train.jsonl")
    for exit_code, output in outcomes:
        assert exit_code != 0
        assert "node 1 (host" in output and "Data file train.jsonl does not exist" in output, output[-4000:]
        assert "at the same paths" in output
    assert not (nodes[0] / "run").exists()  # stopped before rank 0 claimed the output folder
