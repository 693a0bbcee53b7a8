"""Typed run configuration: YAML plus dotted command-line overrides, validated up front.

    cfg = load_config("configs/demo.yaml", ["train.steps=20", "algorithm.beta=2.0"])

Every key has a type and a default; an unknown key, a value of the wrong type or an impossible
combination (a mini-batch that does not divide the batch, leave-one-out with one response per
prompt, ...) raises `ConfigError` naming the key, the value and what would be valid, before any
model is loaded. A YAML key given twice in one mapping, a boolean where a number belongs (YAML reads
`yes` as true) and a `reward.function` that cannot be imported are refused too. An empty section
(`train:` with nothing under it) keeps its defaults. `builtin:NAME` reads the recipe
`configs/NAME.yaml` shipped with pacs.

The `algorithm` section is the class that `algorithm.name` picks (`ALGORITHM_CONFIGS`): each
algorithm's options are the fields of its own class, another algorithm's option is refused by
name, and the class builds the algorithm (`BaseAlgorithmConfig.build`). Every field's docstring
is its description (`Config.model_fields[...].description`), the text of the configuration reference.
"""

from pacs.config.algorithms import (
    ALGORITHM_CONFIGS,
    DEFAULT_ALGORITHM,
    AlgorithmConfig,
    BaseAlgorithmConfig,
    ClippedPolicyGradientConfig,
)
from pacs.config.base import ConfigError
from pacs.config.loading import build_config, config_text, dump_config, load_config
from pacs.config.overrides import apply_overrides
from pacs.config.run import Config
from pacs.config.sections import (
    ASYNC_IS_CAP,
    CriticConfig,
    DataConfig,
    EvalConfig,
    HfConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
    TrainConfig,
    VllmConfig,
)

__all__ = [
    "ALGORITHM_CONFIGS",
    "DEFAULT_ALGORITHM",
    "ASYNC_IS_CAP",
    "AlgorithmConfig",
    "BaseAlgorithmConfig",
    "ClippedPolicyGradientConfig",
    "Config",
    "ConfigError",
    "CriticConfig",
    "DataConfig",
    "EvalConfig",
    "ModelConfig",
    "RewardConfig",
    "HfConfig",
    "RolloutConfig",
    "TrainConfig",
    "VllmConfig",
    "apply_overrides",
    "build_config",
    "config_text",
    "dump_config",
    "load_config",
]
