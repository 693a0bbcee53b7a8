"""`pacs.train.memory_plan` shards through pacs's own FSDP wrapping on torch's fake process group
(a whole plan is too slow for the suite; this keeps its building blocks from rotting)."""

import json
import math
import sys
import types
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config

from pacs.config import load_config
from pacs.distributed.wrapping import wrap_model
from pacs.train import memory_plan


def test_each_of_8_fake_ranks_holds_an_eighth_of_the_parameters_up_to_padding():
    config = load_config("builtin:demo", ["train.strategy=fsdp", "model.dtype=bfloat16"])
    tiny = Qwen2Config(
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
        tie_word_embeddings=False,
    )
    world_size = 8
    with memory_plan.fake_process_group(world_size):
        model = memory_plan.build_on_meta(config, tiny)
        total = sum(parameter.numel() for parameter in model.parameters())
        padding = sum(math.prod(parameter.shape[1:]) for parameter in model.parameters())  # < 1 row of dim 0 each
        sharded = wrap_model(memory_plan.world_of(config, world_size), model, compute_dtype=torch.bfloat16)
        local = memory_plan.local_bytes(sharded.parameters()) // 4  # fp32 master weights
    assert total / world_size <= local < total / world_size + padding


@pytest.mark.slow
def test_the_plans_peak_only_trackers_report_the_peak_of_torchs_trackers(monkeypatch):
    """The plan's trackers skip torch's per-module peaks (their cost grows with the model's modules)."""
    config = load_config(
        "builtin:demo",
        [
            "train.strategy=fsdp",
            "model.dtype=bfloat16",
            "train.micro_batch_size=1",
            "data.max_prompt_length=8",
            "data.max_response_length=24",
        ],
    )
    tiny = Qwen2Config(
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
        tie_word_embeddings=False,
    )
    batch = memory_plan.full_micro_batch(config)

    def simulated() -> dict[str, int]:
        with memory_plan.fake_process_group(8):
            model = wrap_model(
                memory_plan.world_of(config, 8), memory_plan.build_on_meta(config, tiny), compute_dtype=torch.bfloat16
            )
            fake = memory_plan.FakeTensorMode(allow_non_fake_inputs=True)
            return memory_plan.simulate_micro_batch(model, memory_plan.policy_loss(batch), True, fake)

    peak_only = simulated()
    monkeypatch.setattr(memory_plan, "FSDPPeakTracker", memory_plan.FSDPMemTracker)
    assert simulated() == peak_only and peak_only["activations"] > 0


TINY_QWEN = dict(
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1000,
    tie_word_embeddings=False,
    max_position_embeddings=4096,
)


def tiny_vllm_plan(memory_plan, monkeypatch, tmp_path, *settings: str, overrides: tuple[str, ...] = ()):
    """The plan of a tiny Qwen2 trained under FSDP at 8 ranks in bf16 with vLLM generating
    (`settings`: rollout.vllm's, `overrides`: any key=value)."""
    monkeypatch.setitem(memory_plan.QWEN25, "tiny-qwen", TINY_QWEN)
    config = tmp_path / "config.yaml"
    config.write_text(
        "\n".join(
            [
                "model: {path: tiny-qwen, dtype: bfloat16}",
                "rollout: {engine: vllm, n: 4, generation_batch_size: 16}",
                "train: {strategy: fsdp, batch_size: 16, mini_batch_size: 8, micro_batch_size: 2}",
                "data: {max_prompt_length: 8, max_response_length: 24}",
            ]
        )
    )
    import yaml

    data = yaml.safe_load(config.read_text())
    for setting in settings:
        key, value = setting.split("=")
        data["rollout"].setdefault("vllm", {})[key] = yaml.safe_load(value)
    config.write_text(yaml.safe_dump(data))
    return memory_plan.simulate(str(config), 8, gpu_gib=80.0, overrides=overrides)


