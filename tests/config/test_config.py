"""Configuration errors name the key, the value and what would be valid — before any model loads."""

from __future__ import annotations

import importlib.resources

import pytest
from pydantic import BaseModel

from pacs.config import ALGORITHM_CONFIGS, Config, ConfigError, RolloutConfig, load_config


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


def test_a_builtin_recipe_from_an_uninstalled_source_tree_says_to_install_pacs(monkeypatch):
    def no_configs_package(anchor):
        raise ModuleNotFoundError(f"No module named {anchor!r}")

    monkeypatch.setattr(importlib.resources, "files", no_configs_package)
    with pytest.raises(ConfigError, match=r"cannot read 'builtin:demo'.*uninstalled source tree.*pip install -e \."):
        load_config("builtin:demo")


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


def test_a_key_given_twice_is_refused_naming_the_key_and_both_lines(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("train:\n  steps: 5\nseed: 1\ntrain:\n  lr: 0.001\n")
    with pytest.raises(ConfigError, match=r"twice.yaml: key 'train' is given twice in one mapping, on lines 1 and 4"):
        load_config(str(path))


def test_a_key_given_twice_inside_a_section_is_refused(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("train:\n  steps: 5\n  steps: 6\n")
    with pytest.raises(ConfigError, match=r"key 'steps' is given twice in one mapping, on lines 2 and 3"):
        load_config(str(path))


@pytest.mark.parametrize(
    "key",
    [
        "algorithm.kl_coef",
        "algorithm.entropy_coef",
        "train.weight_decay",
        "algorithm.clip_high",
        "train.grad_clip",
        "algorithm.value_clip",
        "algorithm.dual_clip",
    ],
)
@pytest.mark.parametrize("value", [".inf", ".nan"])
def test_an_infinite_or_nan_coefficient_is_refused(key, value):
    with pytest.raises(ConfigError, match=rf"{key}: Input should be a finite number"):
        load_config(None, ["algorithm.name=ppo", f"{key}={value}"])


@pytest.mark.parametrize("override", ["train.steps=yes", "train.lr=true", "algorithm.dual_clip=on"])
def test_a_boolean_where_a_number_belongs_is_refused(override):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{key}: expected a number, got True"):
        load_config(None, ["algorithm.name=ppo", override])


def test_an_empty_section_keeps_its_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("train:\nseed: 3\n")
    assert load_config(str(path)).train.steps == 40
    assert load_config(str(path), ["train.steps=5"]).train.steps == 5


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_xyz:score", "Cannot import module 'no_such_module_xyz'"),
        ("math:no_such_function", "Module 'math' has no attribute 'no_such_function'"),
        ("my rewards.py", "must be written 'package.module:function'"),
    ],
)
def test_a_reward_function_that_cannot_be_imported_is_refused_when_the_config_loads(spec, message):
    with pytest.raises(ConfigError, match=rf"reward.function: .*{message}"):
        load_config(None, [f"reward.function={spec}"])


def test_an_importable_reward_function_loads():
    assert load_config(None, ["reward.function=math:isclose"]).reward.function == "math:isclose"


def test_the_scoring_memory_limit_defaults_to_the_workers_and_may_be_lifted():
    from pacs.rewards.workers import DEFAULT_MEMORY_LIMIT_MIB

    assert load_config(None).reward.memory_limit_mib == DEFAULT_MEMORY_LIMIT_MIB
    assert load_config(None, ["reward.memory_limit_mib=null"]).reward.memory_limit_mib is None


def test_k1_in_the_reward_is_accepted():
    config = load_config(
        None, ["algorithm.name=ppo", "algorithm.kl_coef=0.1", "algorithm.kl_estimator=k1", "algorithm.kl_in_reward=true"]
    )
    assert config.algorithm.kl_in_reward


def test_kl_in_reward_needs_a_coefficient():
    with pytest.raises(ConfigError, match=r"algorithm.kl_in_reward=true .*any algorithm but pacs.*kl_coef > 0"):
        load_config(None, ["algorithm.name=grpo", "algorithm.kl_coef=0", "algorithm.kl_in_reward=true"])


