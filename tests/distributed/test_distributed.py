"""Data parallel and FSDP2 with 2 real processes (torchrun, gloo on CPU): every update exactly as in
one process, and the one place for collectives. `pacs train` and `pacs eval` under torchrun are in
test_distributed_runs.py, several nodes in test_distributed_nodes.py (files of their own, so that
the suite's workers share them out).

The exactness tests run `tests/helpers/distributed_update.py` under torchrun once (every strategy and case,
and `tests/helpers/distributed_checks.py`'s checks, in one launch: each launch pays seconds of start-up)
and compare each case's weights after one step with the same step in this process.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from distributed_update import run_case
from safetensors.torch import load_file
from tiny_architectures import save_tiny_model
from torchrun_jobs import EXACT, WORKER, max_difference, torchrun

from pacs.algos.aggregation import LOSS_AGG_MODES
from pacs.config import ALGORITHM_CONFIGS
from pacs.distributed.collectives import communication_device, sum_over_ranks
from pacs.distributed.world import DistributedConfigError, World, check_restartable

ALGORITHMS = tuple(ALGORITHM_CONFIGS)
"""Every built-in algorithm (the registry): a new one is checked on 2 processes without a line here."""
FSDP_CASES = [f"{name}:{LOSS_AGG_MODES[i % len(LOSS_AGG_MODES)]}" for i, name in enumerate(ALGORITHMS)]
DDP_CASES = FSDP_CASES + [f"{name}:{LOSS_AGG_MODES[(i + 1) % len(LOSS_AGG_MODES)]}" for i, name in enumerate(ALGORITHMS)]
"""Each algorithm with two loss aggregations, the aggregations taken in turn (not every pair: each
case costs seconds in the one launch); FSDP takes each algorithm with its first."""
LORA_CASES = ["pacs:token-mean:lora", "ppo:seq-mean-token-sum-norm:lora"]
PACKED_CASES = ["pacs:token-mean:packed", "ppo:seq-mean-token-sum-norm:packed", "grpo:seq-mean-token-sum:lora:packed"]
"""Padding-free update passes, compared with one process's padded ones."""
TOKEN_CASES = ["pacs:token-mean:tokens", "ppo:seq-mean-token-sum-norm:packed:tokens", "grpo:seq-mean-token-sum:lora:tokens"]
"""Micro-batches budgeted in tokens (cut alike on both ranks), compared with one process's fixed-size padded ones."""
TOOL_CASES = ["pacs:token-mean:tools", "ppo:seq-mean-token-sum-norm:tools:packed", "grpo:seq-mean-token-sum:tools"]
"""Responses holding a tool's output, whose tokens no algorithm scores (`PolicyBatch.loss_mask`)."""
LOCAL_TOTALS_CASES = ["pacs:token-mean", "pacs:seq-mean-token-sum-norm", "grpo:seq-mean-token-sum", "ppo:seq-mean-token-mean"]


@pytest.fixture(scope="module")
def narrow_model_dir(tmp_path_factory) -> Path:
    """`tiny_architectures.NARROW`'s Qwen2: what the exactness tests check does not depend on the
    model's width, and a float64 step of this one takes about half as long as `builtin:tiny`'s."""
    return save_tiny_model("qwen2-narrow", tmp_path_factory.mktemp("narrow") / "model")


@pytest.fixture(scope="module")
def two_process_weights(narrow_model_dir, tmp_path_factory):
    """Directory per mode ("ddp", "fsdp", "ddp-local-totals") of CASE.safetensors from 2 processes,
    and checks.json of `distributed_checks.observe`: every mode and the checks in one launch."""
    out = tmp_path_factory.mktemp("two-process")
    torchrun(
        str(WORKER),
        str(narrow_model_dir),
        str(out),
        "ddp",
        *DDP_CASES,
        *LORA_CASES,
        *PACKED_CASES,
        *TOKEN_CASES,
        *TOOL_CASES,
        "fsdp",
        *FSDP_CASES,
        *LORA_CASES,
        *PACKED_CASES,
        *TOKEN_CASES,
        *TOOL_CASES,
        "ddp-local-totals",
        *LOCAL_TOTALS_CASES,
        "--checks",
        str(out / "checks.json"),
        timeout=1200,
    )  # the four launches' limits it replaces, 300 s each: a busy machine slows it alike
    return out


@pytest.mark.slow
def test_closing_the_world_leaves_no_wrapped_model_for_interpreter_exit_to_free(two_process_weights):
    """`World.close` frees the FSDP- and DDP-wrapped models that reference cycles keep (the
    launch wrapped dozens) before the process group goes: freed at interpreter exit instead,
    they can abort the process (pytorch/pytorch#179291)."""
    after_close = json.loads((two_process_weights / "after_close.json").read_text())
    assert after_close == {"wrapped_models_left": 0}


@pytest.fixture(scope="module")
def one_process_results(narrow_model_dir):
    cache: dict[str, tuple[dict[str, torch.Tensor], dict[str, float]]] = {}

    def results(case: str) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        if case not in cache:
            cache[case] = run_case(World.single(), str(narrow_model_dir), case)
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
    """ "strategy/case" -> the metrics 2 processes logged for every ddp and fsdp case."""
    return {
        f"{strategy}/{case}": json.loads((two_process_weights / strategy / f"{case}.json").read_text())
        for strategy, cases in (("ddp", DDP_CASES), ("fsdp", FSDP_CASES))
        for case in cases
    }


