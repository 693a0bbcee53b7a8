"""Specification of DAPO's dynamic sampling (pacs.train.dynamic_sampling): which groups a step keeps
and when it stops drawing. The draws here are made up (token ids name their round and group); the
trainer's own use of it runs in tests/train/test_train_loop.py."""

from __future__ import annotations

import dataclasses

import torch

from pacs.distributed.world import World
from pacs.rewards.pool import BatchScores
from pacs.rollout.base import Rollouts
from pacs.train.dynamic_sampling import Draw, sample_mixed_groups

GROUP_SIZE = 2


def made_up_draw(round_number: int, group_rewards: list[tuple[float, float]], response_width: int) -> Draw:
    """A round of len(group_rewards) groups of two responses; response token ids are
    100·round + group, prompt ids 10·round + group (prompts one token wider each round)."""
    rows = len(group_rewards) * GROUP_SIZE
    groups = torch.arange(rows) // GROUP_SIZE
    prompt_width = round_number + 1
    return Draw(
        rows=[{"round": round_number, "group": int(group)} for group in groups],
        rollouts=Rollouts(
            prompt_ids=(10 * round_number + groups)[:, None].expand(rows, prompt_width).clone(),
            prompt_mask=torch.ones(rows, prompt_width, dtype=torch.long),
            response_ids=(100 * round_number + groups)[:, None].expand(rows, response_width).clone(),
            response_mask=torch.ones(rows, response_width, dtype=torch.long),
            response_texts=[f"{round_number}:{int(group)}" for group in groups],
            group_size=GROUP_SIZE,
        ),
        scored=BatchScores([reward for pair in group_rewards for reward in pair], timed_out=round_number),
    )


def drawing(rounds: list[list[tuple[float, float]]]):
    made = iter(made_up_draw(number, rewards, response_width=3 + number) for number, rewards in enumerate(rounds))
    return lambda: next(made)


def test_it_draws_until_the_step_holds_enough_mixed_groups_and_keeps_them_in_order():
    rounds = [[(1, 1), (1, 0), (0, 0)], [(0, 0), (0, 1), (1, 1)], [(1, 0), (1, 0), (1, 0)]]
    sample, metrics = sample_mixed_groups(drawing(rounds), World.single(), group_size=GROUP_SIZE, groups=3, max_rounds=10)
    assert sample.rollouts.response_texts == ["0:1", "0:1", "1:1", "1:1", "2:0", "2:0"]
    assert [(row["round"], row["group"]) for row in sample.rows] == [(0, 1), (0, 1), (1, 1), (1, 1), (2, 0), (2, 0)]
    assert sample.scored.scores == [1, 0, 0, 1, 1, 0]
    assert metrics == {"sampling/rounds": 3.0, "sampling/unmixed_groups": 0.0}


def test_a_step_whose_first_round_is_all_mixed_draws_once():
    rounds = [[(1, 0), (0, 1)], [(1, 0), (1, 0)]]
    sample, metrics = sample_mixed_groups(drawing(rounds), World.single(), group_size=GROUP_SIZE, groups=2, max_rounds=10)
    assert sample.rollouts.response_texts == ["0:0", "0:0", "0:1", "0:1"]
    assert metrics["sampling/rounds"] == 1.0


def test_at_the_cap_the_step_is_topped_up_with_unmixed_groups_and_says_how_many():
    rounds = [[(1, 1), (0, 0), (0, 1)], [(1, 1), (0, 0), (0, 0)]]
    sample, metrics = sample_mixed_groups(drawing(rounds), World.single(), group_size=GROUP_SIZE, groups=3, max_rounds=2)
    assert sample.rollouts.response_texts == ["0:2", "0:2", "0:0", "0:0", "0:1", "0:1"]
    assert metrics == {"sampling/rounds": 2.0, "sampling/unmixed_groups": 2.0}


def test_groups_of_rounds_of_other_widths_are_padded_and_keep_their_tokens():
    rounds = [[(0, 0), (1, 0)], [(0, 1), (1, 1)]]
    sample, _ = sample_mixed_groups(drawing(rounds), World.single(), group_size=GROUP_SIZE, groups=2, max_rounds=5)
    rollouts = sample.rollouts
    assert rollouts.prompt_ids.shape == (4, 2) and rollouts.response_ids.shape == (4, 4)
    assert rollouts.prompt_mask.tolist() == [[0, 1], [0, 1], [1, 1], [1, 1]]
    assert rollouts.response_mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]]
    assert rollouts.prompt_ids[:, -1].tolist() == [1, 1, 10, 10]
    assert rollouts.response_ids[:, 0].tolist() == [1, 1, 100, 100]


def test_scoring_failures_count_every_round():
    rounds = [[(1, 1)], [(1, 1)], [(0, 1)]]
    sample, _ = sample_mixed_groups(drawing(rounds), World.single(), group_size=GROUP_SIZE, groups=1, max_rounds=5)
    assert sample.scored.timed_out == 0 + 1 + 2


def test_the_tool_tokens_of_the_kept_groups_stay_marked_after_padding():
    def with_tool_token(draw: Draw) -> Draw:
        model_tokens = torch.ones_like(draw.rollouts.response_mask)
        model_tokens[:, 1] = 0
        return dataclasses.replace(draw, rollouts=dataclasses.replace(draw.rollouts, model_token_mask=model_tokens))

    made = iter(
        with_tool_token(made_up_draw(number, rewards, response_width=3 + number))
        for number, rewards in enumerate([[(0, 0), (1, 0)], [(0, 1), (1, 1)]])
    )
    sample, _ = sample_mixed_groups(lambda: next(made), World.single(), group_size=GROUP_SIZE, groups=2, max_rounds=5)
    assert sample.rollouts.model_token_mask.tolist() == [[1, 0, 1, 0], [1, 0, 1, 0], [1, 0, 1, 1], [1, 0, 1, 1]]
