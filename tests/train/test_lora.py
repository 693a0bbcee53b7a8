"""LoRA (`model.lora_rank > 0`): adapters on the frozen base, the reference policy for free,
checkpoints that hold the merged model and the adapter, exact resume after kill -9."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from killing import finished, kill_once_checkpointed
from mixed_rewards import MIXED_GROUPS
from safetensors.torch import load_file
from tiny_architectures import tiny_causal_lm
from torchrun_jobs import process_env
from transformers import AutoModelForCausalLM

from pacs.cli import main
from pacs.config import ConfigError, load_config
from pacs.models.loading import load_causal_lm, load_tokenizer
from pacs.models.lora import ADAPTER_DIR, add_lora, is_adapter_weight, merged_tensors, read_adapter, require_peft
from pacs.train import trainer as trainer_module
from pacs.train.checkpointing.resume import check_resumable
from pacs.train.checkpointing.state import save_checkpoint
from pacs.train.loading import with_training_options
from pacs.train.logprobs import response_logprobs_no_grad
from pacs.train.metrics import read_metrics
from pacs.train.trainer import train

TOKENS = torch.tensor([[7, 8, 9, 10, 11, 12]])


def adapted(model_dir: Path, **options) -> torch.nn.Module:
    return add_lora(
        load_causal_lm(str(model_dir)), **{"rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": "all-linear", **options}
    )


def with_moved_adapters(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with every B matrix random (new adapters have B = 0 and change nothing)."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    return model


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The merged model's state dict, computed tensor by tensor as checkpoints compute it."""
    state = model.state_dict()
    adapters = {key: value for key, value in state.items() if is_adapter_weight(key)}
    return dict(merged_tensors(model, ((key, value) for key, value in state.items() if key not in adapters), adapters))


# ----- the models layer ---------------------------------------------------------------------------


def test_without_peft_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'pacs\[lora\]'"):
        require_peft()


def test_pacs_train_without_peft_stops_before_loading_and_names_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "model.lora_rank=8", f"output_dir={tmp_path}"])
    assert exit_info.value.code == 2
    assert "pip install 'pacs[lora]'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing written, nothing loaded


def test_new_adapters_leave_the_model_unchanged_and_alone_are_trainable(tiny_model_dir):
    base = load_causal_lm(str(tiny_model_dir))
    model = adapted(tiny_model_dir)
    assert torch.equal(model(input_ids=TOKENS).logits, base(input_ids=TOKENS).logits)
    trainable = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
    assert trainable and all(".lora_A." in name or ".lora_B." in name for name in trainable)
    targets = {name.split(".lora_")[0].rsplit(".", 1)[-1] for name in trainable}
    assert targets == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def test_new_adapters_of_a_run_are_drawn_from_its_seed_whatever_was_drawn_before(tiny_model_dir):
    """Every rank draws the same adapters (FSDP keeps each rank's shard of its own draw), and a run
    draws the same ones whether or not loading its model drew random numbers (a first build)."""
    config = load_config(None, [f"model.path={tiny_model_dir}", "model.lora_rank=4", "seed=3"])
    adapters = []
    for earlier_draw in (1, 2):
        torch.manual_seed(earlier_draw)
        model = with_training_options(load_causal_lm(str(tiny_model_dir)), config, lora=True)
        adapters.append({name: value for name, value in model.state_dict().items() if "lora_A" in name})
    assert adapters[0] and all(torch.equal(adapters[0][name], adapters[1][name]) for name in adapters[0])


def test_an_unknown_target_module_is_refused_naming_the_key(tiny_model_dir):
    with pytest.raises(ValueError, match=r"model.lora_target_modules=\['qkv'\]"):
        adapted(tiny_model_dir, target_modules=["qkv"])


def test_merged_weights_equal_peft_merge_and_unload_without_changing_the_model(tiny_model_dir):
    model = with_moved_adapters(adapted(tiny_model_dir))
    before = {name: value.clone() for name, value in model.state_dict().items()}
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    merged = merged_state_dict(model)
    assert merged.keys() == expected.keys()
    assert all(torch.equal(merged[name], expected[name]) for name in expected)
    assert all(torch.equal(value, before[name]) for name, value in model.state_dict().items())


def test_weights_are_merged_on_the_device_they_come_on(tiny_model_dir):
    """A weight sync merges on the GPU the gathered tensors are on, without a trip through the
    host: here the meta device stands for it (a copy to the CPU would fail there)."""
    model = adapted(tiny_model_dir).to("meta")
    merged = merged_state_dict(model)
    assert merged and all(tensor.device.type == "meta" for tensor in merged.values())


