"""Per-step metrics: strict JSON in metrics.jsonl, rollout statistics over tokens; traces.jsonl."""

from __future__ import annotations

import json

import pytest
import torch
from torchrun_jobs import tensorboard_steps

from pacs.config import Config, load_config
from pacs.rollout.base import Rollouts
from pacs.train.metrics import MetricsLogger, read_metrics, summary_lines
from pacs.train.trainer import rollout_metrics


def test_undefined_metrics_are_written_as_null_in_strict_json(tmp_path):
    logger = MetricsLogger(tmp_path)
    logger.log(1, {"critic/explained_variance": float("nan"), "grad_norm": float("inf"), "loss": 0.5})
    logger.close()
    line = (tmp_path / "metrics.jsonl").read_text().strip()
    strict = json.loads(line, parse_constant=lambda token: (_ for _ in ()).throw(ValueError(token)))
    assert strict == {"step": 1, "critic/explained_variance": None, "grad_norm": None, "loss": 0.5}
    assert read_metrics(tmp_path) == [strict]


def test_entropy_is_the_mean_over_response_tokens_not_over_responses():
    lengths = torch.tensor([4.0, 1.0])
    entropy_sums = torch.tensor([4.0, 6.0])  # per-token entropies 1, 1, 1, 1 and 6
    metrics = rollout_metrics(torch.tensor([1.0, 0.0]), lengths, entropy_sums, group_size=2, max_response_length=8)
    assert metrics["actor/entropy"] == 2.0  # (4 * 1 + 6) / 5 tokens; per-response means give 3.5


def test_clip_ratio_is_the_fraction_of_responses_that_reached_the_length_limit():
    lengths = torch.tensor([16.0, 3.0, 16.0, 15.0])
    metrics = rollout_metrics(torch.zeros(4), lengths, torch.ones(4), group_size=2, max_response_length=16)
    assert metrics["response_length/clip_ratio"] == 0.5


def test_resume_drops_later_steps_and_a_last_line_cut_short_by_a_kill(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n{"step": 3, "loss": 0.3}\n{"step": 4, "lo'
    )
    logger = MetricsLogger(tmp_path, resume_step=2)
    logger.close()
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_resume_refuses_an_unreadable_line_before_the_last(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\nnot json\n{"step": 3, "loss": 0.3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl, line 2: not a JSON object"):
        MetricsLogger(tmp_path, resume_step=2)


def test_the_summary_says_validation_before_and_after_training_and_the_reward_from_step_1(tmp_path):
    rows = [
        {"step": 0, "val/arithmetic/pass@1": 0.195, "time/validate_s": 2.0},
        {"step": 1, "reward/mean": 0.25},
        {"step": 2, "reward/mean": 0.5, "val/arithmetic/pass@1": 0.387},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    lines = summary_lines(tmp_path, Config())
    assert lines[:2] == [
        "training reward (mean): 0.250 at step 1 -> 0.500 at step 2",
        "validation arithmetic/pass@1: 19.5% at step 0 -> 38.7% at step 2",
    ]


def test_a_run_started_again_in_place_shows_its_validation_at_step_0_once_in_tensorboard(tmp_path):
    config = load_config("builtin:demo", ["train.report_to=[tensorboard]"])
    for value in (0.1, 0.2):  # the first start stopped before its first step ended
        logger = MetricsLogger(tmp_path, config=config)
        logger.log(0, {"val/arithmetic/pass@1": value})
        logger.close()
    assert tensorboard_steps(tmp_path, "val/arithmetic/pass@1") == [0]


class DigitTokenizer:
    """Decodes token t as the character chr(ord("a") + t)."""

    def decode(self, token_ids, skip_special_tokens=False):
        return "".join(chr(ord("a") + token) for token in token_ids)


def test_traces_hold_the_first_response_of_each_of_the_first_prompts_with_its_turns(tmp_path):
    rollouts = Rollouts(
        prompt_ids=torch.tensor([[0, 1], [0, 1], [0, 2], [0, 2], [0, 3], [0, 3]]),
        prompt_mask=torch.tensor([[0, 1]] * 6),
        response_ids=torch.tensor([[4, 5, 6, 7], [8, 0, 0, 0], [9, 10, 11, 0], [8, 0, 0, 0], [12, 0, 0, 0], [8, 0, 0, 0]]),
        response_mask=torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]]),
        response_texts=[""] * 6,
        group_size=2,
        model_token_mask=torch.tensor([[1, 0, 0, 1], [1, 0, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]]),
    )
    rows = [{"data_source": f"source{row // 2}", "reward_model": {"ground_truth": str(row // 2)}} for row in range(6)]
    logger = MetricsLogger(tmp_path)
    logger.log_traces(3, rows, rollouts, [1.0, 0.0, 0.5, 0.0, 0.0, 0.0], DigitTokenizer(), count=2)
    logger.close()
    (line,) = (tmp_path / "traces.jsonl").read_text().splitlines()
    assert json.loads(line) == {
        "step": 3,
        "trajectories": [
            {
                "data_source": "source0",
                "prompt": "b",
                "ground_truth": "0",
                "turns": [{"model": "e"}, {"tool": "fg"}, {"model": "h"}],
                "reward": 1.0,
            },
            {"data_source": "source1", "prompt": "c", "ground_truth": "1", "turns": [{"model": "jkl"}], "reward": 0.5},
        ],
    }


def test_resume_drops_the_traces_of_later_steps_and_a_last_line_cut_short_by_a_kill(tmp_path):
    (tmp_path / "traces.jsonl").write_text('{"step": 1, "trajectories": []}\n{"step": 2, "trajectories": []}\n{"step": 3, "tr')
    logger = MetricsLogger(tmp_path, resume_step=1)
    logger.close()
    assert (tmp_path / "traces.jsonl").read_text() == '{"step": 1, "trajectories": []}\n'