def either(names: list[str]) -> str:
    """`names` as the messages list them: "a, b or c"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def owners(option: str) -> str:
    """The built-ins that take `option`, in the registry's order, as the messages list them."""
    return either([name for name, section in ALGORITHM_CONFIGS.items() if option in section.model_fields])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algorithm.name=pacs", "algorithm.clip_low=0.1"],
            f"algorithm.clip_low: an option of {owners('clip_low')}, not of algorithm.name='pacs'",
        ),
        (
            ["algorithm.kl_coef=0.1", "algorithm.kl_in_reward=true"],
            f"algorithm.kl_in_reward: an option of {owners('kl_in_reward')}, not of algorithm.name='pacs'",
        ),
        (
            ["algorithm.name=grpo", "algorithm.gamma=0.5"],
            f"algorithm.gamma: an option of {owners('gamma')}, not of algorithm.name='grpo'",
        ),
    ],
    ids=["clip_low-with-pacs", "kl_in_reward-with-pacs", "gamma-with-grpo"],
)
def test_another_algorithms_option_is_refused_naming_the_option_and_the_algorithm(overrides, message):
    with pytest.raises(ConfigError, match=rf"{message}; valid keys here: name, "):
        load_config(None, overrides)


def test_an_override_that_switches_the_algorithm_keeps_the_options_it_shares_with_the_recipes():
    algorithm = load_config("builtin:paper-grpo-qwen2.5-7b", ["algorithm.name=ppo", "algorithm.gamma=0.9"]).algorithm
    assert (algorithm.name, algorithm.dual_clip, algorithm.loss_scale, algorithm.gamma) == ("ppo", 3.0, 8.0, 0.9)
    with pytest.raises(ConfigError, match=r"algorithm.beta: an option of pacs, not of algorithm.name='ppo'"):
        load_config("builtin:demo", ["algorithm.name=ppo", "algorithm.beta=2"])


def test_a_misspelled_option_of_another_algorithm_is_suggested_with_its_algorithms():
    with pytest.raises(
        ConfigError,
        match=rf"algorithm.clip_lo: unknown key \(did you mean 'clip_low', an option of {owners('clip_low')}\?\)",
    ):
        load_config(None, ["algorithm.clip_lo=0.1"])


def test_an_unknown_algorithm_lists_the_valid_ones():
    with pytest.raises(
        ConfigError,
        match=rf"algorithm.name: Input should be {either([repr(name) for name in ALGORITHM_CONFIGS])} \(got 'dpo'\)",
    ):
        load_config(None, ["algorithm.name=dpo"])


def test_an_algorithm_section_without_a_name_is_pacs(tmp_path):
    path = tmp_path / "beta.yaml"
    path.write_text("algorithm:\n  beta: 2.0\n")
    assert (load_config(str(path)).algorithm.name, load_config(str(path)).algorithm.beta) == ("pacs", 2.0)


def test_each_algorithm_is_built_from_its_own_section_with_every_option():
    algorithm = load_config(None, ["algorithm.name=grpo", "algorithm.clip_low=0.1", "algorithm.norm_by_std=false"]).algorithm
    built = algorithm.build(group_size=4, max_response_length=8)
    assert (type(built).__name__, built.clip_low, built.norm_by_std, built.max_response_length) == ("GRPO", 0.1, False, 8)
    for name, section in ALGORITHM_CONFIGS.items():
        assert type(section().build(group_size=4, max_response_length=8)) is section.builds
        assert section.builds.__module__ == f"pacs.algos.{name}"


def test_every_option_has_a_description():
    sections = [Config, *ALGORITHM_CONFIGS.values()]
    sections += [
        field.annotation
        for field in Config.model_fields.values()
        if isinstance(field.default, BaseModel) and isinstance(field.annotation, type)
    ]
    sections += [RolloutConfig.model_fields["vllm"].annotation]
    undocumented = [
        f"{section.__name__}.{name}"
        for section in sections
        for name, field in section.model_fields.items()
        if not field.description
    ]
    assert undocumented == []


