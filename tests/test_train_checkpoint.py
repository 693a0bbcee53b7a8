"""Checkpoints are Hugging Face directories written atomically; resume picks the newest complete one."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from pacs.models.loading import load_causal_lm, load_tokenizer
from pacs.models.saving import WEIGHTS_INDEX_FILE, write_safetensors_files
from pacs.outputs import MARKER, claim_output_dir
from pacs.train.checkpoint import (
    TRAINER_STATE,
    TRAINER_STATE_FORMAT,
    CheckpointError,
    latest_checkpoint,
    load_trainer_state,
    restore_rng_states,
    rng_states,
    load_optimizer_state,
    restore_training_state,
    save_checkpoint,
    save_optimizer_state,
    write_checkpoint,
)
from pacs.train import checkpoint as checkpoint_module
from pacs.train.distributed.world import World
from pacs.train.sampler import PromptSampler


def test_checkpoint_is_a_plain_hugging_face_directory(tmp_path, tiny_model_dir):
    model, tokenizer = load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    directory = save_checkpoint(tmp_path / "step_1", model, tokenizer, {"step": 1})
    assert (directory / "model.safetensors").is_file() and (directory / TRAINER_STATE).is_file()
    AutoModelForCausalLM.from_pretrained(directory)
    assert AutoTokenizer.from_pretrained(directory).chat_template


def tensor_bytes(tensors) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


def test_model_weights_are_written_in_files_of_bounded_size_that_from_pretrained_reads(tmp_path, tiny_model_dir, monkeypatch):
    model, tokenizer = load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    model.save_pretrained(tmp_path / "reference")
    bound = 100_000
    monkeypatch.setattr(checkpoint_module, "MODEL_FILE_BYTES", bound)
    directory = save_checkpoint(tmp_path / "step_1", model, tokenizer, {"step": 1})

    files = sorted(directory.glob("model-*.safetensors"))
    assert len(files) > 2 and files[0].name == f"model-00001-of-{len(files):05d}.safetensors"
    for file in files:
        tensors = load_file(str(file)).values()
        assert tensor_bytes(tensors) <= bound or len(tensors) == 1
    written = {key: value for file in files for key, value in load_file(str(file)).items()}
    assert written.keys() == load_file(str(tmp_path / "reference" / "model.safetensors")).keys()  # the tied lm_head left out
    assert json.loads((directory / WEIGHTS_INDEX_FILE).read_text())["weight_map"].keys() == written.keys()
    for name in ("config.json", "generation_config.json"):
        assert json.loads((directory / name).read_text()) == json.loads((tmp_path / "reference" / name).read_text())
    reloaded = AutoModelForCausalLM.from_pretrained(directory)
    assert all(torch.equal(value, reloaded.state_dict()[key]) for key, value in model.state_dict().items())


def test_a_stream_of_tensors_is_written_holding_no_more_than_one_file_of_them(tmp_path):
    bound = 10_000
    sizes = [300, 1_000, 2_500, 40, 1_800, 500, 1_200, 2_000, 700, 2_400]  # float32 elements: 4 bytes each

    def stream():
        drawn = 0
        for number, size in enumerate(sizes):
            written = tensor_bytes(t for file in tmp_path.glob("*.safetensors") for t in load_file(str(file)).values())
            assert drawn - written <= bound  # what was handed over and not yet written is held by the writer
            drawn += size * 4
            yield f"t{number}", torch.full((size,), float(number))

    files = write_safetensors_files(stream(), tmp_path, "part", bound)
    assert len(files) == 7 and [key for _, keys in files for key in keys] == [f"t{number}" for number in range(len(sizes))]
    assert all(tensor_bytes(load_file(str(tmp_path / name)).values()) <= bound for name, _ in files)


def test_crash_mid_write_leaves_nothing_for_resume(tmp_path, tiny_model_dir, monkeypatch):
    model, tokenizer = load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    save_checkpoint(tmp_path / "step_1", model, tokenizer, {"step": 1})

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(tokenizer, "save_pretrained", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path / "step_2", model, tokenizer, {"step": 2})
    assert not (tmp_path / "step_2").exists()
    assert latest_checkpoint(tmp_path) == tmp_path / "step_1"


def test_newest_step_is_chosen_numerically(tmp_path):
    for step in (2, 10, 9):
        (tmp_path / f"step_{step}").mkdir()
        (tmp_path / f"step_{step}" / TRAINER_STATE).write_bytes(b"")
    (tmp_path / "step_11").mkdir()
    assert latest_checkpoint(tmp_path) == tmp_path / "step_10"


class CreatesAFileWhenUnpickled:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def test_a_crafted_trainer_state_is_refused_without_running_its_code(tmp_path):
    checkpoint = tmp_path / "step_1"
    checkpoint.mkdir()
    witness = tmp_path / "pwned"
    torch.save({"format": TRAINER_STATE_FORMAT, "step": 1, "payload": CreatesAFileWhenUnpickled(witness)}, checkpoint / TRAINER_STATE)
    with pytest.raises(CheckpointError, match="weights_only=True"):
        load_trainer_state(checkpoint)
    assert not witness.exists()


def test_a_trainer_state_of_the_old_format_is_refused_with_advice(tmp_path):
    checkpoint = tmp_path / "step_3"
    checkpoint.mkdir()
    torch.save({"step": 3, "optimizer": {}}, checkpoint / TRAINER_STATE)
    with pytest.raises(CheckpointError, match=r"format is none.*start a new run from its weights"):
        load_trainer_state(checkpoint)


def test_trainer_state_round_trips_optimizer_and_random_states(tmp_path, tiny_model_dir):
    model, tokenizer = load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.tensor([[7, 8, 9]])).logits.sum().backward()
    optimizer.step()
    directory = save_checkpoint(tmp_path / "step_1", model, tokenizer, {"step": 1, "optimizer": optimizer.state_dict(), "rng": rng_states(World.single())})
    expected = (random.random(), float(np.random.rand()), float(torch.rand(())))
    state = load_trainer_state(directory)
    restore_rng_states(state["rng"], World.single())
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == expected
    restored = torch.optim.AdamW(model.parameters(), lr=1e-3)
    restored.load_state_dict(state["optimizer"])
    assert all(
        torch.equal(restored.state_dict()["state"][0][key], optimizer.state_dict()["state"][0][key])
        for key in ("exp_avg", "exp_avg_sq")
    )


def test_the_tracker_runs_ids_are_kept_and_a_checkpoint_without_them_resumes_with_none(tmp_path, tiny_model_dir):
    model, tokenizer = load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    policy = (model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    world = World.single()
    written = write_checkpoint(world, tmp_path / "step_1", tokenizer, step=1, sampler=PromptSampler(4, 0), policy=policy, tracker_runs={"mlflow": "abc"})
    assert restore_training_state(world, written, policy)["trackers"] == {"mlflow": "abc"}
    state = torch.load(written / TRAINER_STATE, weights_only=True)
    del state["trackers"]  # as a pacs that kept no tracker ids wrote it (same format)
    torch.save(state, written / TRAINER_STATE)
    assert restore_training_state(world, written, policy)["trackers"] == {}


def test_each_rank_gets_its_own_saved_torch_random_state_back():
    first = torch.get_rng_state()
    torch.manual_seed(1234)
    second = torch.get_rng_state()
    states = {"python": random.getstate(), "numpy": list(np.random.get_state()), "torch": torch.stack([first, second])}
    states["numpy"][1] = states["numpy"][1].tolist()
    restore_rng_states(states, World(rank=1, world_size=2, device=torch.device("cpu"), strategy="ddp"))
    assert torch.equal(torch.get_rng_state(), second)


def test_saving_an_optimizer_that_has_not_stepped_leaves_it_unstepped(tmp_path, tiny_model_dir):
    """torch's get_optimizer_state_dict fills an empty state by stepping with zero gradients
    (AdamW step=1), which shrinks the first real update to 0.744x."""
    model = load_causal_lm(str(tiny_model_dir))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    save_optimizer_state(World.single(), model, optimizer, tmp_path / "optimizer")
    assert not optimizer.state and not (tmp_path / "optimizer").exists()


def test_optimizer_state_round_trips_through_files_of_bounded_size(tmp_path, tiny_model_dir, monkeypatch):
    model = load_causal_lm(str(tiny_model_dir))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    monkeypatch.setattr(checkpoint_module, "OPTIMIZER_FILE_BYTES", 100_000)
    save_optimizer_state(World.single(), model, optimizer, tmp_path / "optimizer")
    assert len(list((tmp_path / "optimizer").glob("*.safetensors"))) > 1

    restored = torch.optim.AdamW(model.parameters(), lr=1e-3)
    load_optimizer_state(World.single(), model, restored, tmp_path / "optimizer")
    assert restored.state.keys() == optimizer.state.keys()
    for parameter, state in optimizer.state.items():
        assert state.keys() == restored.state[parameter].keys()
        assert all(torch.equal(value, restored.state[parameter][key]) for key, value in state.items())


def test_a_checkpoint_refuses_to_replace_a_folder_that_is_not_a_checkpoint(tmp_path, tiny_model_dir):
    model, tokenizer = load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    (tmp_path / "out" / "sub").mkdir(parents=True)
    (tmp_path / "out" / "my_notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a pacs checkpoint"):
        save_checkpoint(tmp_path / "out", model, tokenizer, {"step": 1})
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["my_notes.txt", "sub"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]


def test_a_checkpoint_replaces_a_previous_one_and_keeps_the_output_marker(tmp_path, tiny_model_dir):
    model, tokenizer = load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    claim_output_dir(tmp_path / "model", "pacs sft")
    save_checkpoint(tmp_path / "model", model, tokenizer, {"step": 1})
    save_checkpoint(tmp_path / "model", model, tokenizer, {"step": 2})
    assert (tmp_path / "model" / MARKER).read_text() == "pacs sft\n"
    assert load_trainer_state(tmp_path / "model")["step"] == 2
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]
