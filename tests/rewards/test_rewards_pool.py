"""Specification of the scoring pool: worker processes, a hard limit per call, errors that surface."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pacs.rewards import BatchScores, ScoringPool
from pacs.rewards.pool import QUOTED_RESPONSE_CHARS

PLUGIN_MODULE = "pacs_test_pool_plugin"
PLUGIN_SOURCE = '''
import os
import subprocess
import sys
import time

import numpy as np

INJECTOR = """
import os, pickle, stat, struct, sys

class Forged:
    def __reduce__(self):
        return (eval, ("__import__('pathlib').Path(%r).touch() or 1.0" % sys.argv[1],))

payload = pickle.dumps(("result", Forged()))
for fd in range(3, 256):
    try:
        if stat.S_ISSOCK(os.fstat(fd).st_mode):
            os.write(fd, struct.pack("!i", len(payload)) + payload)
    except OSError:
        pass
"""


def run_a_forging_program(data_source, solution_str, ground_truth, extra_info=None):
    """Run a 'model-written' program that writes a forged pickle to every socket it holds."""
    subprocess.run([sys.executable, "-c", INJECTOR, ground_truth], close_fds=False, check=True)
    return 0.0


def exit_after_starting_a_background_program(data_source, solution_str, ground_truth, extra_info=None):
    os.system("sleep 30 &")
    os._exit(3)


def call_sys_exit(data_source, solution_str, ground_truth, extra_info=None):
    sys.exit(3)


def raise_keyboard_interrupt(data_source, solution_str, ground_truth, extra_info=None):
    raise KeyboardInterrupt


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no text")


def raise_unprintable(data_source, solution_str, ground_truth, extra_info=None):
    raise Unprintable()


def huge_integer(data_source, solution_str, ground_truth, extra_info=None):
    return 10**400


def numpy_true(data_source, solution_str, ground_truth, extra_info=None):
    return np.bool_(True)


def print_and_score(data_source, solution_str, ground_truth, extra_info=None):
    print("printed by the reward function")
    return 1.0


def length_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": len(solution_str) / 10, "length": len(solution_str)}


def sleep_on_request(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "sleep":
        time.sleep(3600)
    return 1.0


def exit_on_request(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "exit":
        os._exit(3)
    return 1.0


def raise_key_error(data_source, solution_str, ground_truth, extra_info=None):
    raise KeyError("missing_field")


def too_high(data_source, solution_str, ground_truth, extra_info=None):
    return 1.5


def process_id(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 if os.getpid() == int(ground_truth) else 0.0


def kill_the_server(data_source, solution_str, ground_truth, extra_info=None):
    import signal
    if solution_str == "kill":
        os.kill(os.getppid(), signal.SIGKILL)  # a worker's parent is the fork server
        time.sleep(5)
    return 1.0
'''
TIMEOUT_S = 0.5


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A reward-function module importable only from a directory this test puts on sys.path."""
    directory = tmp_path_factory.mktemp("plugin")
    (directory / f"{PLUGIN_MODULE}.py").write_text(PLUGIN_SOURCE, encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(directory))
        yield PLUGIN_MODULE
    sys.modules.pop(PLUGIN_MODULE, None)


def rows(count: int, data_source: str = "plugin", ground_truth: str = "1") -> list[dict]:
    return [
        {
            "data_source": data_source,
            "reward_model": {"ground_truth": ground_truth},
            "extra_info": {"index": index},
        }
        for index in range(count)
    ]


@pytest.mark.slow
def test_scores_come_back_in_response_order(plugin: str) -> None:
    responses = ["a" * length for length in [7, 1, 9, 3, 5, 2]]
    with ScoringPool(f"{plugin}:length_score", num_workers=2) as pool:
        batch = pool.score(rows(6), responses)
    assert batch == BatchScores([0.7, 0.1, 0.9, 0.3, 0.5, 0.2], timed_out=0, crashed=0)


