"""`algorithm.name` = `package.module:Class`: a user's algorithm section, imported as
`reward.function` is, validated and built before any model loads, with errors that name the path
and what is wrong. The usable section is the documentation's example (docs/examples/my_algorithm.py);
the unusable ones are in tests/helpers/plugin_algorithms.py."""

from __future__ import annotations

import pytest
from plugin_algorithms import EXAMPLES

from pacs.config import ConfigError, dump_config, load_config

EXAMPLE = "algorithm.name=my_algorithm:ReinforceConfig"


@pytest.fixture(autouse=True)
def examples_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def test_an_import_path_picks_the_users_section_with_its_own_typed_options():
    algorithm = load_config("builtin:demo", [EXAMPLE, "algorithm.baseline=none"]).algorithm
    assert (type(algorithm).__name__, algorithm.name, algorithm.baseline) == (
        "ReinforceConfig",
        "my_algorithm:ReinforceConfig",
        "none",
    )
    built = algorithm.build(group_size=4, max_response_length=16)
    assert (type(built).__name__, built.baseline, built.group_size, built.max_response_length) == ("Reinforce", "none", 4, 16)


def test_a_users_section_is_written_and_read_back_whole(tmp_path):
    config = load_config("builtin:demo", [EXAMPLE, "algorithm.baseline=none"])
    dump_config(config, tmp_path / "config.yaml")
    assert load_config(str(tmp_path / "config.yaml")) == config


def test_switching_to_a_users_algorithm_keeps_the_shared_options_and_drops_the_others():
    algorithm = load_config("builtin:demo", [EXAMPLE]).algorithm  # builtin:demo sets pacs's beta and weighting
    assert type(algorithm).__name__ == "ReinforceConfig"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("no_such_module:Thing", "algorithm.name='no_such_module:Thing': Cannot import module 'no_such_module'"),
        ("plugin_algorithms:Missing", "algorithm.name='plugin_algorithms:Missing': Module 'plugin_algorithms' has no attribute 'Missing'"),
        ("plugin_algorithms:NotAnAlgorithm", "'plugin_algorithms:NotAnAlgorithm' is not an algorithm's configuration: it names the class NotAnAlgorithm"),
        ("plugin_algorithms:Minimal", "'plugin_algorithms:Minimal' is not an algorithm's configuration"),
        ("plugin_algorithms:WithoutBuilds", "'plugin_algorithms:WithoutBuilds' is not an algorithm: WithoutBuilds sets no `builds`"),
        ("plugin_algorithms:BuildsNotAnAlgorithm", "BuildsNotAnAlgorithm builds NotAnAlgorithm, which has no prepare_update, micro_batch_loss"),
        ("plugin_algorithms:OptionNotTaken", "algorithm.temperature: an option of algorithm.name='plugin_algorithms:OptionNotTaken' that Minimal() takes no keyword for"),
        ("plugin_algorithms:NeedsAnUnknownTensor", "UnknownNeed.needs=frozenset({'advantages'}) must be a frozenset of entropy, ref_logprobs"),
        ("plugin_algorithms:NeedsACriticItCannotTrain", 'ValuesWithoutCriticLoss needs "values" (a critic) but has no critic_row_terms'),
    ],
    ids=["module-missing", "attribute-missing", "not-a-section", "an-algorithm-not-its-section", "no-builds",
         "builds-not-an-algorithm", "option-not-a-keyword", "unknown-need", "critic-without-its-loss"],
)  # fmt: skip
def test_an_unusable_import_path_is_refused_with_what_is_wrong(name, message):
    with pytest.raises(ConfigError, match="invalid configuration") as refused:
        load_config(None, [f"algorithm.name={name}"])
    assert message in " ".join(str(refused.value).split())


def test_an_unknown_option_of_a_users_algorithm_is_refused_with_its_options():
    with pytest.raises(ConfigError) as refused:
        load_config(None, [EXAMPLE, "algorithm.basline=none"])
    assert (
        "algorithm.basline: unknown option of algorithm.name='my_algorithm:ReinforceConfig' (did you mean 'baseline'?); "
        "its options: name, kl_coef," in str(refused.value)
    )


def test_a_users_option_of_the_wrong_value_is_named_by_its_key():
    with pytest.raises(ConfigError, match=r"algorithm\.baseline: Input should be 'group_mean' or 'none' \(got 'mean'\)"):
        load_config(None, [EXAMPLE, "algorithm.baseline=mean"])


def test_a_shared_option_the_algorithm_does_not_take_is_refused_unless_it_is_the_default():
    with pytest.raises(
        ConfigError,
        match=r"algorithm\.kl_coef=0\.1 with algorithm\.name='my_algorithm:ReinforceConfig': Reinforce\(\) takes no kl_coef",
    ):
        load_config(None, [EXAMPLE, "algorithm.kl_coef=0.1"])
    assert load_config(None, [EXAMPLE, "algorithm.kl_coef=0.0"]).algorithm.kl_coef == 0.0


def test_asynchronous_rollouts_need_a_users_algorithm_to_take_the_sampler_correction():
    with pytest.raises(ConfigError, match=r"algorithm\.rollout_is_cap=2\.0 with algorithm\.name='my_algorithm:ReinforceConfig'"):
        load_config(None, [EXAMPLE, "rollout.max_staleness=1"])


def test_a_constructor_that_refuses_its_options_fails_the_config_before_any_model_loads():
    with pytest.raises(ConfigError) as refused:
        load_config(None, ["algorithm.name=plugin_algorithms:RefusedByConstructor", "algorithm.limit=9", "rollout.n=4"])
    assert "algorithm.name='plugin_algorithms:RefusedByConstructor': Minimal(...) refused these options: limit=9 exceeds" in str(
        refused.value
    )


def test_pacs_compare_takes_a_users_algorithm_with_the_options_it_has():
    """`pacs compare --algorithms pacs,my_algorithm:ReinforceConfig` loads each method's config with
    `algorithm=` (`pacs.compare`): the recipe's pacs options are left out of the user's, and its own
    options come as overrides of its variant (`my_algorithm:ReinforceConfig[algorithm.baseline=none]`)."""
    algorithm = load_config(
        "builtin:compare-demo", ["algorithm.baseline=none"], algorithm="my_algorithm:ReinforceConfig"
    ).algorithm
    assert (type(algorithm).__name__, algorithm.baseline) == ("ReinforceConfig", "none")
