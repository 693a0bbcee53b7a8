"""tools/gpu_wheels.py's resolution, on a fake index: which wheels a lent GPU machine is carried."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from tool_modules import tool_module


@pytest.fixture(scope="module")
def gpu_wheels():
    return tool_module("gpu_wheels")


def index_picker(gpu_wheels, index: dict[str, dict[str, list[str]]]):
    """`resolve`'s `pick` over `index` (name -> version -> Requires-Dist): the newest version allowed."""

    def pick(name: str, specifier: SpecifierSet):
        version = max((v for v in index[name] if v in specifier), key=Version)
        return gpu_wheels.Candidate(version, tuple(index[name][version]))

    return pick


def versions(resolved) -> dict[str, str]:
    return {name: candidate.version for name, candidate in resolved.items()}


def test_requirements_are_followed_through_the_picked_wheels_and_stop_at_the_image(gpu_wheels):
    index = {
        "app": {"1.0": ["lib>=2", "numpy>=1.20"]},
        "lib": {"2.0": ["leaf"], "3.0": ["leaf", "numpy"]},
        "leaf": {"0.1": []},
        "numpy": {"9.9": ["never-followed"]},
    }
    resolved = gpu_wheels.resolve(["app"], index_picker(gpu_wheels, index), {"numpy": "2.5.2"})
    assert versions(resolved) == {"app": "1.0", "leaf": "0.1", "lib": "3.0"}


def test_requirements_whose_markers_fail_on_linux_cpython_312_are_left_out(gpu_wheels):
    index = {
        "app": {
            "1.0": [
                "windows-only; sys_platform == 'win32'",
                "old-python; python_version < '3.11'",
                "optional; extra == 'fast'",
                "linux-only; sys_platform == 'linux' and python_version >= '3.12'",
            ]
        },
        "linux-only": {"1.0": []},
    }
    assert versions(gpu_wheels.resolve(["app"], index_picker(gpu_wheels, index), {})) == {"app": "1.0", "linux-only": "1.0"}


def test_an_extra_a_requirer_asks_for_brings_that_extras_requirements(gpu_wheels):
    index = {
        "app": {"1.0": ["lib[fast]"]},
        "lib": {"1.0": ["optional; extra == 'fast'", "other; extra == 'slow'"]},
        "optional": {"1.0": []},
    }
    assert versions(gpu_wheels.resolve(["app"], index_picker(gpu_wheels, index), {})) == {
        "app": "1.0",
        "lib": "1.0",
        "optional": "1.0",
    }


def test_a_package_gets_one_version_allowed_by_every_requirer(gpu_wheels):
    index = {"a": {"1.0": ["shared"]}, "b": {"1.0": ["shared<2"]}, "shared": {"1.0": [], "1.5": [], "2.0": []}}
    for roots in (["a", "b"], ["b", "a"]):
        assert gpu_wheels.resolve(roots, index_picker(gpu_wheels, index), {})["shared"].version == "1.5"


def test_what_only_an_abandoned_pick_needed_is_not_carried(gpu_wheels):
    index = {
        "a": {"1.0": ["shared"]},
        "b": {"1.0": ["shared<2"]},
        "shared": {"1.0": [], "2.0": ["only-in-2"]},
        "only-in-2": {"1.0": []},
    }
    resolved = gpu_wheels.resolve(["b", "a"], index_picker(gpu_wheels, index), {})
    assert versions(resolved) == {"a": "1.0", "b": "1.0", "shared": "1.0"}


def test_an_image_package_at_a_version_the_requirement_excludes_is_carried(gpu_wheels):
    index = {"app": {"1.0": ["transformers>=5.20"]}, "transformers": {"5.23.0": []}}
    resolved = gpu_wheels.resolve(["app"], index_picker(gpu_wheels, index), {"transformers": "5.17.0"})
    assert versions(resolved) == {"app": "1.0", "transformers": "5.23.0"}


def test_an_image_package_of_unknown_version_is_carried_only_under_an_upper_bound(gpu_wheels):
    index = {"app": {"1.0": ["fsspec<=2026.6.0", "requests>=2.32"]}, "fsspec": {"2026.6.0": []}, "requests": {"9.0": []}}
    resolved = gpu_wheels.resolve(["app"], index_picker(gpu_wheels, index), {"fsspec": None, "requests": None})
    assert versions(resolved) == {"app": "1.0", "fsspec": "2026.6.0"}


def test_the_roots_are_pacs_core_dependencies_and_the_trl_and_datasets_pins(gpu_wheels, tmp_path: Path):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "pyproject.toml").write_text('[project]\ndependencies = ["torch>=2.7", "pydantic>=2.6"]\n')
    (tmp_path / "benchmarks" / "requirements-trl.txt").write_text(
        "# TRL\ntrl==1.13.0\ntransformers==5.23.0\ndatasets==5.0.1  # pinned\n"
    )
    assert gpu_wheels.roots(tmp_path) == ["torch>=2.7", "pydantic>=2.6", "trl==1.13.0", "datasets==5.0.1"]


def test_a_trl_requirements_file_without_the_datasets_pin_is_refused(gpu_wheels, tmp_path: Path):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "pyproject.toml").write_text('[project]\ndependencies = ["torch>=2.7"]\n')
    (tmp_path / "benchmarks" / "requirements-trl.txt").write_text("trl==1.13.0\n")
    with pytest.raises(gpu_wheels.ResolutionError, match="pins no datasets"):
        gpu_wheels.roots(tmp_path)