@pytest.mark.parametrize("architecture", ["qwen3_moe", "mixtral"])
def test_merged_weights_of_a_mixture_of_experts_equal_peft_merge_and_unload(architecture):
    """peft adapts the stacked expert weights and the router as parameters, in nested wrappers."""
    model = with_moved_adapters(
        add_lora(tiny_causal_lm(architecture), rank=4, alpha=8.0, dropout=0.0, target_modules="all-linear")
    )
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    merged = merged_state_dict(model)
    assert merged.keys() == expected.keys()
    assert any(".experts." in name for name in merged)
    assert all(torch.equal(merged[name], expected[name]) for name in expected)


def test_a_lora_checkpoint_is_the_merged_model_with_the_adapter_beside_it(tmp_path, tiny_model_dir):
    model = with_moved_adapters(adapted(tiny_model_dir))
    directory = save_checkpoint(tmp_path / "step_1", model, load_tokenizer(str(tiny_model_dir)), {"step": 1})
    assert (directory / ADAPTER_DIR / "adapter_config.json").is_file()
    assert (directory / ADAPTER_DIR / "adapter_model.safetensors").is_file()
    plain = AutoModelForCausalLM.from_pretrained(directory)
    assert type(plain).__name__ == "Qwen2ForCausalLM"
    torch.testing.assert_close(plain(input_ids=TOKENS).logits, model(input_ids=TOKENS).logits, rtol=0, atol=1e-5)
    reloaded = adapted(tiny_model_dir, adapter=read_adapter(directory / ADAPTER_DIR))
    assert torch.equal(reloaded(input_ids=TOKENS).logits, model(input_ids=TOKENS).logits)


def test_an_adapter_of_another_rank_is_refused(tmp_path, tiny_model_dir):
    save_checkpoint(tmp_path / "step_1", adapted(tiny_model_dir), load_tokenizer(str(tiny_model_dir)), {"step": 1})
    with pytest.raises(ValueError, match="does not fit this model's LoRA layers"):
        adapted(tiny_model_dir, rank=8, adapter=read_adapter(tmp_path / "step_1" / ADAPTER_DIR))


def test_resuming_across_lora_and_full_training_is_refused(tmp_path):
    (tmp_path / "step_2" / ADAPTER_DIR).mkdir(parents=True)
    with pytest.raises(ConfigError, match="written with LoRA .* cannot be resumed with model.lora_rank=0"):
        check_resumable(tmp_path / "step_2", lora_rank=0)
    with pytest.raises(ConfigError, match="written without LoRA .* model.lora_rank=8"):
        check_resumable(tmp_path, lora_rank=8)


# ----- a LoRA run with a KL penalty ----------------------------------------------------------------


def lora_overrides(output_dir: Path, model_dir: Path, *extra: str) -> list[str]:
    return [
        f"output_dir={output_dir}",
        f"model.path={model_dir}",
        "model.lora_rank=8",
        "data.train=builtin:arithmetic?size=64&max_operand=19",
        "data.val=null",
        "train.steps=3",
        "train.batch_size=8",
        "train.mini_batch_size=4",
        "train.micro_batch_size=12",
        "train.lr=3e-3",
        "rollout.n=4",
        "algorithm.kl_coef=0.05",
        "algorithm.kl_estimator=k2",
        *MIXED_GROUPS,  # the adapters start at B = 0, where the KL term has no gradient: only rewards move them
        *extra,
    ]