@pytest.mark.slow
def test_workers_import_a_plugin_from_the_callers_sys_path(plugin: str) -> None:
    with ScoringPool(f"{plugin}:length_score", num_workers=1) as pool:
        assert pool.score(rows(1), ["abc"]).scores == [0.3]


@pytest.mark.slow
def test_workers_score_in_other_processes(plugin: str) -> None:
    with ScoringPool(f"{plugin}:process_id", num_workers=1) as pool:
        assert pool.score(rows(1, ground_truth=str(os.getpid())), ["x"]).scores == [0.0]


@pytest.mark.slow
def test_a_call_past_the_limit_scores_zero_and_is_counted(plugin: str) -> None:
    with ScoringPool(f"{plugin}:sleep_on_request", num_workers=2, timeout_s=TIMEOUT_S) as pool:
        batch = pool.score(rows(3), ["ok", "sleep", "ok"])
    assert batch == BatchScores([1.0, 0.0, 1.0], timed_out=1, crashed=0)


@pytest.mark.slow
def test_a_stuck_call_does_not_hold_up_the_rest_of_the_batch(plugin: str) -> None:
    with ScoringPool(f"{plugin}:sleep_on_request", num_workers=2, timeout_s=TIMEOUT_S) as pool:
        pool.score(rows(1), ["ok"])
        start = time.monotonic()
        batch = pool.score(rows(41), ["sleep"] + ["ok"] * 40)
        elapsed_s = time.monotonic() - start
    assert batch.scores == [0.0] + [1.0] * 40
    assert elapsed_s < TIMEOUT_S + 5.0  # the stuck call sleeps an hour; 5 s leaves room for a busy machine


@pytest.mark.slow
def test_the_pool_scores_normally_after_a_timeout(plugin: str) -> None:
    with ScoringPool(f"{plugin}:sleep_on_request", num_workers=1, timeout_s=TIMEOUT_S) as pool:
        pool.score(rows(1), ["sleep"])
        assert pool.score(rows(2), ["ok", "ok"]) == BatchScores([1.0, 1.0], timed_out=0, crashed=0)


def test_the_limit_holds_when_scoring_from_a_thread(plugin: str) -> None:
    outcome: dict[str, object] = {}

    def score_in_thread() -> None:
        with ScoringPool(f"{plugin}:sleep_on_request", num_workers=1, timeout_s=TIMEOUT_S) as pool:
            outcome["batch"] = pool.score(rows(2), ["sleep", "ok"])

    thread = threading.Thread(target=score_in_thread)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert outcome["batch"] == BatchScores([0.0, 1.0], timed_out=1, crashed=0)


def test_a_worker_that_exits_is_counted_as_crashed_and_replaced(plugin: str) -> None:
    with ScoringPool(f"{plugin}:exit_on_request", num_workers=1, timeout_s=5.0) as pool:
        batch = pool.score(rows(3), ["ok", "exit", "ok"])
    assert batch == BatchScores([1.0, 0.0, 1.0], timed_out=0, crashed=1)


@pytest.mark.slow
def test_an_exception_in_the_reward_function_is_raised_naming_the_row(plugin: str) -> None:
    with ScoringPool(f"{plugin}:raise_key_error", num_workers=2) as pool:
        with pytest.raises(ValueError, match=r"data_source 'plugin', extra_info index 0: KeyError: 'missing"):
            pool.score(rows(1), ["x"])


def test_a_score_outside_zero_one_is_rejected(plugin: str) -> None:
    with ScoringPool(f"{plugin}:too_high", num_workers=1) as pool:
        with pytest.raises(ValueError, match=r"extra_info index 0 must be in \[0, 1\], got 1.5"):
            pool.score(rows(1), ["x"])


