"""Tests marked `own_process` run in a pytest process of their own: the parent sets up the test's
fixtures, starts `python -m pytest NODE_ID` with `PACS_TEST_OWN_PROCESS=NODE_ID`, and passes or
fails with it; the child runs the body. vLLM's sleep mode allocates through its cumem allocator,
of which a process has one (`load_model` asserts it is unused), so every GPU test that starts a
vLLM engine (one that takes the `vllm_installed` fixture) gets the mark: an engine left behind by
an earlier test, not fully torn down, cannot break the next one, as vLLM's own sleep tests fork a
process per test."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

OWN_PROCESS = "PACS_TEST_OWN_PROCESS"
"""The node id of the test a child pytest process runs the body of."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "own_process: runs in a pytest process of its own (tests/gpu/conftest.py)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "vllm_installed" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.own_process)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """The body of an `own_process` test in a child pytest (None: here, in the child itself)."""
    if pyfuncitem.get_closest_marker("own_process") is None or os.environ.get(OWN_PROCESS) == pyfuncitem.nodeid:
        return None
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "-rA", pyfuncitem.nodeid]
    done = subprocess.run(
        command,
        cwd=pyfuncitem.config.rootpath,
        env={**os.environ, OWN_PROCESS: pyfuncitem.nodeid},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0 or "1 passed" not in done.stdout:
        pytest.fail(
            f"in its own process ({' '.join(command)}), exit code {done.returncode}:\n{done.stdout[-8000:]}", pytrace=False
        )
    return True
