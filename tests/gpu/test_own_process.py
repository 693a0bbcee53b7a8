"""Specification of the GPU suite's `own_process` mark (tests/gpu/conftest.py), on a CPU: the body
of a marked test runs in another pytest process, never in the one that collected it."""

from __future__ import annotations

import os

import pytest

OWN_PROCESS = "PACS_TEST_OWN_PROCESS"
"""tests/gpu/conftest.py's variable: the node id whose body a child pytest runs."""


@pytest.mark.slow
@pytest.mark.own_process
def test_a_test_marked_own_process_runs_its_body_in_a_pytest_process_of_its_own(request):
    assert os.environ.get(OWN_PROCESS) == request.node.nodeid