@pytest.mark.slow
def test_the_plan_counts_vllm_in_generation_and_asleep_nowhere_else(monkeypatch, tmp_path):
    """vLLM's bf16 weights and the rest of its 0.5 of an 80 GiB GPU while generating; with sleep
    mode (the default on GPUs) the other phases do not hold it; the peak is the largest phase."""
    plan = tiny_vllm_plan(memory_plan, monkeypatch, tmp_path)
    weights = bf16_bytes(memory_plan, plan)
    assert plan.phases["generation"][memory_plan.VLLM_WEIGHTS] == weights
    assert plan.phases["generation"][memory_plan.VLLM_REST] == int(0.5 * 80 * 2**30) - weights
    assert not any(part.startswith("vLLM") for phase in ("old log-probs", "update") for part in plan.phases[phase])
    summary = plan.as_json()
    assert set(summary["phases"]) == {"generation", "validation", "old log-probs", "update"}
    assert summary["peak_gib"] == max(phase["total_gib"] for phase in summary["phases"].values())
    assert plan.phases["update"]["gradients"] > 0 and "gradients" not in plan.phases["generation"]


@pytest.mark.slow
def test_without_sleep_mode_the_plan_holds_vllm_in_every_phase(monkeypatch, tmp_path):
    """... each rank holding half of the weights with tensor parallelism over 2."""
    plan = tiny_vllm_plan(memory_plan, monkeypatch, tmp_path, "sleep_mode=false", "tensor_parallel_size=2")
    held = {plan.phases[phase][memory_plan.VLLM_WEIGHTS] for phase in ("generation", "old log-probs", "update")}
    assert held == {bf16_bytes(memory_plan, plan) // 2}


def bf16_bytes(memory_plan, plan) -> int:
    """Bytes of the whole plan's model in bf16."""
    model = memory_plan.build_on_meta(memory_plan.load_config(plan.config), Qwen2Config(**TINY_QWEN), reference=True)
    return 2 * sum(parameter.numel() for parameter in model.parameters())


def test_the_generator_process_of_an_asynchronous_run_holds_vllms_share_in_every_phase(monkeypatch, tmp_path):
    """rollout.max_staleness=1: the generator's engine never sleeps, so its whole 0.5 of the GPU
    stands beside the update's gradients; the trainer's own engine (transformers) validates."""
    plan = tiny_vllm_plan(memory_plan, monkeypatch, tmp_path, overrides=("rollout.max_staleness=1",))
    generator = int(0.5 * 80 * 2**30)
    assert {phase: held.get(memory_plan.GENERATOR_VLLM) for phase, held in plan.phases.items()} == {
        phase: generator for phase in ("generation", "validation", "old log-probs", "update")
    }
    assert not any(part.startswith("vLLM") for held in plan.phases.values() for part in held)
    assert plan.phases["update"]["gradients"] > 0
    assert plan.as_json()["overrides"] == ["rollout.max_staleness=1"]


def test_validation_with_transformers_holds_the_gathered_model_and_a_calls_kv_cache(monkeypatch, tmp_path):
    """... 16 sequences (rollout.generation_batch_size, whole groups of eval.n = 4) of 8 + 24
    tokens, 2 layers x 2 key/value heads x 16 dimensions x 2 (keys, values) x 2 bytes each."""
    plan = tiny_vllm_plan(memory_plan, monkeypatch, tmp_path, overrides=("rollout.max_staleness=1", "eval.n=4"))
    validation = plan.phases["validation"]
    assert validation[memory_plan.VALIDATION_MODEL] == bf16_bytes(memory_plan, plan)
    assert validation[memory_plan.VALIDATION_CACHE] == 16 * 32 * (2 * 2 * 2 * 16 * 2)
    assert plan.peak == max(plan.total(phase) for phase in plan.phases)


def test_a_run_without_validation_data_plans_no_validation(monkeypatch, tmp_path):
    plan = tiny_vllm_plan(memory_plan, monkeypatch, tmp_path, overrides=("data.val=null",))
    assert "validation" not in plan.phases


SEVEN_B_PARAMETERS = 7_615_616_512
SEVEN_B_KV_PER_TOKEN = 2 * 28 * 4 * 128 * 2  # keys and values x layers x key/value heads x head dimension x bf16


def seven_b_problem(overrides: list[str]) -> str | None:
    """The start-up check's verdict on the paper's 7B at 8 ranks of 80 GiB with `overrides`."""
    config = load_config("builtin:paper-pacs-beta1-qwen2.5-7b", overrides)
    world = memory_plan.world_of(config, 8)
    return memory_plan.memory_problem(config, SEVEN_B_PARAMETERS, SEVEN_B_KV_PER_TOKEN, world, 80 * 2**30)


@pytest.mark.parametrize(
    ("overrides", "refused"),
    [
        ([], False),
        (["rollout.max_staleness=1", "data.val=null"], False),
        (["rollout.max_staleness=1", "rollout.vllm.gpu_memory_utilization=0.9", "data.val=null"], True),
        (["rollout.vllm.sleep_mode=false", "rollout.vllm.gpu_memory_utilization=0.9"], True),
    ],
)
def test_a_run_that_cannot_fit_the_device_whatever_its_activations_is_refused_naming_what_to_change(overrides, refused):
    """The paper's 7B at 8 ranks of 80 GiB: 10.6 GiB of sharded state (14.2 with gradients), beside
    vLLM's share of the GPU when it never sleeps."""
    problem = seven_b_problem(overrides)
    assert (problem is not None) == refused
    if refused:
        assert "rollout.vllm.gpu_memory_utilization (now 0.9)" in problem
        assert "benchmarks/memory_plan.py" in problem


def test_a_never_sleeping_engine_is_refused_naming_the_setting_that_lets_it_sleep():
    asynchronous = seven_b_problem(["rollout.max_staleness=1", "rollout.vllm.gpu_memory_utilization=0.9", "data.val=null"])
    sleepless = seven_b_problem(["rollout.vllm.sleep_mode=false", "rollout.vllm.gpu_memory_utilization=0.9"])
    assert "rollout.max_staleness=0 (now 1" in asynchronous and "sleep_mode" not in asynchronous
    assert "turn rollout.vllm.sleep_mode on" in sleepless and "max_staleness" not in sleepless


def test_asynchronous_validation_at_the_default_share_is_refused_at_the_plans_figure():
    """Issue 51's finding 3: `rollout.max_staleness=1` as the paper config has it otherwise. Its
    validation phase is closed-form, and the check's figure is the simulated plan's (docs/memory.md):
    10.64 GiB of state + the bf16 model gathered, 14.18 + the KV cache of 128 sequences x 4,608
    tokens x 56 KiB, 31.50 + the generator's 0.5 x 80 GiB + the weight ring's one bf16 copy of the
    model, 14.18 = 110.50 GiB."""
    problem = seven_b_problem(["rollout.max_staleness=1"])
    assert problem is not None and "its validation phase holds at least 110.5 GiB" in problem
    assert "validation: KV cache of one generate call 31.5" in problem
    for setting in (
        "rollout.generation_batch_size (now 128",
        "data.val=null",
        "rollout.max_staleness=0",
        "gpu_memory_utilization",
    ):
        assert setting in problem


def test_the_asynchronous_settings_docs_async_gives_for_80_gb_pass_the_check():
    """docs/async.md's command: the generator at 0.2 of the GPU, 16 sequences a generate call."""
    settings = ["rollout.max_staleness=1", "rollout.vllm.gpu_memory_utilization=0.2", "rollout.generation_batch_size=16"]
    assert " ".join(settings) in (Path(__file__).parents[2] / "docs" / "async.md").read_text()
    assert seven_b_problem(settings) is None


def test_the_checks_validation_phase_is_the_simulated_plans(monkeypatch, tmp_path):
    """Both closed forms: the tiny plan's validation without activations is what the check counts
    (its parameters and AdamW state, the gathered model, the cache, the generator)."""
    plan = tiny_vllm_plan(memory_plan, monkeypatch, tmp_path, overrides=("rollout.max_staleness=1", "eval.n=4"))
    config = memory_plan.load_config(plan.config, list(plan.overrides))
    numel = bf16_bytes(memory_plan, plan) // 2
    kv_per_token = memory_plan.kv_bytes_per_token(Qwen2Config(**TINY_QWEN), 2)
    least = memory_plan.least_bytes(config, numel, kv_per_token, memory_plan.world_of(config, 8), 80 * 2**30)
    model = memory_plan.build_on_meta(config, Qwen2Config(**TINY_QWEN))
    padding = 12 * sum(math.prod(parameter.shape[1:]) for parameter in model.parameters())  # < 1 row a shard, 12 bytes each
    assert 0 <= plan.total("validation") - sum(least["validation"].values()) < padding


def test_the_trainers_check_counts_the_models_parameters_from_its_config_and_reads_the_devices_size(monkeypatch, tiny_model_dir):
    """`check_fits_device` (which `pacs.train.trainer.begin` runs on CUDA before anything loads),
    here with a stand-in for CUDA's device properties: the tiny model's 538,624 parameters in
    float32 need 6.2 MiB of state (12 bytes each: weights, AdamW's moments), and the demo's
    generation with transformers a KV cache of 512 sequences x 80 tokens x 2 KiB (2 layers x 4
    key/value heads x 32 dimensions x keys and values x 4 bytes) = 80 MiB beside it: 86.2 MiB, which
    a 64 MiB device cannot hold and a 128 MiB one can."""
    config = load_config("builtin:demo", [f"model.path={tiny_model_dir}"])
    world = memory_plan.World.single()
    for mib, refused in ((64, True), (128, False)):
        device = types.SimpleNamespace(total_memory=mib * 2**20, name="stand-in")
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _, device=device: device)
        if refused:
            with pytest.raises(ValueError, match=r"cannot fit cpu \(stand-in\)"):
                memory_plan.check_fits_device(config, world)
        else:
            memory_plan.check_fits_device(config, world)


