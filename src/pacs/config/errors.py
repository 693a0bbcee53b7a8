"""pydantic's validation errors as messages that name the dotted key, the value and what would be
valid (a misspelt key gets its nearest valid name).
"""

from __future__ import annotations

import copy
import difflib
from typing import Any

from pydantic import (
    BaseModel,
    ValidationError,
)

from pacs.config.algorithms import ALGORITHM_CONFIGS, PLUGIN_TAG, BaseAlgorithmConfig
from pacs.config.run import Config


def _key_path(location: tuple) -> tuple:
    """A pydantic error location as the config's dotted key: without the algorithm's name that
    pydantic puts after `algorithm` ("algorithm", "pacs", "beta" -> "algorithm", "beta"); an
    unknown algorithm name is the error of `algorithm.name`, and so is a user's section that cannot be
    used (its messages name their key)."""
    if location[:1] == ("algorithm",):
        if len(location) == 1 or location == ("algorithm", PLUGIN_TAG):
            return ("algorithm", "name")
        if location[1] in ALGORITHM_CONFIGS or location[1] == PLUGIN_TAG:
            return ("algorithm", *location[2:])
    return location


def format_validation_error(error: ValidationError, source: str) -> str:
    lines = [f"invalid configuration ({source}):"]
    for item in error.errors():
        key = ".".join(str(part) for part in _key_path(item["loc"]))
        if item["type"] == "extra_forbidden":
            lines.append(f"  {key}: {_unknown_key(item['loc'])}")
        elif item["type"] == "value_error":  # a field's own check names no key; the whole config's checks do
            message = item["msg"].removeprefix("Value error, ")
            named = not key or message.startswith("algorithm.")  # a user's section: the message names its key
            lines.append(f"  {'' if named else key + ': '}{message}")
        elif item["type"] == "union_tag_invalid":
            valid = _either([repr(name) for name in ALGORITHM_CONFIGS])
            lines.append(
                f"  {key}: Input should be {valid} (got {item['ctx']['tag']!r}), or the import path '{PLUGIN_TAG}' of "
                "your own algorithm's section (docs/algorithms/custom.md)"
            )
        else:
            lines.append(f"  {key}: {item['msg']} (got {item['input']!r})")
    return "\n".join(lines)


def _unknown_key(location: tuple) -> str:
    """Why the last key of a pydantic error `location` is refused, what it may have meant, and the
    valid keys there. In the `algorithm` section, another algorithm's option is named as such."""
    section, key = _section_at(location), str(location[-1])
    if section is None:
        return "unknown key"
    valid = list(section.model_fields)
    valid_text = f"valid keys here: {', '.join(valid)}"
    close = difflib.get_close_matches(key, valid, n=1)
    if close or not issubclass(section, BaseAlgorithmConfig):
        return f"unknown key{f' (did you mean {close[0]!r}?)' if close else ''}; {valid_text}"
    name = section.model_fields["name"].default
    owners: dict[str, list[str]] = {}
    for other, options in ALGORITHM_CONFIGS.items():
        for option in options.model_fields:
            owners.setdefault(option, []).append(other)
    if key in owners:
        return f"an option of {_either(owners[key])}, not of algorithm.name='{name}'; {valid_text}"
    close = difflib.get_close_matches(key, list(owners), n=1)
    hint = f" (did you mean {close[0]!r}, an option of {_either(owners[close[0]])}?)" if close else ""
    return f"unknown key{hint}; {valid_text}"


def _section_at(location: tuple) -> type[BaseModel] | None:
    """The section that holds the last key of a pydantic error `location`, or None."""
    if location[:1] == ("algorithm",):
        return ALGORITHM_CONFIGS.get(location[1]) if len(location) == 3 else None
    section: type[BaseModel] = Config
    for part in location[:-1]:
        annotation = section.model_fields[part].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        section = annotation
    return section


def _either(names: list[str]) -> str:
    """ "a", "a or b", "a, b or c"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def combination_problems(data: dict[str, Any], error: ValidationError) -> list[str]:
    """The combination checks (`Config._check_combinations`) that fail on `data` with every field
    `error` rejects left at its default, except those that name a rejected field (its default
    would stand in for a value the user did not give)."""
    rejected = [_key_path(item["loc"]) for item in error.errors() if item["loc"]]
    valid_part = copy.deepcopy(data)
    for location in rejected:
        node: Any = valid_part
        for part in location[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(location[-1], None)
    try:
        Config.model_validate(valid_part)
    except ValidationError as combination_error:
        names = [".".join(str(part) for part in location) for location in rejected]
        return [
            f"  {item['msg'].removeprefix('Value error, ')}"
            for item in combination_error.errors()
            if not item["loc"] and not any(name in item["msg"] for name in names)
        ]
    return []
