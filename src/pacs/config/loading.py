"""Reading a configuration: a YAML file or `builtin:NAME` (duplicate keys refused), overrides
applied, validated into `Config`; and writing one back.
"""

from __future__ import annotations

import importlib.resources
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ValidationError,
)

from pacs.config.algorithms import ALGORITHM_CONFIGS, BaseAlgorithmConfig, algorithm_name, plugin_section
from pacs.config.base import ConfigError
from pacs.config.errors import combination_problems, format_validation_error
from pacs.config.overrides import apply_overrides
from pacs.config.run import Config
from pacs.plugins import import_function


class _DuplicateKeyError(ValueError):
    """A YAML mapping gives one key twice."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (it would keep the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first_lines: dict[object, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if isinstance(key, typing.Hashable) and key in first_lines:
                raise _DuplicateKeyError(
                    f"key {key!r} is given twice in one mapping, on lines {first_lines[key]} and {line} "
                    "(YAML would silently keep only the last); keep one"
                )
            if isinstance(key, typing.Hashable):
                first_lines[key] = line
        return super().construct_mapping(node, deep=deep)


def _read_yaml(source: str) -> dict[str, Any]:
    if source.startswith("builtin:"):
        name = source.removeprefix("builtin:")
        try:
            recipes = importlib.resources.files("pacs.configs")
        except ModuleNotFoundError:
            raise ConfigError(
                f"cannot read '{source}': the built-in configs are the package pacs.configs, which only an installed "
                f"pacs has, and this pacs runs from an uninstalled source tree ({Path(__file__).parents[1]}); "
                "install it (`pip install -e .` in the checkout) or give a config file's path"
            ) from None
        available = sorted(p.name.removesuffix(".yaml") for p in recipes.iterdir() if p.name.endswith(".yaml"))
        if name not in available:
            raise ConfigError(f"unknown built-in config '{source}'; valid: {', '.join('builtin:' + a for a in available)}")
        text = recipes.joinpath(f"{name}.yaml").read_text()
    else:
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"config file not found: {source}")
        text = path.read_text()
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as error:
        raise ConfigError(f"{source} is not valid YAML: {error}") from None
    except _DuplicateKeyError as error:
        raise ConfigError(f"{source}: {error}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source} must hold a mapping of keys at the top level, got {type(data).__name__}")
    return data


def build_config(data: dict[str, Any], source: str = "<dict>") -> Config:
    """Validate a nested mapping into a `Config`; raise `ConfigError` listing every problem: the
    fields' and, at the same time, the impossible combinations among the valid fields. An empty
    section (None) keeps its defaults."""
    sections = {name for name, field in Config.model_fields.items() if isinstance(field.default, BaseModel)}
    data = {key: {} if key in sections and value is None else value for key, value in data.items()}
    try:
        return Config.model_validate(data)
    except ValidationError as error:
        problems = format_validation_error(error, source)
        if any(item["loc"] for item in error.errors()):
            problems = "\n".join([problems, *combination_problems(data, error)])
        raise ConfigError(problems, data) from None


def load_config(source: str | None, overrides: Sequence[str] = (), *, algorithm: str | None = None) -> Config:
    """Read a YAML file (or `builtin:NAME`; None for all defaults), apply overrides, validate, and
    import `reward.function` (so that a misspelled one fails before any model is loaded).

    An override `algorithm.name=NAME` that switches the file's algorithm to another one runs the
    recipe with that algorithm: of the file's `algorithm` section it keeps the options NAME has
    (those every algorithm shares, and its own), not those only other algorithms take. Options
    given as overrides are always NAME's own or refused.

    With `algorithm` (one of `ALGORITHM_CONFIGS`, or a user's `package.module:Class`), the config as
    `pacs compare` runs it for that
    algorithm: `algorithm.name` set to it, and the options of other algorithms in the `algorithm`
    section, overrides included, left out (a comparison's config and overrides hold the options of
    every algorithm it compares). A key that is no algorithm's option is refused either way."""
    data = _read_yaml(source) if source else {}
    switched_to = _algorithm_override(overrides)
    section = data.get("algorithm")
    if (
        isinstance(section, dict)
        and isinstance(switched_to, str)
        and _section_class(switched_to)
        and switched_to != algorithm_name(section)
    ):
        data["algorithm"] = _options_of(switched_to, section)
    apply_overrides(data, list(overrides))
    if algorithm is not None:
        data["algorithm"] = _options_of(algorithm, data.get("algorithm") or {})
    described = source or "no --config given: the defaults and the overrides"
    config = build_config(data, described)
    if config.reward.function is not None:
        try:
            import_function(config.reward.function)
        except ValueError as error:
            raise ConfigError(f"invalid configuration ({described}):\n  reward.function: {error}") from None
    return config


def _algorithm_override(overrides: Sequence[str]) -> object:
    """The value of the last `algorithm.name=...` among `overrides` (None without one)."""
    values = [value for key, _, value in (override.partition("=") for override in overrides) if key == "algorithm.name"]
    return yaml.safe_load(values[-1]) if values else None


def _section_class(name: object) -> type[BaseAlgorithmConfig] | None:
    """The section `algorithm.name` = `name` picks: a built-in's, or the user's section an import
    path names; None when there is none (validation then says why)."""
    if isinstance(name, str) and ":" in name:
        try:
            return plugin_section(name)
        except ValueError:
            return None
    return ALGORITHM_CONFIGS.get(name) if isinstance(name, str) else None


def _options_of(algorithm: str, section: object) -> object:
    """The `algorithm` section `section` (a mapping) for `algorithm`: named so, without the options
    that only other algorithms take (built-ins' and, when named, the section's own algorithm's)."""
    own_class = _section_class(algorithm)
    if not isinstance(section, dict) or own_class is None:
        return {**section, "name": algorithm} if isinstance(section, dict) else section
    others = {key for other in ALGORITHM_CONFIGS.values() for key in other.model_fields}
    if (current := _section_class(algorithm_name(section))) is not None:
        others |= set(current.model_fields)
    own = own_class.model_fields
    return {**{key: value for key, value in section.items() if key in own or key not in others}, "name": algorithm}


def config_text(config: Config) -> str:
    """The resolved configuration as YAML (what `--config` would read back)."""
    return yaml.safe_dump(config.model_dump(), sort_keys=False)


def dump_config(config: Config, path: Path) -> None:
    """Write the resolved configuration as YAML (`config_text`)."""
    path.write_text(config_text(config))
