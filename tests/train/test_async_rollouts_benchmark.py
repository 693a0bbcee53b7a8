"""benchmarks/async_rollouts.py reads its runs as they are: pacs's refusal of an option it lacks,
metrics.jsonl's phases, and the split-of-devices arithmetic (no timings are asserted)."""

from __future__ import annotations

import pytest
from async_rollouts import NOT_AVAILABLE, refuses_unknown, split_devices, summarise, table  # benchmarks/

from pacs.config import load_config


def test_a_pacs_without_an_option_is_recognised_from_its_configuration_error():
    with pytest.raises(ValueError) as refused:
        load_config("builtin:demo", ["rollout.no_such_option=1"])
    assert refuses_unknown("rollout.no_such_option", f"pacs train: error: {refused.value}")
    assert not refuses_unknown(
        "rollout.no_such_option", "pacs train: error: rollout.n: Input should be greater than or equal to 1"
    )


def test_medians_leave_out_the_first_step_and_take_each_phase_where_it_was_logged():
    rows = [
        {"time/step_s": 9.0, "time/generate_s": 5.0, "model/total_parameters": 10.0},
        {"time/step_s": 2.0, "time/generate_s": 1.0, "rollout/staleness_max": 1.0},
        {
            "time/step_s": 4.0,
            "time/generate_s": 3.0,
            "time/wait_rollout_s": 0.5,
            "rollout/generator_s": 2.5,
            "rollout/staleness_max": 0.0,
        },
        {"time/step_s": 3.0, "time/generate_s": 2.0, "rollout/staleness_max": 1.0},
    ]
    summary = summarise(rows)
    assert summary["median_step_s"] == 3.0 and summary["steps_per_s"] == 1 / 3.0
    assert summary["phases"] == {"time/generate_s": 2.0, "time/wait_rollout_s": 0.5, "rollout/generator_s": 2.5}
    assert summary["staleness_max"] == 1.0 and summary["parameters"] == 10.0


def test_each_step_after_the_first_keeps_its_own_phases_none_where_it_logged_none():
    rows = [
        {"time/step_s": 9.0, "time/weight_sync_s": 0.4},
        {"time/step_s": 2.0, "time/weight_sync_s": 0.1},
        {"time/step_s": 3.0, "time/generate_s": 1.0},
    ]
    assert summarise(rows)["phases_per_step"] == {"time/generate_s": [None, 1.0], "time/weight_sync_s": [0.1, None]}


def test_a_split_of_devices_overlaps_generation_with_the_rest_and_adds_the_weight_sync():
    run = {"median_step_s": 10.0, "phases": {"time/generate_s": 4.0, "time/weight_sync_s": 1.0}}
    split = split_devices(run)
    assert split["rest_s"] == 5.0 and split["predicted_step_s"] == 6.0 and split["speedup"] == 10.0 / 6.0


def test_a_refused_staleness_is_a_row_that_says_so():
    runs = [
        {"staleness": 0, "available": True, "median_step_s": 2.0, "steps_per_s": 0.5, "staleness_max": None,
         "threads": 1, "load_before": 0.1, "load_after": 0.2, "phases": {"time/generate_s": 1.0}},
        {"staleness": 1, "available": False, "why": NOT_AVAILABLE, "threads": 1, "load_before": 0.2, "load_after": 0.2},
    ]  # fmt: skip
    header, rule, synchronous, refused = table(runs).splitlines()
    assert synchronous.startswith("| 0 | 2.00 | 1.00 | 0.500 | - |") and synchronous.endswith("| 1.00 |")
    assert refused.startswith(f"| 1 | {NOT_AVAILABLE} |")
    assert header.count("|") == rule.count("|") == synchronous.count("|") == refused.count("|")
