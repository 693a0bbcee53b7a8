"""Policy, reference and critic load with dropout off, so every pass of one policy is one function."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, GPT2Config, GPT2LMHeadModel

from pacs.models.loading import load_causal_lm, load_value_model


@pytest.fixture(scope="module")
def gpt2_style_dir(tmp_path_factory):
    """A small GPT-2 model: its config carries three dropout probabilities of 0.1."""
    directory = tmp_path_factory.mktemp("gpt2") / "model"
    config = GPT2Config(vocab_size=101, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    assert config.attn_pdrop == config.resid_pdrop == config.embd_pdrop == 0.1
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(directory)
    return directory


def train_mode_outputs_twice(model, output: str):
    model.train()
    input_ids = torch.randint(1, 101, (3, 12))
    first, second = (getattr(model(input_ids=input_ids), output) for _ in range(2))
    return first, second


def test_a_policy_with_dropout_in_its_config_loads_with_dropout_off(gpt2_style_dir):
    model = load_causal_lm(str(gpt2_style_dir))
    first, second = train_mode_outputs_twice(model, "logits")
    assert torch.equal(first, second)
    assert all(module.p == 0 for module in model.modules() if isinstance(module, torch.nn.Dropout))


def test_a_saved_policy_records_dropout_off(gpt2_style_dir, tmp_path):
    load_causal_lm(str(gpt2_style_dir)).save_pretrained(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path)
    assert config.attn_pdrop == config.resid_pdrop == config.embd_pdrop == 0.0


def test_the_critics_value_head_has_no_dropout(tiny_model_dir):
    critic = load_value_model(str(tiny_model_dir))
    first, second = train_mode_outputs_twice(critic, "logits")
    assert torch.equal(first, second)
    assert critic.config.classifier_dropout == 0.0


def test_attention_dropout_read_at_call_time_is_zero(tiny_model_dir, tmp_path):
    config = AutoConfig.from_pretrained(tiny_model_dir)
    config.attention_dropout = 0.5
    config.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").symlink_to(tiny_model_dir / "model.safetensors")
    model = load_causal_lm(str(tmp_path))
    first, second = train_mode_outputs_twice(model, "logits")
    assert torch.equal(first, second)
