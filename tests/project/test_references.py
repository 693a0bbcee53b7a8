"""Specification of the written references to pacs's code: every backticked dotted name
`pacs.x.y` in src/, docs/, the README and CONTRIBUTING names a module, or a name defined in one
(a class's own attributes included), as the source stands. Read from the source, not imported, so
that names behind optional extras (TRL, verl, vLLM) are checked too."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
SOURCE = REPOSITORY / "src"
REFERENCE = re.compile(r"`{1,2}(pacs(?:\.\w+)+)(?:\(\))?`{1,2}")
WRITTEN = [
    *sorted((REPOSITORY / "src").rglob("*.py")),
    *sorted((REPOSITORY / "docs").rglob("*.md")),
    REPOSITORY / "README.md",
    REPOSITORY / "CONTRIBUTING.md",
]


def module_file(dotted: str) -> Path | None:
    """The source file of the pacs module or package `dotted`, if there is one."""
    path = SOURCE.joinpath(*dotted.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


@cache
def defined_names(path: Path) -> dict[str, ast.AST | None]:
    """Module-level names of the file at `path` (functions, classes, assignments, imports)."""
    names: dict[str, ast.AST | None] = {}
    for node in ast.parse(path.read_text()).body:
        names.update(names_bound_by(node))
    return names


def names_bound_by(node: ast.AST) -> dict[str, ast.AST | None]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name: node}
    if isinstance(node, ast.Assign):
        return {target.id: None for target in node.targets if isinstance(target, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id: None}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(alias.asname or alias.name).split(".")[0]: None for alias in node.names}
    if isinstance(node, (ast.If, ast.Try)):
        bound: dict[str, ast.AST | None] = {}
        for child in [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]:
            bound.update(names_bound_by(child))
        for handler in getattr(node, "handlers", []):
            for child in handler.body:
                bound.update(names_bound_by(child))
        return bound
    return {}


def resolves(reference: str) -> bool:
    parts = reference.split(".")
    for split in range(len(parts), 0, -1):
        path = module_file(".".join(parts[:split]))
        if path is None:
            continue
        rest = parts[split:]
        if not rest:
            return True
        node = defined_names(path).get(rest[0], False)
        if node is False:
            return False
        for attribute in rest[1:]:
            if not isinstance(node, ast.ClassDef):
                return node is None  # a member of an assigned or imported value: not checked further
            members: dict[str, ast.AST | None] = {}
            for child in node.body:
                members.update(names_bound_by(child))
            node = members.get(attribute, False)
            if node is False:
                return False
        return True
    return False


def test_every_backticked_pacs_name_resolves() -> None:
    unresolved = [
        f"{path.relative_to(REPOSITORY)}:{number}: {reference}"
        for path in WRITTEN
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        for reference in REFERENCE.findall(line)
        if not resolves(reference)
    ]
    assert unresolved == []


def test_a_name_that_does_not_exist_is_caught() -> None:
    assert resolves("pacs.algos.masks.masked_mean")
    assert resolves("pacs.config.run.Config.algorithm")
    assert not resolves("pacs.algos.core.masked_mean")
    assert not resolves("pacs.algos.masks.no_such_helper")
