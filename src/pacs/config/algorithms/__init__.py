"""The `algorithm` section: one class per algorithm, picked by `algorithm.name`; each class's fields
are its algorithm's options, and it builds the algorithm (`BaseAlgorithmConfig.build`).

`algorithm.name` is a built-in's name, looked up in the registry `ALGORITHM_CONFIGS` (each built-in's
section beside its math in its module of `pacs.algos`, found by walking the package), or an import path
``package.module:Class`` to a user's section, a subclass of `BaseAlgorithmConfig` whose `builds` is
the user's algorithm (`plugin_section`; docs/algorithms/custom.md). Either way the section is
validated, its options checked against the algorithm's constructor, and a user's algorithm built
once, before any model loads.

    registry.py   `ALGORITHM_CONFIGS`, found by walking `pacs.algos`
    selection.py  `AlgorithmConfig`: a built-in by name, or a user's section by import path

What every section is (`BaseAlgorithmConfig`, `ClippedPolicyGradientConfig`) is in
`pacs.algos.options`, re-exported here.
"""

from pacs.algos.options import BaseAlgorithmConfig, ClippedPolicyGradientConfig, RunSettings, constructor_keywords
from pacs.config.algorithms.registry import ALGORITHM_CONFIGS, DEFAULT_ALGORITHM, builtin_sections
from pacs.config.algorithms.selection import PLUGIN_TAG, AlgorithmConfig, algorithm_name, algorithm_tag, plugin_section

__all__ = [
    "ALGORITHM_CONFIGS",
    "DEFAULT_ALGORITHM",
    "PLUGIN_TAG",
    "AlgorithmConfig",
    "BaseAlgorithmConfig",
    "ClippedPolicyGradientConfig",
    "RunSettings",
    "algorithm_name",
    "algorithm_tag",
    "builtin_sections",
    "constructor_keywords",
    "plugin_section",
]
