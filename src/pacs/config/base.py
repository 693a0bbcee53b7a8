"""The base of every configuration section, and the error a configuration raises."""

from __future__ import annotations

import types
import typing

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationInfo,
    field_validator,
)


class ConfigError(ValueError):
    """A configuration file or override that cannot be used; the message says how to fix it.

    `settings`: the mapping (file and overrides applied) that failed validation, when there was
    one, so that a command can check the inputs it names in the same refusal; None otherwise."""

    def __init__(self, message: str, settings: dict | None = None) -> None:
        super().__init__(message)
        self.settings = settings


class Section(BaseModel):
    """A section of the configuration: its fields' docstrings are their descriptions (`model_fields`)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)

    @field_validator("*", mode="before")
    @classmethod
    def _refuse_booleans_for_numbers(cls, value: object, info: ValidationInfo) -> object:
        """pydantic would read true as 1; YAML reads yes/no/on/off as booleans."""
        if isinstance(value, bool) and info.field_name and _is_numeric(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"expected a number, got {value!r} (YAML reads yes/no/on/off/true/false as booleans)")
        return value


def _is_numeric(annotation: object) -> bool:
    """Whether a field of this type holds an int or a float (``float | None`` included)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_is_numeric(member) for member in typing.get_args(annotation))
    return annotation in (int, float)
