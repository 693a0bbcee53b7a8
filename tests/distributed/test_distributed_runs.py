"""`pacs train` and `pacs eval` under torchrun with 2 real processes: every path a paper run takes,
kill -9 and resume, a failing rank, and evaluation split across processes."""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
from killing import kill_a_worker_once_checkpointed, kill_job, kill_once_checkpointed
from running import run
from torchrun_jobs import (
    AUDIT,
    TESTS,
    final_tensors,
    max_difference,
    process_env,
    read_jsonl,
    tensorboard_steps,
    torchrun,
    torchrun_command,
)

from pacs.distributed.world import SEPARATE_STORES

ACCEPTANCE = [
    "rollout.n=4",
    "train.steps=3",
    "train.batch_size=8",
    "train.mini_batch_size=4",
    "train.save_every=1",
    "train.save_rollouts=true",
    "train.eval_every=2",
    "train.eval_at_start=false",  # the validation before step 1 is tested in one process (test_train_loop)
    "data.val=builtin:arithmetic?size=6&split=val&max_operand=19",
    "eval.n=2",
    "reward.num_workers=0",
    "train.distributed_timeout_s=120",
]
PATHS = {
    "ppo-warmup-kl-bf16-checkpointing": [
        "algorithm.name=ppo",
        "critic.warmup_steps=1",
        "algorithm.kl_coef=0.05",
        "model.dtype=bfloat16",
        "train.gradient_checkpointing=true",
        "rollout.dynamic_sampling=true",
        "rollout.max_sampling_rounds=2",
        "train.reference_reset_every=2",
    ],
    "pacs-lora-kl": ["model.lora_rank=8", "algorithm.kl_coef=0.05", "algorithm.kl_estimator=k2"],
}
"""Between them: validation, checkpoints every step, PPO with critic warmup, the KL reference (and
its reset before step 3), LoRA, bf16 mixed precision, activation checkpointing and dynamic sampling
(its rounds decided over both ranks)."""


def train_command(output_dir: Path, model_dir: Path, *overrides: str) -> list[str]:
    return ["-m", "pacs.cli", "train", f"model.path={model_dir}", f"output_dir={output_dir}", *ACCEPTANCE, *overrides]


