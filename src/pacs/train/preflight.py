"""What `pacs train` checks before it writes anything: every path and name the config gives.

`check_run_inputs` refuses, with `ConfigError` naming the key, a model or critic path that names
no model, a data spec that cannot load, a reward function that does not import, and a tracker of
`train.report_to` whose package is not installed (naming the pacs extra), so that a
mistyped input fails before an output folder is created (see `pacs.outputs`). It loads nothing
large: built-in models are not built and the hub is not asked.

On several nodes, rank 0 checks them all; every other node checks what it reads from its own
disk (`check_node_inputs`: the model path, whose tokenizer every node loads, the data and the
reward function), which must be at the same paths on every node.
"""

from __future__ import annotations

from typing import Callable

from pacs.config import Config, ConfigError
from pacs.data.loading import check_data_spec
from pacs.models.loading import check_model_path
from pacs.rewards import load_reward_function
from pacs.train.trackers import check_tracker_packages


def _specs(value: str | list[str] | None) -> list[str]:
    return [] if value is None else [value] if isinstance(value, str) else list(value)


def check_run_inputs(config: Config) -> None:
    """Raise `ConfigError` listing every input of `config` that cannot be used."""
    critic_check = [("critic.path", lambda: check_model_path(config.critic.path))] if config.critic.path else []
    tracker_check = [("train.report_to", lambda: check_tracker_packages(config.train.report_to))]
    _refuse_unusable(_node_input_checks(config) + critic_check + tracker_check)


def check_node_inputs(config: Config) -> None:
    """Raise `ConfigError` listing every input that each node reads from its own disk (all but
    `critic.path`, which rank 0 alone loads) and cannot use here."""
    _refuse_unusable(_node_input_checks(config))


def _node_input_checks(config: Config) -> list[tuple[str, Callable[[], object]]]:
    checks: list[tuple[str, Callable[[], object]]] = [("model.path", lambda: check_model_path(config.model.path))]
    for key, split in (("data.train", "train"), ("data.val", "val")):
        for spec in _specs(getattr(config.data, split)):
            checks.append((key, lambda spec=spec, split=split: check_data_spec(spec, default_split=split)))
    if config.reward.function is not None:
        checks.append(("reward.function", lambda: load_reward_function(config.reward.function)))
    return checks


def _refuse_unusable(checks: list[tuple[str, Callable[[], object]]]) -> None:
    problems = []
    for key, check in checks:
        try:
            check()
        except (ValueError, FileNotFoundError) as error:
            problems.append(f"  {key}: {error}")
    if problems:
        raise ConfigError("unusable inputs:\n" + "\n".join(problems))