@pytest.mark.parametrize("workers", [0, 2])
def test_a_reward_error_quotes_a_bounded_part_of_the_response(plugin: str, workers: int) -> None:
    response = "Let me think. " + "x" * 5000 + " So the answer is \\boxed{42}"
    with ScoringPool(f"{plugin}:raise_key_error", num_workers=workers) as pool:
        with pytest.raises(ValueError) as raised:
            pool.score(rows(1), [response])
    quoted = str(raised.value).split("(response: ", 1)[1]
    assert quoted.startswith("'Let me think. xxx") and quoted.endswith("So the answer is \\\\boxed{42}')")
    assert f"…[{len(response) - QUOTED_RESPONSE_CHARS} characters]…" in quoted
    assert len(quoted) < QUOTED_RESPONSE_CHARS + 50


def test_the_pool_scores_normally_after_a_reward_function_error(plugin: str) -> None:
    with ScoringPool(f"{plugin}:length_score", num_workers=2) as pool:
        with pytest.raises(ValueError):
            pool.score(rows(2), ["a" * 11, "a"])
        assert pool.score(rows(2), ["a", "aa"]).scores == [0.1, 0.2]


def test_zero_workers_score_in_this_process(plugin: str) -> None:
    pool = ScoringPool(f"{plugin}:process_id", num_workers=0)
    assert pool.score(rows(1, ground_truth=str(os.getpid())), ["x"]).scores == [1.0]


def test_zero_workers_raise_reward_function_errors_naming_the_row(plugin: str) -> None:
    pool = ScoringPool(f"{plugin}:raise_key_error", num_workers=0)
    with pytest.raises(ValueError, match=r"extra_info index 0: KeyError: 'missing_field'"):
        pool.score(rows(1), ["x"])


@pytest.mark.slow
def test_the_default_function_scores_by_data_source() -> None:
    batch_rows = rows(1, "arithmetic", "46") + rows(1, "amc23", "27.0")
    # a limit no call reaches even on a busy machine, where a fresh worker's first call can pass 1 s
    with ScoringPool(num_workers=2, timeout_s=60) as pool:
        assert pool.score(batch_rows, ["\\boxed{46}", "so \\boxed{\\frac{54}{2}}"]).scores == [1.0, 1.0]


def test_a_math_answer_past_the_limit_is_counted_by_the_pool() -> None:
    with ScoringPool(num_workers=1, timeout_s=TIMEOUT_S) as pool:
        batch = pool.score(rows(1, "math500", "1"), ["\\boxed{(10^{10^{10}})!}"])
    assert batch == BatchScores([0.0], timed_out=1, crashed=0)


def test_a_math_answer_past_the_verifiers_own_limit_is_counted_in_process() -> None:
    pool = ScoringPool(num_workers=0)
    batch = pool.score(rows(2, "math500", "1"), ["\\boxed{(10^{10^{10}})!}", "\\boxed{1}"])
    assert batch == BatchScores([0.0, 1.0], timed_out=1, crashed=0)


def test_an_unknown_function_is_rejected_when_the_pool_is_made() -> None:
    with pytest.raises(ValueError, match="Cannot import module 'no_such_module_xyz'"):
        ScoringPool("no_such_module_xyz:score")


@pytest.mark.parametrize("num_workers", [-1, 1.5])
def test_an_invalid_worker_count_is_rejected(num_workers: int) -> None:
    with pytest.raises(ValueError, match="num_workers must be an integer >= 0"):
        ScoringPool(num_workers=num_workers)


@pytest.mark.parametrize("timeout_s", [0, float("inf")])
def test_a_limit_that_is_not_positive_and_finite_is_rejected(timeout_s: float) -> None:
    with pytest.raises(ValueError, match=f"timeout_s must be a positive, finite number of seconds, got {timeout_s}"):
        ScoringPool(timeout_s=timeout_s)


def test_rows_and_responses_must_pair_up() -> None:
    with pytest.raises(ValueError, match="Got 2 rows but 1 responses"):
        ScoringPool(num_workers=0).score(rows(2, "arithmetic"), ["\\boxed{1}"])