@pytest.fixture(scope="module")
def kl_run(tmp_path_factory, warm_model_dir):
    """A 3-step LoRA run of pacs with a KL penalty, recording every step's batch (with its
    reference and rollout log-probs) and every `from_pretrained` of a causal LM."""
    output_dir = tmp_path_factory.mktemp("lora") / "run"
    batches, loads = [], []
    original_load, original_update = AutoModelForCausalLM.from_pretrained, trainer_module.update_policy

    def counting_load(*args, **kwargs):
        loads.append(args[0])
        return original_load(*args, **kwargs)

    def recording_update(model, optimizer, world, batch, *args, **kwargs):
        batches.append(copy.deepcopy(batch))
        return original_update(model, optimizer, world, batch, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(AutoModelForCausalLM, "from_pretrained", counting_load)
        patch.setattr(trainer_module, "update_policy", recording_update)
        result = train(load_config("builtin:demo", lora_overrides(output_dir, warm_model_dir)), show_progress=False)
    return SimpleNamespace(result=result, output_dir=output_dir, batches=batches, loads=loads, base=warm_model_dir)


@pytest.mark.slow
def test_reference_logprobs_are_those_of_the_initial_model(kl_run):
    initial = load_causal_lm(str(kl_run.base)).eval()
    last = kl_run.batches[-1]
    expected = response_logprobs_no_grad(initial, last, micro_batch_size=12)
    torch.testing.assert_close(last.row_terms["ref_logprobs"], expected, rtol=0, atol=1e-6)
    rollout_policy_moved = ((last.old_logprobs - expected).abs() * last.response_mask)[4 * 4 :].max()
    assert rollout_policy_moved > 1e-3  # the adapters had moved the policy away from the reference


@pytest.mark.slow
def test_no_second_model_is_loaded_for_the_reference(kl_run):
    assert len(kl_run.loads) == 1


@pytest.mark.slow
def test_the_first_step_logs_trainable_and_total_parameters(kl_run):
    first = read_metrics(kl_run.output_dir)[0]
    adapter = load_file(str(kl_run.result.final_checkpoint / ADAPTER_DIR / "adapter_model.safetensors"))
    base = load_file(str(kl_run.base / "model.safetensors"))
    assert first["model/trainable_parameters"] == sum(value.numel() for value in adapter.values())
    assert first["model/total_parameters"] == sum(value.numel() for value in (*adapter.values(), *base.values()))


@pytest.mark.slow
def test_the_final_checkpoint_loads_in_transformers_and_pacs_eval(kl_run, tmp_path):
    final = kl_run.result.final_checkpoint
    AutoModelForCausalLM.from_pretrained(final)
    main(["eval", "--model", str(final), "--data", "builtin:arithmetic?size=4", "--n", "2", "--out", str(tmp_path)])
    metrics = json.loads((tmp_path / "eval_metrics.json").read_text())
    assert "pass@1" in metrics["data_sources"]["arithmetic"]["pass@k"]


@pytest.mark.slow
def test_training_changes_only_the_adapted_layers(kl_run):
    base, merged = (
        load_file(str(kl_run.base / "model.safetensors")),
        load_file(str(kl_run.result.final_checkpoint / "model.safetensors")),
    )
    changed = {name for name in base if not torch.equal(base[name], merged[name])}
    assert changed and all(name.endswith("_proj.weight") for name in changed)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["grpo", "rloo", "ppo"])
def test_every_algorithm_trains_the_adapters(tmp_path, warm_model_dir, algorithm):
    overrides = lora_overrides(tmp_path, warm_model_dir, f"algorithm.name={algorithm}", "train.steps=2", "critic.lr=1e-4")
    final = train(load_config("builtin:demo", overrides), show_progress=False).final_checkpoint
    adapter = load_file(str(final / ADAPTER_DIR / "adapter_model.safetensors"))
    assert any(float(value.abs().max()) > 0 for name, value in adapter.items() if "lora_B" in name)
    if algorithm == "ppo":  # the critic is trained in full (documented)
        assert (final / "critic" / "model.safetensors").is_file() and not (final / "critic" / ADAPTER_DIR).exists()


# ----- kill -9 and resume=auto ---------------------------------------------------------------------


def weights_of(checkpoint: Path) -> dict[str, torch.Tensor]:
    tensors = load_file(str(checkpoint / "model.safetensors"))
    adapter = load_file(str(checkpoint / ADAPTER_DIR / "adapter_model.safetensors"))
    return {**tensors, **{f"adapter.{name}": value for name, value in adapter.items()}}


def pacs_train(output_dir: Path, model_dir: Path, *options: str) -> subprocess.Popen:
    """`pacs train` of the LoRA recipe in a new process group (one thread: every run computes alike;
    the tests' helpers importable, as its reward function is one of them)."""
    command = [
        sys.executable,
        "-m",
        "pacs.cli",
        "train",
        "--config",
        "builtin:demo",
        *lora_overrides(output_dir, model_dir, *options),
    ]
    return subprocess.Popen(
        command, env=process_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


@pytest.mark.slow
def test_a_killed_lora_run_resumes_to_the_weights_of_an_uninterrupted_one(tmp_path, warm_model_dir):
    options = ("train.steps=4", "train.save_every=1", "model.dtype=bfloat16")
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    finished(pacs_train(straight, warm_model_dir, *options))

    job = pacs_train(killed, warm_model_dir, *options)
    kill_once_checkpointed(job, killed)

    finished(pacs_train(killed, warm_model_dir, *options, "resume=auto"))
    expected, got = weights_of(straight / "checkpoints" / "final"), weights_of(killed / "checkpoints" / "final")
    assert expected.keys() == got.keys()
    assert max(float((expected[name].float() - got[name].float()).abs().max()) for name in expected) <= 1e-6
    assert [row["step"] for row in read_metrics(killed)] == [1, 2, 3, 4]
