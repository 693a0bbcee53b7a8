"""`perf/mfu` of a step (`pacs.train.throughput.step_mfu`): the 6ND count of every pass the step
made over each row, in float64 against the formula worked by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pacs.distributed.world import World
from pacs.train.throughput import StepWork, step_mfu

# Row 0: 3 prompt + 2 response tokens, row 1: 2 + 1.
BATCH = SimpleNamespace(
    prompt_mask=torch.tensor([[1, 1, 1], [0, 1, 1]]),
    response_mask=torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64),
)
PEAK_FLOPS = 100.0


def work(**passes) -> StepWork:
    """A step of 2 s with a policy of 10 parameters, the reference's pass and 2 epochs, and `passes`."""
    return StepWork(seconds=2.0, policy_parameters=10.0, reference_pass=True, epochs=2, **passes)


def test_each_rows_passes_are_counted_the_first_update_giving_the_old_logprobs_of_its_rows():
    mfu = step_mfu(World.single(), BATCH, work(critic_parameters=4.0, first_update_rows=1, updates_policy=True), PEAK_FLOPS)
    # policy: row 0 generation + reference (its old log-probs from the first update), row 1 also
    # the old log-probs' pass, 2 epochs each; critic: values and 2 epochs over both rows
    flops = 5 * 10 * (2 * 2 + 6 * 2) + 3 * 10 * (2 * 3 + 6 * 2) + (5 + 3) * 4 * (2 + 6 * 2)
    assert mfu == {"perf/mfu": flops / (2.0 * 100.0)}


def test_a_critics_warm_up_counts_no_policy_update():
    mfu = step_mfu(World.single(), BATCH, work(critic_parameters=4.0, first_update_rows=0, updates_policy=False), PEAK_FLOPS)
    flops = (5 + 3) * 10 * 2 * 3 + (5 + 3) * 4 * (2 + 6 * 2)
    assert mfu["perf/mfu"] == pytest.approx(flops / 200.0, rel=1e-15)


def test_without_a_peak_no_mfu_is_logged():
    step = work(critic_parameters=None, first_update_rows=0, updates_policy=True)
    assert step_mfu(World.single(), BATCH, step, peak_flops=None) == {}
