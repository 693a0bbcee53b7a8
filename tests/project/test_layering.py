"""Specification of the code layout: packages import downward only, and no module imports itself
back through others (every import counts, also those inside functions or under TYPE_CHECKING)."""

from __future__ import annotations

import ast
from pathlib import Path

import pacs

SOURCE = Path(pacs.__file__).parent
LAYERS = [
    {"pacs", "pacs.paths", "pacs.plugins", "pacs.progress", "pacs.outputs", "pacs.threads", "pacs.sandbox"},
    {"pacs.algos"},
    {"pacs.rewards", "pacs.data", "pacs.models", "pacs.config"},
    {"pacs.distributed"},
    {"pacs.rollout"},
    {"pacs.eval"},
    {"pacs.train"},
    {"pacs.plots"},
    {"pacs.compare", "pacs.demo"},
    {"pacs.cli"},
    {"pacs.integrations"},
]
"""Bottom to top: a unit (a subpackage, or a top-level module) imports only from its own unit
and from units of lower layers."""


TRAIN_LAYERS = [
    {"batch", "sampler", "timing", "throughput", "determinism", "trackers", "preflight"},
    {"logprobs", "metrics", "checkpointing"},
    {"update", "sft", "loading", "colocated_engine", "async_generator", "dynamic_sampling"},
    {"builtin_models", "memory_plan"},
    {"trainer"},
]
"""`pacs.train` inside, bottom to top, as a step flows: the batch and what a step is timed, measured
and logged with; log-probs on a batch, metrics, checkpoints; the update, what a run loads and how it
generates; what is built from those (the warm-started model, the memory plan); the loop. A module
imports only from its own layer and lower ones."""


def module_names() -> dict[str, Path]:
    names = {}
    for path in SOURCE.rglob("*.py"):
        parts = ("pacs", *path.relative_to(SOURCE).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imported_modules(path: Path, known: dict[str, Path]) -> set[str]:
    """The pacs modules that the file at `path` imports anywhere in its body."""
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names if alias.name.split(".")[0] == "pacs"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "pacs":
            imported.add(node.module)
            imported |= {f"{node.module}.{alias.name}" for alias in node.names if f"{node.module}.{alias.name}" in known}
    return imported


def unit_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def layer_of(module: str) -> int:
    [layer] = [index for index, units in enumerate(LAYERS) if unit_of(module) in units]
    return layer


def test_every_unit_has_a_layer() -> None:
    units = {unit_of(module) for module in module_names()}
    assert units == set().union(*LAYERS)


def test_packages_import_downward_only() -> None:
    known = module_names()
    upward = [
        f"{module} imports {target}"
        for module, path in known.items()
        for target in imported_modules(path, known)
        if unit_of(target) != unit_of(module) and layer_of(target) >= layer_of(module)
    ]
    assert upward == []


def train_unit(module: str) -> str:
    """The unit of a module inside `pacs.train`: its first name below it (a module or `checkpointing`)."""
    return module.split(".")[2]


def train_layer_of(module: str) -> int:
    [layer] = [index for index, units in enumerate(TRAIN_LAYERS) if train_unit(module) in units]
    return layer


def test_every_train_module_has_a_train_layer() -> None:
    units = {train_unit(module) for module in module_names() if module.startswith("pacs.train.")}
    assert units == set().union(*TRAIN_LAYERS)


def test_train_modules_import_downward_only() -> None:
    known = module_names()
    inside = {module: path for module, path in known.items() if module.startswith("pacs.train.")}
    upward = [
        f"{module} imports {target}"
        for module, path in inside.items()
        for target in imported_modules(path, known)
        if target.startswith("pacs.train.") and train_layer_of(target) > train_layer_of(module)
    ]
    assert upward == []


def test_no_module_imports_itself_back() -> None:
    known = module_names()
    graph = {module: imported_modules(path, known) & known.keys() for module, path in known.items()}
    circles = []

    def visit(module: str, trail: list[str]) -> None:
        for target in sorted(graph[module]):
            if target in trail:
                circles.append(" -> ".join([*trail[trail.index(target) :], target]))
            elif target not in finished:
                visit(target, [*trail, target])
        finished.add(module)

    finished: set[str] = set()
    for module in sorted(graph):
        if module not in finished:
            visit(module, [module])
    assert circles == []
