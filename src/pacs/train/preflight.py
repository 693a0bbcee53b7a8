"""What `pacs train` checks before it writes anything or loads a model: every input the config names.

`check_run_inputs` refuses, with one `ConfigError` listing every problem by key, a model or critic
path that names no model or cannot be reached (`check_model_reachable`: a hub id neither served
nor cached, a local model without a tokenizer), a data spec that does not load or whose rows do
not all follow the row schema (every row is read), data whose `data_source` no reward function
scores, a reward function that does not import, does not take the verl signature or does not
answer one real row with a score (`pacs.rewards.checks.check_scoring`), a tracker of
`train.report_to` whose package is not installed (naming the pacs extra), and with
`rollout.engine=vllm` a vLLM that is missing or built for another device, and with
`rollout.tool_format=chat` a model whose chat template cannot carry the format, so that a mistaken
input fails before an output folder is created (see `pacs.outputs`). Then, once all of those are
usable, data whose every prompt (of `data.train`, or of `data.val`) is longer than
`data.max_prompt_length` through the model's tokenizer (`check_some_prompt_fits`). It loads no model:
the hub is asked once per hub id, and only that last check loads the tokenizer (building a
built-in model into the pacs cache on first use, as the run would; never into output_dir).

On several nodes, rank 0 checks them all; every other node checks what it reads from its own
disk (`check_node_inputs`: the model path, whose tokenizer every node loads, the data, the reward
function's import and vLLM's install), which must be at the same paths on every node.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from pacs.config import Config, ConfigError, DataConfig, load_config
from pacs.data.loading import load_rows, row_location
from pacs.data.prompts import check_some_prompt_fits
from pacs.models.loading import BUILTIN_PREFIX, check_model_reachable, load_tokenizer
from pacs.outputs import unusable_inputs
from pacs.plugins import PYTHON_TOOL, import_function
from pacs.rewards import load_reward_function
from pacs.rewards.checks import check_scoring
from pacs.rollout.multiturn import tool_format_of
from pacs.rollout.vllm import check_vllm_usable
from pacs.sandbox import check_sandbox
from pacs.train.trackers import check_tracker_packages


def _specs(value: str | list[str] | None) -> list[str]:
    return [] if value is None else [value] if isinstance(value, str) else list(value)


def check_run_inputs(config: Config) -> None:
    """Raise `ConfigError` listing every input of `config` that cannot be used."""
    rows_by_spec: dict[str, list[dict]] = {}
    critic_check = (
        [("critic.path", lambda: check_model_reachable(config.critic.path, needs_tokenizer=False))] if config.critic.path else []
    )
    scoring_check = ("reward.function" if config.reward.function else "data", lambda: _check_scoring(config, rows_by_spec))
    tracker_check = ("train.report_to", lambda: check_tracker_packages(config.train.report_to))
    _refuse_unusable([*_node_input_checks(config, rows_by_spec), *critic_check, scoring_check, tracker_check])
    _refuse_unusable(_prompt_length_checks(config, rows_by_spec))  # last: it loads the tokenizer


def _prompt_length_checks(config: Config, rows_by_spec: dict[str, list[dict]]) -> list[tuple[str, Callable[[], object]]]:
    """A check per split (`data.train`, `data.val`) that some prompt of its rows fits
    `data.max_prompt_length` through the model's tokenizer (loaded once, by the first)."""
    tokenizer = functools.cache(lambda: load_tokenizer(config.model.path))
    checks: list[tuple[str, Callable[[], object]]] = []
    for key, split in (("data.train", "train"), ("data.val", "val")):
        if specs := _specs(getattr(config.data, split)):
            rows = {spec: rows_by_spec[spec] for spec in specs}
            checks.append((key, lambda rows=rows: check_some_prompt_fits(tokenizer(), rows, config.data.max_prompt_length)))
    return checks


def load_run_config(source: str | None, overrides: Sequence[str] = (), *, algorithm: str | None = None) -> Config:
    """`load_config` (`pacs train`, `pacs compare`, `pacs demo`), whose refusal of a configuration that does not validate also lists the data
    files it names (`data.train`, `data.val`, as given or by default) that do not load, after the
    configuration's own problems: one refusal for both, before anything is written or loaded."""
    try:
        return load_config(source, overrides, algorithm=algorithm)
    except ConfigError as error:
        if error.settings is None:
            raise
        data_problems = unusable_inputs(_data_checks(error.settings.get("data")))
        if data_problems is None:
            raise
        raise ConfigError(f"{error}\n{data_problems}") from None