@pytest.mark.parametrize("key", ["algorithm.loss_scale", "algorithm.critic_loss_scale", "critic.grad_clip"])
def test_loss_scales_and_the_critic_clip_must_be_positive(key):
    with pytest.raises(ConfigError, match=rf"{key}: Input should be greater than 0"):
        load_config(None, ["algorithm.name=ppo", f"{key}=0"])


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


def test_the_rollout_is_correction_needs_the_vllm_engine():
    with pytest.raises(
        ConfigError,
        match="algorithm.rollout_is_cap=2.0 with rollout.engine='hf': the correction needs the sampler's own log-probs",
    ):
        load_config(None, ["algorithm.rollout_is_cap=2"])
    assert load_config(None, ["algorithm.rollout_is_cap=2", "rollout.engine=vllm"]).algorithm.rollout_is_cap == 2.0


def test_the_rollout_is_level_defaults_to_tokens_and_pacs_to_whole_responses():
    pacs, grpo = load_config(None).algorithm, load_config(None, ["algorithm.name=grpo"]).algorithm
    assert (pacs.rollout_is_mode, pacs.rollout_is_level, pacs.rollout_is_floor) == ("truncate", "sequence", None)
    assert (grpo.rollout_is_mode, grpo.rollout_is_level, grpo.rollout_is_floor) == ("truncate", "token", None)


def test_the_mask_modes_options_reach_the_algorithm():
    vllm_mask = [
        "rollout.engine=vllm",
        "algorithm.rollout_is_cap=4",
        "algorithm.rollout_is_mode=mask",
        "algorithm.rollout_is_floor=0.5",
    ]
    grpo = load_config(None, [*vllm_mask, "algorithm.name=grpo", "algorithm.rollout_is_level=sequence"]).algorithm.build(
        4, max_response_length=8
    )
    pacs = load_config(None, vllm_mask).algorithm.build(4, max_response_length=8)
    assert (grpo.rollout_is_mode, grpo.rollout_is_level, grpo.rollout_is_floor) == ("mask", "sequence", 0.5)
    assert (pacs.rollout_is_mode, pacs.rollout_is_floor) == ("mask", 0.5)


def test_pacs_refuses_the_token_level_naming_the_key_and_the_valid_level():
    with pytest.raises(ConfigError, match="algorithm.rollout_is_level='token' is not valid here; valid: 'sequence'"):
        load_config(None, ["algorithm.rollout_is_level=token"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.rollout_is_mode=mask"], "algorithm.rollout_is_mode='mask' needs rollout_is_cap"),
        (
            ["rollout.engine=vllm", "algorithm.rollout_is_cap=2", "algorithm.rollout_is_floor=0.5"],
            "algorithm.rollout_is_floor=0.5 with rollout_is_mode='truncate': the floor is the bottom of mask mode's kept range",
        ),
        (["algorithm.rollout_is_floor=1.5"], r"algorithm.rollout_is_floor: Input should be less than or equal to 1 \(got 1.5\)"),
        (["algorithm.rollout_is_mode=clip"], r"algorithm.rollout_is_mode: Input should be 'truncate' or 'mask' \(got 'clip'\)"),
        (
            ["algorithm.name=grpo", "algorithm.rollout_is_level=geometric"],
            r"algorithm.rollout_is_level: Input should be 'token', 'sequence' or 'geometric_mean' \(got 'geometric'\)",
        ),
    ],
)
def test_rollout_is_options_that_cannot_work_are_refused_by_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_an_error_without_a_config_file_says_no_config_was_given():
    with pytest.raises(ConfigError, match=r"^invalid configuration \(no --config given: the defaults and the overrides\):"):
        load_config(None, ["train.stpes=3"])