@pytest.mark.slow
def test_a_program_started_by_the_reward_function_cannot_forge_a_result(plugin: str, tmp_path: Path) -> None:
    marker = tmp_path / "forged pickle ran"
    with ScoringPool(f"{plugin}:run_a_forging_program", num_workers=1, timeout_s=30) as pool:
        batch = pool.score(rows(1, ground_truth=str(marker)), ["x"])
    assert not marker.exists()
    assert batch == BatchScores([0.0], timed_out=0, crashed=0)


@pytest.mark.slow
def test_a_worker_that_exits_leaving_a_background_program_is_counted_as_crashed(plugin: str) -> None:
    with ScoringPool(f"{plugin}:exit_after_starting_a_background_program", num_workers=1, timeout_s=20) as pool:
        assert pool.score(rows(1), ["x"]) == BatchScores([0.0], timed_out=0, crashed=1)


@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize(
    ("function", "error_text"),
    [
        ("call_sys_exit", "SystemExit: 3"),
        ("raise_unprintable", "Unprintable: <str() of the exception raised RuntimeError>"),
    ],
)
@pytest.mark.slow
def test_an_exit_or_an_unprintable_exception_is_raised_naming_the_row(
    plugin: str, function: str, error_text: str, num_workers: int
) -> None:
    with ScoringPool(f"{plugin}:{function}", num_workers=num_workers) as pool:
        with pytest.raises(ValueError, match=f"extra_info index 0: {re.escape(error_text)}"):
            pool.score(rows(1), ["x"])


@pytest.mark.slow
def test_a_keyboard_interrupt_raised_by_the_reward_function_in_a_worker_is_raised(plugin: str) -> None:
    with ScoringPool(f"{plugin}:raise_keyboard_interrupt", num_workers=1) as pool:
        with pytest.raises(ValueError, match="extra_info index 0: KeyboardInterrupt"):
            pool.score(rows(1), ["x"])


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_score_too_large_for_a_float_is_rejected(plugin: str, num_workers: int) -> None:
    with ScoringPool(f"{plugin}:huge_integer", num_workers=num_workers) as pool:
        with pytest.raises(ValueError, match=r"extra_info index 0 must be in \[0, 1\], got a number too large"):
            pool.score(rows(1), ["x"])


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_numpy_bool_is_a_score(plugin: str, num_workers: int) -> None:
    with ScoringPool(f"{plugin}:numpy_true", num_workers=num_workers) as pool:
        assert pool.score(rows(1), ["x"]).scores == [1.0]


@pytest.mark.slow
def test_what_the_reward_function_prints_reaches_standard_error(plugin: str, tmp_path: Path) -> None:
    script = (
        "import sys\n"
        f"sys.path.insert(0, {str(Path(sys.modules[plugin].__file__).parent)!r})\n"
        "from pacs.rewards import ScoringPool\n"
        f"with ScoringPool('{plugin}:print_and_score', num_workers=1) as pool:\n"
        "    print('scores', pool.score([{'data_source': 's', 'reward_model': {'ground_truth': '1'}}], ['x']).scores)\n"
    )
    caller = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert caller.returncode == 0, caller.stderr
    assert "printed by the reward function" in caller.stderr
    assert caller.stdout == "scores [1.0]\n"


@pytest.mark.slow
def test_a_scoring_server_that_dies_is_started_again_and_the_batch_says_so(plugin: str) -> None:
    with ScoringPool(f"{plugin}:kill_the_server", num_workers=1, timeout_s=10.0) as pool:
        killed = pool.score(rows(2), ["kill", "fine"])
        after = pool.score(rows(1), ["fine"])
    assert killed.server_restarts == 1 and killed.scores == [0.0, 1.0] and killed.crashed == 1
    assert after == BatchScores([1.0])
