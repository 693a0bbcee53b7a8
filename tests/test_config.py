"""Configuration errors name the key, the value and what would be valid — before any model loads."""

from __future__ import annotations

import pytest

from pacs.config import ConfigError, load_config


def test_defaults_and_overrides_are_typed():
    config = load_config(None, ["train.lr=1e-6", "rollout.n=4", "data.train=[builtin:arithmetic, x.jsonl]"])
    assert config.train.lr == pytest.approx(1e-6)
    assert config.rollout.n == 4
    assert config.data.train == ["builtin:arithmetic", "x.jsonl"]


def test_builtin_demo_recipe_loads():
    assert load_config("builtin:demo").algorithm.name == "pacs"


def test_unknown_key_suggests_the_closest_valid_one():
    with pytest.raises(ConfigError, match=r"train\.stepz: unknown key \(did you mean 'steps'\?\)"):
        load_config(None, ["train.stepz=3"])


def test_unknown_top_level_key_lists_valid_keys():
    with pytest.raises(ConfigError, match="valid keys here: output_dir, seed"):
        load_config(None, ["optimiser=adam"])


def test_wrong_type_names_key_and_value():
    with pytest.raises(ConfigError, match=r"train\.steps: .*valid integer.*'many'"):
        load_config(None, ["train.steps=many"])


def test_unknown_choice_lists_valid_values():
    with pytest.raises(ConfigError, match=r"algorithm\.estimator: Input should be 'rloo', 'grpo' or 'naive'"):
        load_config(None, ["algorithm.estimator=ppo"])


def test_mini_batch_must_divide_batch():
    with pytest.raises(ConfigError, match=r"train\.mini_batch_size=5 must divide train\.batch_size=32"):
        load_config(None, ["train.mini_batch_size=5"])


def test_leave_one_out_needs_two_responses_per_prompt():
    with pytest.raises(ConfigError, match=r"rollout\.n=1 .*at least 2 responses"):
        load_config(None, ["rollout.n=1"])


def test_one_response_per_prompt_is_fine_without_a_group_baseline():
    assert load_config(None, ["rollout.n=1", "algorithm.estimator=naive"]).rollout.n == 1


def test_non_positive_learning_rate_is_rejected():
    with pytest.raises(ConfigError, match=r"train\.lr: Input should be greater than 0"):
        load_config(None, ["train.lr=0"])


def test_override_without_equals_sign_is_rejected():
    with pytest.raises(ConfigError, match="not of the form key=value"):
        load_config(None, ["train.steps"])


def test_override_into_a_scalar_of_the_file_is_rejected():
    with pytest.raises(ConfigError, match="'seed' is not a section"):
        load_config("builtin:demo", ["seed.value=1"])


def test_override_of_a_scalar_with_a_mapping_is_a_type_error():
    with pytest.raises(ConfigError, match=r"seed: Input should be a valid integer \(got \{'value': 1\}\)"):
        load_config(None, ["seed.value=1"])


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="config file not found: .*nope.yaml"):
        load_config(str(tmp_path / "nope.yaml"))


def test_invalid_yaml_is_reported_with_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml is not valid YAML"):
        load_config(str(path))


def test_unknown_builtin_recipe_lists_the_shipped_ones():
    with pytest.raises(ConfigError, match="valid: .*builtin:demo"):
        load_config("builtin:nothing")


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as error:
        load_config(None, ["train.steps=0", "rollout.top_p=2"])
    assert "train.steps" in str(error.value) and "rollout.top_p" in str(error.value)


def test_a_training_nucleus_is_refused_because_log_probs_describe_the_full_softmax():
    with pytest.raises(ConfigError, match=r"rollout.top_p=0.9: .*Set rollout.top_p=1.0"):
        load_config(None, ["rollout.top_p=0.9"])
    assert load_config(None, ["eval.top_p=0.9"]).eval.top_p == 0.9


def test_k1_as_a_kl_loss_is_refused_with_the_valid_estimators():
    with pytest.raises(ConfigError, match=r"algorithm.kl_estimator 'k1' with kl_coef=0.1: .*'k2'.*'k3'"):
        load_config(None, ["algorithm.kl_coef=0.1", "algorithm.kl_estimator=k1"])
    assert load_config(None, ["algorithm.kl_coef=0", "algorithm.kl_estimator=k1"]).algorithm.kl_estimator == "k1"


def test_impossible_combinations_are_reported_with_the_field_errors():
    with pytest.raises(ConfigError) as error:
        load_config(None, ["train.steps=abc", "train.batch_size=30", "train.mini_batch_size=7", "rollout.n=1"])
    message = str(error.value)
    assert "train.steps" in message
    assert "train.mini_batch_size=7 must divide train.batch_size=30" in message
    assert "rollout.n=1" in message


def test_a_combination_involving_a_rejected_field_is_not_reported_with_its_default():
    with pytest.raises(ConfigError) as error:
        load_config(None, ["train.batch_size=abc", "train.mini_batch_size=7"])
    assert "must divide" not in str(error.value)
