"""The registry of built-in algorithms, `ALGORITHM_CONFIGS`: found by walking `pacs.algos`, never
listed. A built-in is a module of `pacs.algos` that holds its algorithm's section beside its math
(a subclass of `pacs.algos.options.BaseAlgorithmConfig`); the modules that hold none are the
algorithms' shared math. Every list of algorithms derives from the registry: the choices of
`algorithm.name` and of `pacs compare`, the configuration reference, the tests' cases (exactness
on 2 processes, end-to-end runs) and the documentation's pages, whose presence a test checks.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import pacs.algos
from pacs.algos.options import BaseAlgorithmConfig

DEFAULT_ALGORITHM = "pacs"
"""`algorithm.name` when a configuration gives none; first wherever the algorithms are listed, the
others following by name."""


def builtin_sections(package: ModuleType = pacs.algos) -> dict[str, type[BaseAlgorithmConfig]]:
    """`algorithm.name` -> section for every module of `package` that defines a subclass of
    `BaseAlgorithmConfig` (the module where that class and the other bases are defined aside): the
    module `NAME` must define exactly one, whose `name` defaults to NAME (``name: Literal["NAME"] =
    "NAME"``); ValueError naming the module and what it holds otherwise. Ordered
    `DEFAULT_ALGORITHM` first, then by name."""
    sections = {}
    for module_info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{module_info.name}")
        defined = [
            value
            for value in vars(module).values()
            if isinstance(value, type) and issubclass(value, BaseAlgorithmConfig) and value.__module__ == module.__name__
        ]
        if not defined or module.__name__ == BaseAlgorithmConfig.__module__:
            continue
        names = [section.model_fields["name"].default for section in defined]
        if names != [module_info.name]:
            held = ", ".join(f"{section.__name__} (name={name!r})" for section, name in zip(defined, names))
            raise ValueError(
                f"{module.__name__}: a built-in algorithm's module defines one section, a subclass of BaseAlgorithmConfig "
                f"with name: Literal[{module_info.name!r}] = {module_info.name!r}; it defines {held}"
            )
        sections[module_info.name] = defined[0]
    return {name: sections[name] for name in sorted(sections, key=lambda name: (name != DEFAULT_ALGORITHM, name))}


ALGORITHM_CONFIGS: dict[str, type[BaseAlgorithmConfig]] = builtin_sections()
"""The built-in algorithms, `algorithm.name` -> its section (`builtin_sections`), in the order they
are listed everywhere."""
