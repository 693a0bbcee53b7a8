"""`pacs.train.memory_plan` shards through pacs's own FSDP wrapping on torch's fake process group
(a whole plan is too slow for the suite; this keeps its building blocks from rotting)."""

import math

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


def tiny_vllm_plan(memory_plan, monkeypatch, tmp_path, *settings: str):
    """The plan of a tiny Qwen2 trained under FSDP at 8 ranks in bf16 with vLLM generating."""
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
    return memory_plan.simulate(str(config), 8, gpu_gib=80.0)


def test_the_plan_counts_vllm_in_generation_and_asleep_nowhere_else(monkeypatch, tmp_path):
    """vLLM's bf16 weights and the rest of its 0.5 of an 80 GiB GPU while generating; with sleep
    mode (the default on GPUs) the other phases do not hold it; the peak is the largest phase."""
    plan = tiny_vllm_plan(memory_plan, monkeypatch, tmp_path)
    weights = bf16_bytes(memory_plan, plan)
    assert plan.phases["generation"][memory_plan.VLLM_WEIGHTS] == weights
    assert plan.phases["generation"][memory_plan.VLLM_REST] == int(0.5 * 80 * 2**30) - weights
    assert not any(part.startswith("vLLM") for phase in ("old log-probs", "update") for part in plan.phases[phase])
    summary = plan.as_json()
    assert set(summary["phases"]) == {"generation", "old log-probs", "update"}
    assert summary["peak_gib"] == max(phase["total_gib"] for phase in summary["phases"].values())
    assert plan.phases["update"]["gradients"] > 0 and "gradients" not in plan.phases["generation"]


def test_without_sleep_mode_the_plan_holds_vllm_in_every_phase(monkeypatch, tmp_path):
    """... each rank holding half of the weights with tensor parallelism over 2."""
    plan = tiny_vllm_plan(memory_plan, monkeypatch, tmp_path, "sleep_mode=false", "tensor_parallel_size=2")
    held = {plan.phases[phase][memory_plan.VLLM_WEIGHTS] for phase in ("generation", "old log-probs", "update")}
    assert held == {bf16_bytes(memory_plan, plan) // 2}


def bf16_bytes(memory_plan, plan) -> int:
    """Bytes of the whole plan's model in bf16."""
    model = memory_plan.build_on_meta(memory_plan.load_config(plan.config), Qwen2Config(**TINY_QWEN), reference=True)
    return 2 * sum(parameter.numel() for parameter in model.parameters())