def noting_simulation(path, world_size, gpu_gib, overrides):
    """A plan of 1 GiB whose one note is the settings it was given."""
    return memory_plan.Plan(path, world_size, gpu_gib, {"update": {"parameters": 2**30}}, [repr(overrides)], 0.0, 0.0)


def test_key_value_settings_after_the_options_reach_the_simulation_of_every_config(monkeypatch, capsys):
    """`memory_plan.py CONFIG --world-size 8 --json rollout.max_staleness=1` (the simulation a
    stand-in that notes the settings it got)."""
    monkeypatch.setattr(memory_plan, "simulate", noting_simulation)
    config = "builtin:paper-pacs-beta1-qwen2.5-7b"
    argv = ["memory_plan.py", config, "--world-size", "8", "--json", "rollout.max_staleness=1", "--jobs", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    memory_plan.main()
    printed = json.loads(capsys.readouterr().out.strip())
    assert printed["notes"] == [repr(("rollout.max_staleness=1",))]
    assert (printed["config"], printed["world_size"], printed["overrides"]) == (config, 8, ["rollout.max_staleness=1"])


def test_the_trainer_refuses_at_start_a_run_its_cuda_device_cannot_hold(monkeypatch, tiny_model_dir, tmp_path):
    """`pacs.train.trainer.begin` on a stand-in CUDA device of 64 MiB (the demo needs 86.2 MiB, above):
    a ConfigError naming the settings to change, before the run's folder exists."""
    from pacs.config import ConfigError
    from pacs.distributed.world import World
    from pacs.train.trainer import begin

    config = load_config("builtin:demo", [f"model.path={tiny_model_dir}", f"output_dir={tmp_path / 'run'}"])
    world = World(rank=0, world_size=1, device=torch.device("cuda", 0), strategy="none")
    device = types.SimpleNamespace(total_memory=64 * 2**20, name="stand-in")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: device)
    with pytest.raises(ConfigError, match=r"cannot fit cuda:0 \(stand-in\).*rollout\.generation_batch_size \(now 512"):
        begin(config, world)
    assert not (tmp_path / "run").exists()
