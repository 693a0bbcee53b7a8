"""Checkpoints are Hugging Face directories written atomically; resume picks the newest complete one."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from pacs.models.loading import load_causal_lm, load_tokenizer
from pacs.train.checkpoint import TRAINER_STATE, latest_checkpoint, save_checkpoint


def test_checkpoint_is_a_plain_hugging_face_directory(tmp_path, tiny_model_dir):
    model, tokenizer = load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    directory = save_checkpoint(tmp_path / "step_1", model, tokenizer, {"step": 1})
    assert (directory / "model.safetensors").is_file() and (directory / TRAINER_STATE).is_file()
    AutoModelForCausalLM.from_pretrained(directory)
    assert AutoTokenizer.from_pretrained(directory).chat_template


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