@pytest.mark.slow
@pytest.mark.parametrize("case", DDP_CASES)
def test_two_ddp_processes_update_exactly_like_one(case, two_process_weights, one_process_weights, narrow_model_dir):
    expected = one_process_weights(case)
    initial = load_file(str(narrow_model_dir / "model.safetensors"))
    assert max(float((expected[key] - initial[key]).abs().max()) for key in initial) > 1e-3  # the step moved the weights
    assert max_difference(load_file(str(two_process_weights / "ddp" / f"{case}.safetensors")), expected) <= EXACT


@pytest.mark.parametrize("case", FSDP_CASES)
def test_two_fsdp_processes_update_exactly_like_one(case, two_process_weights, one_process_weights):
    got = load_file(str(two_process_weights / "fsdp" / f"{case}.safetensors"))
    assert max_difference(got, one_process_weights(case)) <= EXACT


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("case", LORA_CASES)
def test_two_processes_update_lora_adapters_exactly_like_one(case, strategy, two_process_weights, one_process_weights):
    expected = one_process_weights(case)
    moved = [key for key in expected if "lora_B" in key and float(expected[key].abs().max()) > 1e-3]
    assert moved  # the step trained the adapters (B starts at 0)
    got = load_file(str(two_process_weights / strategy / f"{case}.safetensors"))
    assert max_difference(got, expected) <= EXACT


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("case", PACKED_CASES)
def test_two_processes_with_padding_free_passes_update_exactly_like_one_with_padded_ones(
    case, strategy, two_process_weights, one_process_weights
):
    got = load_file(str(two_process_weights / strategy / f"{case}.safetensors"))
    assert max_difference(got, one_process_weights(case.removesuffix(":packed"))) <= EXACT


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("case", TOKEN_CASES)
def test_two_processes_with_token_budgeted_micro_batches_update_exactly_like_one_with_fixed_ones(
    case, strategy, two_process_weights, one_process_weights
):
    got = load_file(str(two_process_weights / strategy / f"{case}.safetensors"))
    assert max_difference(got, one_process_weights(case.removesuffix(":tokens").removesuffix(":packed"))) <= EXACT


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("case", TOOL_CASES)
def test_two_processes_with_tool_tokens_update_exactly_like_one(case, strategy, two_process_weights, one_process_weights):
    expected = one_process_weights(case.removesuffix(":packed"))
    assert max_difference(one_process_weights(case.replace(":tools", "").removesuffix(":packed")), expected) > EXACT
    got = load_file(str(two_process_weights / strategy / f"{case}.safetensors"))
    assert max_difference(got, expected) <= EXACT


@pytest.mark.slow
@pytest.mark.parametrize("case", LOCAL_TOTALS_CASES)
def test_the_exactness_check_catches_per_rank_normalisation(case, two_process_weights, one_process_weights):
    got = load_file(str(two_process_weights / "ddp-local-totals" / f"{case}.safetensors"))
    assert max_difference(got, one_process_weights(case)) > EXACT


def test_a_mini_batch_that_cannot_be_split_evenly_is_refused():
    world = World(rank=0, world_size=2, device=torch.device("cpu"), strategy="ddp")
    with pytest.raises(
        DistributedConfigError, match=r"train.mini_batch_size=3 prompts cannot be split evenly across 2 processes"
    ):
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
    associated with device type cpu"). `sum_over_ranks` moves the CPU counts its callers build to the
    CUDA device first: on a machine without CUDA that move is what fails, never the collective."""
    store = dist.HashStore()
    dist.init_process_group(backend="cuda:gloo", store=store, rank=0, world_size=1)
    try:
        counts = torch.tensor([3.0, 5.0], dtype=torch.float64)
        with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
            dist.all_reduce(counts.clone())  # the stand-in refuses CPU tensors
        world = World(rank=0, world_size=2, device=torch.device("cpu"), strategy="ddp")
        if torch.cuda.is_available():
            assert sum_over_ranks(world, counts).tolist() == [3.0, 5.0]
        else:
            with pytest.raises((RuntimeError, AssertionError)) as refused:
                sum_over_ranks(world, counts)
            assert "No backend type associated" not in str(refused.value)
            # torch's words for the move: a CPU build "not compiled with CUDA", a CUDA build "no NVIDIA driver"
            assert re.search("CUDA|cuda|NVIDIA", str(refused.value)), refused.value
    finally:
        dist.destroy_process_group()


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
    assert seen["all_gathers_per_forward_before"] > 0, "a forward of a sharded model gathers its parameters"
    assert seen["all_gathers_per_forward_after_generation"] == seen["all_gathers_per_forward_before"]
    assert seen["sharded_gradients_between_micro_batches"]
    assert seen["reference_sharded"]


def test_a_restartable_torchrun_job_whose_workers_share_torchruns_store_is_refused_naming_the_fix():
    with pytest.raises(DistributedConfigError, match=r"TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --max-restarts"):
        check_restartable({"TORCHELASTIC_MAX_RESTARTS": "1", "TORCHELASTIC_USE_AGENT_STORE": "True"})
    check_restartable({"TORCHELASTIC_MAX_RESTARTS": "1", "TORCHELASTIC_USE_AGENT_STORE": "False"})  # a store per attempt
    check_restartable({"TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "True"})  # never restarted
