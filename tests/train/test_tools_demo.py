"""`builtin:tools-demo`: the recipe of the built-in tool task (docs/tools.md)."""

from __future__ import annotations

import pytest

from pacs.config import load_config
from pacs.data.arithmetic import generate_multiplications
from pacs.data.loading import load_rows
from pacs.models.tiny import build_char_tokenizer
from pacs.train.builtin_models import tool_demonstration
from pacs.train.metrics import read_metrics
from pacs.train.sft import demonstration_tokens
from pacs.train.trainer import train


def test_the_recipe_calls_the_python_tool_in_the_chat_format_once_then_answers():
    config = load_config("builtin:tools-demo")
    assert (config.rollout.tools, config.rollout.tool_format, config.rollout.max_turns) == ("python", "chat", 2)
    assert config.model.path == "builtin:tiny-tools"
    assert load_rows(config.data.train, default_split="train")[0]["extra_info"]["expression"].count("*") == 1


def test_prompts_and_a_whole_tool_using_demonstration_fit_the_recipes_lengths():
    config = load_config("builtin:tools-demo")
    tokenizer = build_char_tokenizer()
    row = max(generate_multiplications("val", 200), key=lambda row: len(row["reward_model"]["ground_truth"]))
    prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
    response, _ = demonstration_tokens(tokenizer, row["prompt"], tool_demonstration(row))
    assert len(tokenizer(prompt, add_special_tokens=False)["input_ids"]) <= config.data.max_prompt_length
    assert len(response) <= config.data.max_response_length


@pytest.mark.slow
def test_builtin_tools_demo_trains_two_steps_reporting_its_tool_use(tmp_path, tiny_model_dir):
    """With the random-initialised tiny model in place of builtin:tiny-tools, whose warm-start takes
    minutes: the recipe's data, format and limits run as shipped."""
    config = load_config(
        "builtin:tools-demo", [f"output_dir={tmp_path / 'run'}", f"model.path={tiny_model_dir}", "train.steps=2", "data.val=null"]
    )
    result = train(config, show_progress=False)
    assert (result.final_checkpoint / "model.safetensors").is_file()
    steps = [row for row in read_metrics(tmp_path / "run") if "rollout/tool_calls_mean" in row]
    assert [row["step"] for row in steps] == [1, 2]
