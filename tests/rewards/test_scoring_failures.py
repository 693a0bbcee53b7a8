"""A reward function that never answers fails loudly: before the model loads when it cannot score
one real row in time, and otherwise with a warning for every step (or evaluation batch) whose
answers mostly got no score, then an error naming the function after a set number of them in a row."""

from __future__ import annotations

import pytest
from running import run

import pacs.rewards.checks as checks
from pacs.rewards.pool import ScoringFailed, ScoringWatch
from pacs.train.metrics import read_metrics

SLOW_REWARDS = '''\
import time

def sleeps_forever(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep(3600)

def hangs_on_model_answers(data_source, solution_str, ground_truth, extra_info=None):
    """Answers the check that pacs makes before the model loads (the ground truth, boxed), then
    hangs on everything a model writes."""
    if solution_str == "\\\\boxed{" + ground_truth + "}":
        return 1.0
    time.sleep(3600)
'''
TINY_RUN = [
    "data.train=builtin:arithmetic?size=8",
    "data.val=null",
    "train.batch_size=2",
    "train.mini_batch_size=2",
    "rollout.n=2",
    "data.max_response_length=4",
    "reward.timeout_s=0.2",
]


@pytest.fixture
def slow_rewards(tmp_path, monkeypatch) -> None:
    """slow_rewards.py importable; the check before the model loads gives a function 1 s, not 10."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "slow_rewards.py").write_text(SLOW_REWARDS)
    monkeypatch.syspath_prepend(str(code))
    monkeypatch.setattr(checks, "PROBE_LIMIT_S", 1.0)


def watch(stop_after: int) -> ScoringWatch:
    return ScoringWatch(
        "mine:score", remedy="reward.timeout_s=1", stop_after=stop_after, stop_option="reward.stop_after_failing_steps"
    )


def test_a_step_whose_answers_mostly_got_no_score_is_warned_about_with_the_function_and_remedy():
    warning = watch(3).observe("step 4", timed_out=5, crashed=1, answers=8)
    assert warning == (
        "warning: step 4: reward function mine:score gave no score to 6 of 8 answers (5 timed out, 1 crashed), which "
        "scored 0. Make it answer within its limits (reward.timeout_s=1) or raise them; the run stops after 2 steps more "
        "like it in a row (reward.stop_after_failing_steps)"
    )


def test_a_step_with_fewer_than_half_its_answers_unscored_passes_and_resets_the_count():
    scoring = watch(2)
    assert scoring.observe("step 1", timed_out=4, crashed=0, answers=8) is not None
    assert scoring.observe("step 2", timed_out=3, crashed=0, answers=8) is None
    assert scoring.observe("step 3", timed_out=8, crashed=0, answers=8) is not None  # the first of a new run


def test_the_set_number_of_failing_steps_in_a_row_stops_naming_the_function_and_the_steps():
    scoring = watch(2)
    scoring.observe("step 1", timed_out=8, crashed=0, answers=8)
    with pytest.raises(
        ScoringFailed,
        match=r"reward function mine:score gave no score to most answers in 2 steps in a row "
        r"\(step 1: 8 of 8; step 2: 7 of 8 timed out or crashed\).*reward.stop_after_failing_steps=0",
    ):
        scoring.observe("step 2", timed_out=6, crashed=1, answers=8)


def test_each_death_of_the_scoring_server_is_warned_about_and_the_set_number_stops_the_run():
    watch = ScoringWatch("default_compute_score", remedy="", stop_after=3, stop_option="", max_server_restarts=2)
    assert watch.observe_restarts("step 1", 0) is None
    assert "step 2: the worker server of reward function default_compute_score died unexpectedly" in (
        watch.observe_restarts("step 2", 1) or ""
    )
    with pytest.raises(ScoringFailed, match=r"died unexpectedly 2 times \(step 2, step 5\); stopped"):
        watch.observe_restarts("step 5", 1)


def test_zero_never_stops():
    scoring = watch(0)
    for step in range(1, 10):
        assert "stop" not in scoring.observe(f"step {step}", timed_out=8, crashed=0, answers=8)


def test_a_run_with_a_reward_function_that_sleeps_forever_stops_naming_it_before_the_model_loads(
    tmp_path, slow_rewards, tiny_model_dir, monkeypatch, capsys
):
    monkeypatch.setattr("pacs.models.loading._from_pretrained", lambda *a: pytest.fail("the model was loaded"))
    arguments = ["train", f"output_dir={tmp_path / 'run'}", f"model.path={tiny_model_dir}", *TINY_RUN,
                 "reward.function=slow_rewards:sleeps_forever"]  # fmt: skip
    assert run(arguments) == 2
    assert "reward function slow_rewards:sleeps_forever gave no score within 1 s" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_run_whose_reward_function_hangs_on_the_models_answers_warns_each_step_then_stops_naming_it(
    tmp_path, slow_rewards, tiny_model_dir, capsys
):
    arguments = ["train", f"output_dir={tmp_path / 'run'}", f"model.path={tiny_model_dir}", *TINY_RUN, "train.steps=20",
                 "reward.function=slow_rewards:hangs_on_model_answers", "reward.stop_after_failing_steps=2"]  # fmt: skip
    assert run(arguments) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert "warning: step 1: reward function slow_rewards:hangs_on_model_answers gave no score to 4 of 4 answers" in error
    assert (
        "pacs train: error: reward function slow_rewards:hangs_on_model_answers gave no score to most answers in 2 steps "
        "in a row (step 1: 4 of 4; step 2: 4 of 4 timed out or crashed)"
    ) in error
    assert [row["reward/timeouts"] for row in read_metrics(tmp_path / "run")] == [4.0, 4.0]


@pytest.mark.slow
@pytest.mark.parametrize("stop_after", [1, 0])
def test_an_evaluation_whose_answers_get_no_score_warns_and_stops_unless_told_not_to(
    tmp_path, slow_rewards, tiny_model_dir, capsys, stop_after
):
    arguments = ["eval", "--model", str(tiny_model_dir), "--data", "builtin:arithmetic?size=3", "--n", "2",
                 "--max-tokens", "4", "--reward-timeout", "0.2", "--reward-function", "slow_rewards:hangs_on_model_answers",
                 "--stop-after-failing-batches", str(stop_after), "--out", str(tmp_path / "eval")]  # fmt: skip
    assert run(arguments) == (2 if stop_after else 0)
    error = " ".join(capsys.readouterr().err.split())
    if stop_after:
        assert (
            "pacs eval: error: reward function slow_rewards:hangs_on_model_answers gave no score to most answers in 1 batch in a row"
            in error
        )
        assert not (tmp_path / "eval" / "eval_metrics.json").exists()
    else:
        assert (
            "warning: arithmetic problems 1-3 of 3: reward function slow_rewards:hangs_on_model_answers gave no score to 6 of 6"
            in error
        )
        assert (tmp_path / "eval" / "eval_metrics.json").is_file()
