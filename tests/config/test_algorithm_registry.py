"""The built-in algorithms are found, not listed: `pacs.config.algorithms.registry` walks
`pacs.algos`, where each built-in's module holds its math and its section, so adding a built-in adds
its module, its docs page and its tests, and edits no list."""

from __future__ import annotations

import json
import pkgutil
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pacs
from pacs.config import ALGORITHM_CONFIGS, DEFAULT_ALGORITHM
from pacs.config.algorithms import builtin_sections

SECTION_OF_RLOO = """
from typing import Literal

from pacs.algos.options import ClippedPolicyGradientConfig
from pacs.algos.rloo import RLOO


class {cls}(ClippedPolicyGradientConfig):
    builds = RLOO

    name: Literal["{name}"] = "{name}"
    \"\"\"An algorithm of a test.\"\"\"
"""


def test_every_built_in_is_registered_from_the_module_of_pacs_algos_of_its_name():
    assert {name: section.__module__ for name, section in ALGORITHM_CONFIGS.items()} == {
        name: f"pacs.algos.{name}" for name in ALGORITHM_CONFIGS
    }


def test_the_modules_of_pacs_algos_without_a_section_are_not_algorithms():
    modules = {module.name for module in pkgutil.iter_modules(pacs.algos.__path__)}
    assert {"masks", "pg", "options"} <= modules - set(ALGORITHM_CONFIGS)


def test_the_default_algorithm_is_listed_first_and_the_others_by_name():
    assert list(ALGORITHM_CONFIGS) == [DEFAULT_ALGORITHM, *sorted(set(ALGORITHM_CONFIGS) - {DEFAULT_ALGORITHM})]


def package_of(tmp_path: Path, monkeypatch, modules: dict[str, str]):
    """A package `tmp_builtins` on the path whose modules have the texts `modules` (name -> text)."""
    package = tmp_path / "tmp_builtins"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, text in modules.items():
        (package / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in [name for name in sys.modules if name.split(".")[0] == "tmp_builtins"]:
        monkeypatch.delitem(sys.modules, module)
    return __import__("tmp_builtins")


def test_a_module_with_its_section_is_registered_under_its_name(tmp_path, monkeypatch):
    package = package_of(tmp_path, monkeypatch, {"mine": SECTION_OF_RLOO.format(cls="MineConfig", name="mine")})
    sections = builtin_sections(package)
    assert {name: section.__name__ for name, section in sections.items()} == {"mine": "MineConfig"}


def test_a_module_that_defines_no_section_is_left_out_as_shared_math(tmp_path, monkeypatch):
    package = package_of(
        tmp_path, monkeypatch, {"mine": SECTION_OF_RLOO.format(cls="MineConfig", name="mine"), "helpers": "X = 1\n"}
    )
    assert list(builtin_sections(package)) == ["mine"]


@pytest.mark.parametrize(
    ("text", "held"),
    [
        (SECTION_OF_RLOO.format(cls="OtherConfig", name="other"), "it defines OtherConfig (name='other')"),
        (
            SECTION_OF_RLOO.format(cls="MineConfig", name="mine") + SECTION_OF_RLOO.format(cls="AgainConfig", name="mine"),
            "it defines MineConfig (name='mine'), AgainConfig (name='mine')",
        ),
    ],
    ids=["another-name", "two-sections"],
)
def test_a_module_without_exactly_its_own_section_is_refused_naming_it(tmp_path, monkeypatch, text, held):
    package = package_of(tmp_path, monkeypatch, {"mine": text})
    with pytest.raises(ValueError, match=r"tmp_builtins\.mine: a built-in algorithm's module defines one section") as refused:
        builtin_sections(package)
    assert held in str(refused.value)


ADDED_ALGORITHM = '''
"""A test's built-in: RLOO under another name, and its section."""

from typing import Literal

from pacs.algos.options import ClippedPolicyGradientConfig
from pacs.algos.rloo import RLOO


class Mine(RLOO):
    """RLOO's advantages and loss."""


class MineConfig(ClippedPolicyGradientConfig):
    builds = Mine

    name: Literal["mine"] = "mine"
    """An algorithm a test adds."""
'''

CHECK_ADDED = """
import json, sys
import pacs
from pacs.compare import _methods
from pacs.config import ALGORITHM_CONFIGS, load_config
config = load_config(None, ["algorithm.name=mine", "algorithm.clip_high=0.3", "rollout.n=4"])
algorithm = config.algorithm.build(4, max_response_length=8)
print(json.dumps({
    "package": pacs.__file__,
    "registered": list(ALGORITHM_CONFIGS),
    "built": [type(algorithm).__name__, algorithm.clip_high],
    "compared": list(_methods(["pacs", "mine"], unweighted_pacs=False)),
}))
"""


@pytest.mark.slow
def test_a_built_in_added_as_its_one_module_only_is_registered_loaded_built_and_compared(tmp_path):
    """A copy of the package with `pacs/algos/mine.py` (the algorithm and its section) added and
    nothing else edited, run in a fresh interpreter."""
    copy = tmp_path / "src" / "pacs"
    shutil.copytree(Path(pacs.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "algos" / "mine.py").write_text(textwrap.dedent(ADDED_ALGORITHM))
    result = subprocess.run(
        [sys.executable, "-c", CHECK_ADDED],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path / "src"), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.splitlines()[-1])
    assert found == {
        "package": str(copy / "__init__.py"),
        "registered": [DEFAULT_ALGORITHM, *sorted({*ALGORITHM_CONFIGS, "mine"} - {DEFAULT_ALGORITHM})],
        "built": ["Mine", 0.3],
        "compared": ["pacs", "mine"],
    }
