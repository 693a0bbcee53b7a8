"""A reward that gives every group both outcomes, whatever the model samples (`reward.function` of
the tests that need a gradient from a run on the warm-started model, which every machine builds for
itself: on one machine's model all 128 samples of a short run scored 0, so no group had a gradient).

`alternating_score` scores 1, 0, 1, 0, ... in call order. With `reward.num_workers=0` the trainer
scores a step's responses in this process, one after another, in response order, where each
prompt's `rollout.n` responses are adjacent; with an even `rollout.n` every group then holds as many
1s as 0s, from whichever call it starts."""

from __future__ import annotations

import itertools

_calls = itertools.count()


def alternating_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    return float(next(_calls) % 2 == 0)


MIXED_GROUPS = ["reward.function=mixed_rewards:alternating_score", "reward.num_workers=0"]
"""Overrides that give every group of an even `rollout.n` both outcomes (see the module docstring)."""
EXACT_TWO_STEPS = [
    "model.dtype=float64",
    "data.val=null",
    "train.steps=2",
    "train.batch_size=4",
    "train.mini_batch_size=2",
    "train.micro_batch_size=3",
    "rollout.n=4",
    "data.max_response_length=6",
    "train.report_to=[]",
    *MIXED_GROUPS,
]
"""A two-step float64 run with a micro-batch that splits groups, whose weights a run by another path
(a shortcut, a packing) must reach exactly."""
