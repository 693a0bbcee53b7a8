"""Checkpoints are Hugging Face directories written durably and atomically, with a manifest that
resuming checks; resume picks the newest whole one."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from pacs.distributed.world import World
from pacs.models.loading import load_causal_lm, load_tokenizer
from pacs.models.saving import WEIGHTS_INDEX_FILE, write_safetensors_files
from pacs.outputs import MARKER, RunLocked, claim_output_dir, lock_run
from pacs.train.checkpointing import folders as checkpoint_folders
from pacs.train.checkpointing import state as checkpoint_module
from pacs.train.checkpointing.folders import (
    MANIFEST,
    SAMPLED_BLOCK_BYTES,
    SAMPLED_BLOCKS,
    checkpoint_problem,
    checkpoints_newest_first,
    link_checkpoint,
    remove_dead_staging,
    remove_older_checkpoints,
    sampled_crc32,
)
from pacs.train.checkpointing.state import (
    TRAINER_STATE,
    TRAINER_STATE_FORMAT,
    CheckpointError,
    load_optimizer_state,
    load_trainer_state,
    restore_rng_states,
    restore_training_state,
    rng_states,
    save_checkpoint,
    save_optimizer_state,
    write_checkpoint,
)
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
    assert sorted(path.name for path in tmp_path.iterdir()) == ["step_1"]  # no step_2, no staging folder
    assert [checkpoint.path for checkpoint in checkpoints_newest_first(tmp_path)] == [tmp_path / "step_1"]


def test_checkpoints_are_ordered_by_step_numerically_each_with_what_is_wrong_with_it(tmp_path):
    for step in (2, 10, 9):
        (tmp_path / f"step_{step}").mkdir()
        (tmp_path / f"step_{step}" / TRAINER_STATE).write_bytes(b"")  # written before manifests: taken as whole
    (tmp_path / "step_11").mkdir()
    found = [(checkpoint.path.name, checkpoint.problem is None) for checkpoint in checkpoints_newest_first(tmp_path)]
    assert found == [("step_11", False), ("step_10", True), ("step_9", True), ("step_2", True)]


def test_every_file_and_folder_is_fsynced_before_the_checkpoint_is_renamed_into_place(tmp_path, tiny_model_dir, monkeypatch):
    model, tokenizer = load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    synced, real_fsync, real_replace = set(), os.fsync, os.replace

    def fsync(descriptor):
        synced.add(os.readlink(f"/proc/self/fd/{descriptor}"))
        real_fsync(descriptor)

    def replace(source, target):
        if Path(source).name.startswith(".tmp-"):
            unsynced = [path for path in [Path(source), *Path(source).rglob("*")] if str(path) not in synced]
            assert not unsynced, f"renamed before these were fsynced: {unsynced}"
        real_replace(source, target)

    monkeypatch.setattr(checkpoint_folders.os, "fsync", fsync)
    monkeypatch.setattr(checkpoint_folders.os, "replace", replace)
    directory = save_checkpoint(tmp_path / "step_1", model, tokenizer, {"step": 1})
    assert str(tmp_path) in synced  # the rename itself, in the parent folder
    manifest = json.loads((directory / MANIFEST).read_text())
    assert manifest["step"] == 1
    assert set(manifest["files"]) == {str(path.relative_to(directory)) for path in directory.rglob("*") if path.is_file()} - {
        MANIFEST
    }


def test_a_cut_short_or_rewritten_file_is_named_as_the_checkpoints_problem(tmp_path, tiny_model_dir):
    model, tokenizer = load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    directory = save_checkpoint(tmp_path / "step_1", model, tokenizer, {"step": 1})
    assert checkpoint_problem(directory) is None
    weights = directory / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as handle:  # zeros at the last sampled block: a torn end
        handle.seek(size - SAMPLED_BLOCK_BYTES)
        handle.write(bytes(SAMPLED_BLOCK_BYTES))
    assert checkpoint_problem(directory) == "model.safetensors does not hold the bytes its manifest's checksum says"
    os.truncate(weights, size - 1)
    assert checkpoint_problem(directory) == f"model.safetensors holds {size - 1:,} bytes where its manifest says {size:,}"
    weights.unlink()
    assert checkpoint_problem(directory) == "model.safetensors is missing"


def flip_a_bit(path: Path, offset: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ 0x10]))


def test_one_flipped_bit_anywhere_in_a_checkpoint_file_is_named_as_its_problem(tmp_path, tiny_model_dir):
    model, tokenizer = load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    directory = save_checkpoint(tmp_path / "step_1", model, tokenizer, {"step": 1})
    weights = directory / "model.safetensors"
    assert weights.stat().st_size > SAMPLED_BLOCKS * SAMPLED_BLOCK_BYTES  # a bit no sampled block covers
    flip_a_bit(weights, SAMPLED_BLOCK_BYTES + 4321)
    assert checkpoint_problem(directory) == "model.safetensors does not hold the bytes its manifest's checksum says"
    assert checkpoint_problem(directory, contents=False) is None  # the sizes alone do not tell


def test_a_manifest_of_sampled_checksums_from_an_earlier_pacs_is_still_checked(tmp_path, tiny_model_dir):
    model, tokenizer = load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    directory = save_checkpoint(tmp_path / "step_1", model, tokenizer, {"step": 1})
    manifest = json.loads((directory / MANIFEST).read_text())
    for name, entry in manifest["files"].items():
        with open(directory / name, "rb") as handle:
            entry["crc32"] = sampled_crc32(handle, entry["bytes"])
    (directory / MANIFEST).write_text(json.dumps({**manifest, "format": 1}))
    assert checkpoint_problem(directory) is None
    flip_a_bit(directory / "model.safetensors", 10)  # in the first sampled block
    assert checkpoint_problem(directory) == "model.safetensors does not hold the bytes its manifest's checksum says"


def test_a_linked_checkpoint_shares_the_files_and_outlives_the_original(tmp_path, tiny_model_dir):
    model, tokenizer = load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    step = save_checkpoint(tmp_path / "step_2", model, tokenizer, {"step": 2})
    final = link_checkpoint(step, tmp_path / "final")
    assert os.path.samefile(final / "model.safetensors", step / "model.safetensors")
    remove_older_checkpoints(tmp_path, keep=0)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["final"]
    assert checkpoint_problem(final) is None and load_trainer_state(final)["step"] == 2


def test_only_the_newest_step_checkpoints_are_kept_and_final_always(tmp_path):
    for name in ("step_1", "step_2", "step_10", "step_3", "final"):
        (tmp_path / name).mkdir()
    removed = remove_older_checkpoints(tmp_path, keep=2)
    assert sorted(path.name for path in removed) == ["step_1", "step_2"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["final", "step_10", "step_3"]


@pytest.mark.slow
def test_a_second_writer_of_an_output_folder_is_refused_while_the_first_holds_its_lock(tmp_path):
    lock = lock_run(tmp_path)
    assert lock is not None
    other = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pacs.outputs import lock_run; lock_run(__import__('pathlib').Path(sys.argv[1]))",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert other.returncode != 0 and RunLocked.__name__ in other.stderr and f"pid {os.getpid()}" in other.stderr
    lock.close()
    again = subprocess.run(other.args, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr


class CreatesAFileWhenUnpickled:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def test_a_crafted_trainer_state_is_refused_without_running_its_code(tmp_path):
    checkpoint = tmp_path / "step_1"
    checkpoint.mkdir()
    witness = tmp_path / "pwned"
    torch.save(
        {"format": TRAINER_STATE_FORMAT, "step": 1, "payload": CreatesAFileWhenUnpickled(witness)}, checkpoint / TRAINER_STATE
    )
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
    directory = save_checkpoint(
        tmp_path / "step_1", model, tokenizer, {"step": 1, "optimizer": optimizer.state_dict(), "rng": rng_states(World.single())}
    )
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
    written = write_checkpoint(
        world, tmp_path / "step_1", tokenizer, step=1, sampler=PromptSampler(4, 0), policy=policy, tracker_runs={"mlflow": "abc"}
    )
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


def test_a_checkpoint_replaced_in_place_is_swapped_in_one_step_leaving_nothing_aside(tmp_path, tiny_model_dir, monkeypatch):
    model, tokenizer = load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    save_checkpoint(tmp_path / "final", model, tokenizer, {"step": 1})
    renamed, real_replace = [], os.replace

    def replace(source, target):
        if Path(source).parent == tmp_path:  # a checkpoint folder renamed: the two-rename path
            renamed.append((source, target))
        real_replace(source, target)

    monkeypatch.setattr(checkpoint_folders.os, "replace", replace)
    save_checkpoint(tmp_path / "final", model, tokenizer, {"step": 2})
    assert renamed == []
    assert load_trainer_state(tmp_path / "final")["step"] == 2 and checkpoint_problem(tmp_path / "final") is None
    assert sorted(path.name for path in tmp_path.iterdir()) == ["final"]


def test_a_kill_between_two_renames_keeps_the_previous_copy_and_says_where(tmp_path, tiny_model_dir):
    model, tokenizer = load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    save_checkpoint(tmp_path / "step_1", model, tokenizer, {"step": 1})
    save_checkpoint(tmp_path / "step_2", model, tokenizer, {"step": 2})
    (tmp_path / "step_2").rename(tmp_path / ".old-step_2-999999")  # as a kill after the first rename leaves it
    (tmp_path / ".tmp-step_3-999999").mkdir()
    notes = remove_dead_staging(tmp_path)
    assert notes == [
        f"kept {tmp_path / '.old-step_2-999999'}: it holds step_2, which a killed save was replacing; rename it to "
        f"{tmp_path / 'step_2'} to resume from it",
        f"removed {tmp_path / '.tmp-step_3-999999'}, left by a save that was killed",
    ]
    assert sorted(path.name for path in tmp_path.iterdir()) == [".old-step_2-999999", "step_1"]