def audited_train(output_dir: Path, model_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """`pacs train` on 2 processes under `collective_audit.py` (fails on any collective that
    pacs calls outside `pacs.distributed`), within a timeout: a hang fails the test."""
    return torchrun(str(AUDIT), *train_command(output_dir, model_dir, *overrides)[2:], timeout=360)


RUNS = [("fsdp", "ppo-warmup-kl-bf16-checkpointing"), ("ddp", "pacs-lora-kl")]
"""Both strategies, both paths, each run also killed and resumed here, each launch costing seconds
of start-up. The other two pairings run audited in test_distributed_nodes.py: FSDP with LoRA on two
nodes, and DDP with PPO's critic resumed on two nodes from one node's checkpoint."""


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


OUTSIDE_THE_STEP = ("time/step_s", "time/validate_s", "time/checkpoint_s")


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
    assert [line["step"] for line in metrics] == [1, 2, 3]
    for line in metrics:
        step_rewards = [row["reward"] for row in read_jsonl(output_dir / "rollouts" / f"step_{line['step']}.jsonl")]
        assert line["reward/mean"] == pytest.approx(sum(step_rewards) / len(step_rewards), abs=1e-12)
        phases = [value for key, value in line.items() if key.startswith("time/") and key not in OUTSIDE_THE_STEP]
        assert sum(phases) == pytest.approx(line["time/step_s"], rel=1e-9)  # all the slowest rank's
    assert AutoModelForCausalLM.from_pretrained(output_dir / "checkpoints" / "final").config.model_type == "qwen2"


@pytest.mark.slow
def test_a_two_process_run_validates_every_problem_on_its_schedule(uninterrupted_run):
    _, _, output_dir, _, _ = uninterrupted_run
    validated = [line for line in read_jsonl(output_dir / "metrics.jsonl") if "val/arithmetic/pass@1" in line]
    assert [line["step"] for line in validated] == [2, 3]  # every 2 steps and the last
    for line in validated:  # 6 problems x 2 samples: pass@1 is a multiple of 1/12
        assert line["val/arithmetic/pass@1"] * 12 == pytest.approx(round(line["val/arithmetic/pass@1"] * 12), abs=1e-9)


@pytest.mark.slow
def test_a_two_process_run_samples_dynamically_and_resets_its_reference(finished_runs):
    """Both ranks draw the same number of rounds (or the FSDP run would hang in generation) and
    reset the sharded reference before step 3, which the checkpoints then hold."""
    output_dir, _, _ = finished_runs(*RUNS[0])
    metrics = read_jsonl(output_dir / "metrics.jsonl")
    assert all(1 <= line["sampling/rounds"] <= 2 for line in metrics)
    assert [line["reference/reset"] for line in metrics] == [0.0, 0.0, 1.0]
    assert (output_dir / "checkpoints" / "final" / "reference" / "model.safetensors").is_file()


@pytest.mark.slow
def test_a_killed_two_process_run_resumes_to_the_uninterrupted_weights_exactly(finished_runs, tmp_path, warm_model_dir):
    """FSDP with PPO's critic: the whole job killed, then launched again with resume=auto."""
    straight, overrides, _ = finished_runs(*RUNS[0])
    killed = tmp_path / "killed"
    command = torchrun_command(*train_command(killed, warm_model_dir, *overrides))
    job = subprocess.Popen(
        command, env=process_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    kill_once_checkpointed(job, killed)

    audited_train(killed, warm_model_dir, *overrides, "resume=auto")
    assert [line["step"] for line in read_jsonl(killed / "metrics.jsonl")] == [1, 2, 3]
    resumed, expected = final_tensors(killed), final_tensors(straight)
    assert resumed.keys() == expected.keys()
    assert max_difference(resumed, expected) == 0.0


@pytest.mark.slow
def test_a_worker_killed_after_step_2_is_restarted_by_torchrun_and_resumes_to_the_uninterrupted_weights(
    finished_runs, tmp_path, warm_model_dir
):
    """DDP with LoRA under `torchrun --max-restarts 1`: one worker killed once the step-2 checkpoint
    is in place; torchrun restarts both, which go on from the newest checkpoint by themselves."""
    straight, overrides, _ = finished_runs(*RUNS[1])
    restarted = tmp_path / "restarted"
    command = torchrun_command(
        str(AUDIT), *train_command(restarted, warm_model_dir, *overrides)[2:], options=("--max-restarts", "1")
    )
    with open(tmp_path / "job.log", "w") as log:
        env = {**process_env(), SEPARATE_STORES: "1"}
        job = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            kill_a_worker_once_checkpointed(job, restarted)
            assert job.wait(timeout=360) == 0, (tmp_path / "job.log").read_text()[-4000:]
        finally:
            if job.poll() is None:
                kill_job(job)
    output = (tmp_path / "job.log").read_text()
    assert "torchrun restarted the job (restart 1)" in output
    assert [line["step"] for line in read_jsonl(restarted / "metrics.jsonl")] == [1, 2, 3]
    assert tensorboard_steps(restarted) == [1, 2, 3]
    resumed, expected = final_tensors(restarted), final_tensors(straight)
    assert resumed.keys() == expected.keys()
    assert max_difference(resumed, expected) == 0.0


@pytest.mark.slow
def test_a_failing_rank_ends_the_job_with_its_error(tmp_path, warm_model_dir):
    (tmp_path / "rank_one_fails.py").write_text(
        "import os\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if os.environ['RANK'] == '1':\n"
        "        raise RuntimeError('verifier broke on rank 1')\n"
        "    return 0.0\n"
    )
    command = torchrun_command(*train_command(tmp_path / "run", warm_model_dir, "reward.function=rank_one_fails:compute_score"))
    env = {**process_env(), "PYTHONPATH": f"{tmp_path}{os.pathsep}{TESTS}"}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "verifier broke on rank 1" in result.stderr


# ----- `pacs eval` under torchrun ------------------------------------------------------------------

EVAL = ["--data", "builtin:arithmetic?max_operand=19&size=24&split=val", "-n", "4", "--max-tokens", "16", "--reward-workers", "0"]
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
