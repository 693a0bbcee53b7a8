"""What `pacs train` checks before it writes anything: every path and name the config gives.

`check_run_inputs` refuses, with `ConfigError` naming the key, a model or critic path that names
no model, a data spec that cannot load, and a reward function that does not import, so that a
mistyped input fails before an output folder is created (see `pacs.outputs`). It loads nothing
large: built-in models are not built and the hub is not asked.
"""

from __future__ import annotations

from pacs.config import Config, ConfigError
from pacs.data.loading import check_data_spec
from pacs.models.loading import check_model_path
from pacs.rewards import load_reward_function
from pacs.train import builtin_models  # noqa: F401  (registers builtin:tiny-arithmetic)


def _specs(value: str | list[str] | None) -> list[str]:
    return [] if value is None else [value] if isinstance(value, str) else list(value)


def check_run_inputs(config: Config) -> None:
    """Raise `ConfigError` listing every input of `config` that cannot be used."""
    checks = [("model.path", lambda: check_model_path(config.model.path))]
    if config.critic.path is not None:
        checks.append(("critic.path", lambda: check_model_path(config.critic.path)))
    for key, split in (("data.train", "train"), ("data.val", "val")):
        for spec in _specs(getattr(config.data, split)):
            checks.append((key, lambda spec=spec, split=split: check_data_spec(spec, default_split=split)))
    if config.reward.function is not None:
        checks.append(("reward.function", lambda: load_reward_function(config.reward.function)))
    problems = []
    for key, check in checks:
        try:
            check()
        except (ValueError, FileNotFoundError) as error:
            problems.append(f"  {key}: {error}")
    if problems:
        raise ConfigError("unusable inputs:\n" + "\n".join(problems))
