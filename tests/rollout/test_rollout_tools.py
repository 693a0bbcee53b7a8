"""Specification of the tools a model calls (`pacs.rollout.tools`): every python call runs in a
sandbox of its own, a user's tool in a worker, and whatever the program does comes back as output
text, never as an error in the trainer. tests/rollout/test_tool_sandbox.py holds the programs
written to escape."""

from __future__ import annotations

import pytest

from pacs.rollout.tools import PYTHON_TOOL, ToolOutput, ToolRunner


@pytest.fixture(scope="module")
def python_tool():
    with ToolRunner(PYTHON_TOOL, num_workers=2, timeout_s=2.0, memory_limit_mib=512, max_output_chars=200) as runner:
        yield runner


def test_a_program_returns_what_it_prints(python_tool):
    outputs = python_tool.run(["print(123456789 * 987654321)", "x = 3\nprint(x ** 2, end='')", "y = 1"])
    assert outputs == [ToolOutput("121932631112635269\n", False), ToolOutput("9", False), ToolOutput("", False)]


def test_an_exception_is_output_after_what_was_printed_and_the_next_program_runs(python_tool):
    failed, fine = python_tool.run(["print('before')\n1 / 0", "print('after')"])
    assert failed == ToolOutput("before\nZeroDivisionError: division by zero", True)
    assert fine == ToolOutput("after\n", False)


def test_each_program_starts_from_a_fresh_namespace(python_tool):
    python_tool.run(["leftover = 1"])
    (output,) = python_tool.run(["print(leftover)"])
    assert output == ToolOutput("NameError: name 'leftover' is not defined", True)


@pytest.mark.parametrize(
    "program",
    [
        "import socket\nsocket.socket()",
        "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)",
        "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9')",
    ],
)
def test_a_program_that_opens_a_socket_is_refused(python_tool, program):
    (output,) = python_tool.run([program])
    assert output.failed and "[Errno 1] Operation not permitted" in output.text


@pytest.mark.parametrize(
    "program",
    ["import subprocess\nsubprocess.run(['true'])", "import os\nos.execv('/usr/bin/true', ['true'])", "import os\nos.fork()"],
)
def test_a_program_that_starts_a_process_is_refused(python_tool, program):
    (output,) = python_tool.run([program])
    assert output == ToolOutput("PermissionError: [Errno 1] Operation not permitted", True)


def test_a_program_past_its_time_limit_returns_a_time_out_and_the_others_are_answered():
    with ToolRunner(PYTHON_TOOL, num_workers=1, timeout_s=0.5, memory_limit_mib=512, max_output_chars=200) as runner:
        outputs = runner.run(["print(1)", "while True:\n    pass", "print(2)"])
        assert outputs[0] == ToolOutput("1\n", False) and outputs[2] == ToolOutput("2\n", False)
        assert outputs[1] == ToolOutput("TimeoutError: the program ran past its time limit of 0.5 s and was stopped", True)
        assert runner.run(["print(3)"]) == [ToolOutput("3\n", False)]


def test_a_program_past_its_memory_limit_gets_a_memory_error(python_tool):
    failed, fine = python_tool.run(["block = bytearray(4 * 2**30)", "print('ok')"])
    assert failed.failed and failed.text.startswith("MemoryError")
    assert fine == ToolOutput("ok\n", False)


def test_a_program_imports_nothing_from_the_working_directory_and_runs_in_an_empty_one(tmp_path, monkeypatch):
    (tmp_path / "secret_module.py").write_text("print('imported')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with ToolRunner(PYTHON_TOOL, num_workers=1, timeout_s=2.0, memory_limit_mib=512, max_output_chars=200) as runner:
        imported, listed = runner.run(["import secret_module", "import os\nprint(os.listdir('.'))"])
    assert imported == ToolOutput("ModuleNotFoundError: No module named 'secret_module'", True)
    assert listed == ToolOutput("[]\n", False)


def test_output_past_the_limit_is_cut_with_a_note(python_tool):
    (output,) = python_tool.run(["print('a' * 250)"])
    assert output == ToolOutput("a" * 200 + "\n[51 more characters]", False)


def test_a_users_tool_named_by_import_path_runs_in_the_workers_and_its_errors_are_output():
    with ToolRunner(
        "tool_functions:reversed_text", num_workers=1, timeout_s=2.0, memory_limit_mib=512, max_output_chars=50
    ) as runner:
        assert runner.run(["abc"]) == [ToolOutput("cba", False)]
    with ToolRunner("tool_functions:broken", num_workers=1, timeout_s=2.0, memory_limit_mib=512, max_output_chars=50) as runner:
        assert runner.run(["abc"]) == [ToolOutput("RuntimeError: cannot handle 3 characters", True)]


def test_a_tool_that_cannot_be_imported_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match="Module 'tool_functions' has no attribute 'missing'"):
        ToolRunner("tool_functions:missing", num_workers=1, timeout_s=1.0, memory_limit_mib=None, max_output_chars=10)