def _data_checks(data: object) -> list[tuple[str, Callable[[], object]]]:
    """A check per data spec that the `data` section (a mapping, as given) names; a spec that is
    not text is left to the configuration's own message."""
    section = data if isinstance(data, dict) else {}
    checks: list[tuple[str, Callable[[], object]]] = []
    for key, split in (("data.train", "train"), ("data.val", "val")):
        value = section.get(split, DataConfig.model_fields[split].default)
        specs = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        for spec in specs:
            if isinstance(spec, str):
                checks.append((key, lambda spec=spec, split=split: load_rows(spec, default_split=split)))
    return checks


def check_node_inputs(config: Config) -> None:
    """Raise `ConfigError` listing every input that each node reads from its own disk (all but
    `critic.path`, which rank 0 alone loads) and cannot use here."""
    _refuse_unusable(_node_input_checks(config, {}))


def _node_input_checks(config: Config, rows_by_spec: dict[str, list[dict]]) -> list[tuple[str, Callable[[], object]]]:
    """The checks of what every node reads; each data spec's rows, once read, go into `rows_by_spec`."""
    checks: list[tuple[str, Callable[[], object]]] = [("model.path", lambda: check_model_reachable(config.model.path))]
    for key, split in (("data.train", "train"), ("data.val", "val")):
        for spec in _specs(getattr(config.data, split)):

            def read(spec: str = spec, split: str = split) -> None:
                rows_by_spec[spec] = load_rows(spec, default_split=split)

            checks.append((key, read))
    if config.reward.function is not None:
        checks.append(("reward.function", lambda: load_reward_function(config.reward.function)))
    if config.rollout.tools not in (None, PYTHON_TOOL):
        checks.append(("rollout.tools", lambda: import_function(config.rollout.tools, "tool")))
    if config.rollout.tools == PYTHON_TOOL:
        checks.append(("rollout.tool_sandbox", lambda: check_sandbox(config.rollout.tool_sandbox)))
    if config.rollout.tools is not None and config.rollout.tool_format == "chat":
        checks.append(("rollout.tool_format", lambda: _check_chat_template(config)))
    if config.rollout.engine == "vllm":
        checks.append(("rollout.engine", check_vllm_usable))
    return checks


def _check_chat_template(config: Config) -> None:
    """The chat tool format's check of the model's chat template (`tool_format_of`), on its tokenizer
    alone; not for a built-in model (not built here: `check_built_model` checks it once it is) nor
    one that cannot be reached (already reported under model.path)."""
    try:
        check_model_reachable(config.model.path)
    except (ValueError, FileNotFoundError):
        return
    if not config.model.path.startswith(BUILTIN_PREFIX):
        tool_format_of(config.rollout, load_tokenizer(config.model.path))


def check_built_model(config: Config) -> None:
    """Raise `ConfigError` when a built-in `model.path`, once built (`resolve_model_path`), cannot
    serve the run: with `rollout.tool_format=chat`, a chat template that cannot carry the format
    (`tool_format_of`), which `check_run_inputs` leaves to this check."""
    if config.model.path.startswith(BUILTIN_PREFIX) and config.rollout.tools is not None and config.rollout.tool_format == "chat":
        _refuse_unusable([("rollout.tool_format", lambda: tool_format_of(config.rollout, load_tokenizer(config.model.path)))])


def _check_scoring(config: Config, rows_by_spec: dict[str, list[dict]]) -> None:
    """`check_scoring` on the rows that loaded, unless the reward function does not even import
    (already reported under reward.function)."""
    if config.reward.function is not None:
        try:
            load_reward_function(config.reward.function)
        except ValueError:
            return
    reward = config.reward
    check_scoring(
        rows_by_spec, reward.function, timeout_s=reward.timeout_s, memory_limit_mib=reward.memory_limit_mib, where=row_location
    )


def _refuse_unusable(checks: list[tuple[str, Callable[[], object]]]) -> None:
    if problems := unusable_inputs(checks):
        raise ConfigError(problems)
