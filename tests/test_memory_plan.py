"""benchmarks/memory_plan.py shards through pacs's own FSDP wrapping on torch's fake process group
(the script itself is too slow for the suite; this keeps its building blocks from rotting)."""

import importlib.util
import math
import sys
from pathlib import Path

import torch
from transformers import Qwen2Config

from pacs.config import load_config
from pacs.train.distributed.wrapping import wrap_model

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "memory_plan.py"


def load_script():
    spec = importlib.util.spec_from_file_location("memory_plan", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_each_of_8_fake_ranks_holds_an_eighth_of_the_parameters_up_to_padding():
    memory_plan = load_script()
    config = load_config("builtin:demo", ["train.strategy=fsdp", "model.dtype=bfloat16"])
    tiny = Qwen2Config(
        hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=False,
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
    memory_plan = load_script()
    config = load_config("builtin:demo", ["train.strategy=fsdp", "model.dtype=bfloat16", "train.micro_batch_size=1",
                                          "data.max_prompt_length=8", "data.max_response_length=24"])
    tiny = Qwen2Config(
        hidden_size=64, intermediate_size=160, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=False,
    )
    batch = memory_plan.full_micro_batch(config)

    def simulated() -> dict[str, int]:
        with memory_plan.fake_process_group(8):
            model = wrap_model(memory_plan.world_of(config, 8), memory_plan.build_on_meta(config, tiny), compute_dtype=torch.bfloat16)
            fake = memory_plan.FakeTensorMode(allow_non_fake_inputs=True)
            return memory_plan.simulate_micro_batch(model, memory_plan.policy_loss(batch), True, fake)

    peak_only = simulated()
    monkeypatch.setattr(memory_plan, "FSDPPeakTracker", memory_plan.FSDPMemTracker)
    assert simulated() == peak_only and peak_only["activations"] > 0
