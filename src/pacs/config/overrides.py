"""Dotted command-line overrides (`train.steps=20`), each value read as YAML."""

from __future__ import annotations

from typing import Any

import yaml

from pacs.config.base import ConfigError


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return `data` with each `dotted.key=value` applied; values are parsed as YAML scalars."""
    for override in overrides:
        key, separator, raw_value = override.partition("=")
        if not separator or not key:
            raise ConfigError(f"override '{override}' is not of the form key=value (e.g. train.steps=20)")
        parts = key.split(".")
        node = data
        for depth, part in enumerate(parts[:-1]):
            if node.get(part) is None:  # absent, or an empty section (`train:`)
                node[part] = {}
            child = node[part]
            if not isinstance(child, dict):
                raise ConfigError(f"override '{override}': '{'.'.join(parts[: depth + 1])}' is not a section")
            node = child
        node[parts[-1]] = yaml.safe_load(raw_value) if raw_value else ""
    return data
