"""The registry of built-in algorithms, `ALGORITHM_CONFIGS`: found by walking
`pacs.config.algorithms.builtin`, never listed. Every list of algorithms derives from it: the
choices of `algorithm.name` and of `pacs compare`, the configuration reference, the tests' cases
(exactness on 2 processes, end-to-end runs) and the documentation's pages, whose presence a test
checks.

The sections live in `pacs.config`, not beside their algorithms in `pacs.algos`: `pacs.algos` is
the pure tensor math below the configuration layer (tests/project/test_layering.py), and a
section is a pydantic model that names its algorithm class (`builds`), so it imports the algorithm,
not the other way round.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import pacs.config.algorithms.builtin as builtin
from pacs.config.algorithms.base import BaseAlgorithmConfig

DEFAULT_ALGORITHM = "pacs"
"""`algorithm.name` when a configuration gives none; first wherever the algorithms are listed, the
others following by name."""


def builtin_sections(package: ModuleType = builtin) -> dict[str, type[BaseAlgorithmConfig]]:
    """`algorithm.name` -> section for every module of `package`: the module `NAME` must define
    exactly one subclass of `BaseAlgorithmConfig`, whose `name` defaults to NAME (``name:
    Literal["NAME"] = "NAME"``); ValueError naming the module and what it holds otherwise. Ordered
    `DEFAULT_ALGORITHM` first, then by name."""
    sections = {}
    for module_info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{module_info.name}")
        defined = [
            value
            for value in vars(module).values()
            if isinstance(value, type) and issubclass(value, BaseAlgorithmConfig) and value.__module__ == module.__name__
        ]
        names = [section.model_fields["name"].default for section in defined]
        if names != [module_info.name]:
            held = ", ".join(f"{section.__name__} (name={name!r})" for section, name in zip(defined, names)) or "none"
            raise ValueError(
                f"{module.__name__}: a built-in algorithm's module defines one section, a subclass of BaseAlgorithmConfig "
                f"with name: Literal[{module_info.name!r}] = {module_info.name!r}; it defines {held}"
            )
        sections[module_info.name] = defined[0]
    return {name: sections[name] for name in sorted(sections, key=lambda name: (name != DEFAULT_ALGORITHM, name))}


ALGORITHM_CONFIGS: dict[str, type[BaseAlgorithmConfig]] = builtin_sections()
"""The built-in algorithms, `algorithm.name` -> its section (`builtin_sections`), in the order they
are listed everywhere."""
