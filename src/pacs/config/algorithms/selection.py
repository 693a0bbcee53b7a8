"""The `algorithm` section's type, `AlgorithmConfig`: the built-in that `algorithm.name` picks from
the registry (`pacs.config.algorithms.registry`), or the user's section that an import path
``package.module:Class`` names (`plugin_section`, imported as `reward.function` is, by
`pacs.plugins`; docs/algorithms/custom.md)."""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import (
    Discriminator,
    SerializeAsAny,
    Tag,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)

from pacs.algos.options import BaseAlgorithmConfig, is_import_path
from pacs.config.algorithms.registry import ALGORITHM_CONFIGS, DEFAULT_ALGORITHM
from pacs.plugins import import_function

PLUGIN_TAG = "package.module:Class"
"""What selects a user's section in `AlgorithmConfig` (any `algorithm.name` with a colon)."""


def plugin_section(spec: str) -> type[BaseAlgorithmConfig]:
    """The user's section that `algorithm.name` = `spec` (``package.module:Class``) names, imported
    by `pacs.plugins` as `reward.function` is; ValueError naming `spec` and what is wrong: the
    module or the attribute missing, or an object that is not an algorithm's section (a subclass of
    `BaseAlgorithmConfig` whose `builds` has the protocol's `prepare_update` and `micro_batch_loss`)."""
    try:
        found = import_function(spec, kind="class")
    except ValueError as error:
        raise ValueError(f"algorithm.name={spec!r}: {error}") from None
    how = "a subclass of pacs.config.BaseAlgorithmConfig whose `builds` is the algorithm class (docs/algorithms/custom.md)"
    if not (isinstance(found, type) and issubclass(found, BaseAlgorithmConfig)):
        what = f"the class {found.__name__}" if isinstance(found, type) else f"a {type(found).__name__}"
        raise ValueError(f"algorithm.name={spec!r} is not an algorithm's configuration: it names {what}; name {how}")
    builds = getattr(found, "builds", None)
    missing = [method for method in ("prepare_update", "micro_batch_loss") if not callable(getattr(builds, method, None))]
    if builds is None or missing:
        got = (
            "sets no `builds`"
            if builds is None
            else f"builds {getattr(builds, '__name__', builds)}, which has no {', '.join(missing)}"
        )
        raise ValueError(
            f"algorithm.name={spec!r} is not an algorithm: {found.__name__} {got}; its `builds` must be an algorithm "
            "class (pacs.algos.base.Algorithm: subclass pacs.algos.base.AlgorithmBase and write prepare_update and "
            "micro_batch_loss)"
        )
    return found


def _validate_plugin(value: Any, handler: ValidatorFunctionWrapHandler) -> BaseAlgorithmConfig:
    """A user's section (`plugin_section`) from the `algorithm` mapping `value`; an option it does
    not have is refused with its valid options."""
    if isinstance(value, BaseAlgorithmConfig) or not isinstance(value, dict):
        return handler(value)
    spec = str(value.get("name"))
    section = plugin_section(spec)
    for key in value:
        if key not in section.model_fields:
            close = difflib.get_close_matches(str(key), list(section.model_fields), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"algorithm.{key}: unknown option of algorithm.name={spec!r}{hint}; its options: {', '.join(section.model_fields)}"
            )
    return section.model_validate(value)


def algorithm_name(section: object) -> object:
    """The `name` of an `algorithm` section, given (a mapping) or validated; `DEFAULT_ALGORITHM` when absent."""
    if isinstance(section, dict):
        return section.get("name", DEFAULT_ALGORITHM)
    return getattr(section, "name", None)


def algorithm_tag(section: object) -> object:
    """What selects the member of `AlgorithmConfig`: the built-in's name, or `PLUGIN_TAG` for an
    import path."""
    name = algorithm_name(section)
    return PLUGIN_TAG if is_import_path(name) else name


if TYPE_CHECKING:  # a union built from the registry at import: a section of this class to a type checker
    AlgorithmConfig = BaseAlgorithmConfig
else:
    AlgorithmConfig = Annotated[
        Union[
            tuple(Annotated[section, Tag(name)] for name, section in ALGORITHM_CONFIGS.items())
            + (Annotated[SerializeAsAny[BaseAlgorithmConfig], WrapValidator(_validate_plugin), Tag(PLUGIN_TAG)],)
        ],
        Discriminator(algorithm_tag),
    ]
"""The `algorithm` section: the one of `ALGORITHM_CONFIGS` that `name` picks (`DEFAULT_ALGORITHM` when absent), or
the user's section that an import path names (`plugin_section`)."""
