"""Specification of `pacs.integrations.trl` (PACS for TRL users), checked against TRL itself.

TRL is not a dependency of pacs: the checks run in one subprocess in the TRL venv `.peer-venvs/trl`
(made by benchmarks/peer_venvs.py on first use, minutes; reused afterwards), which writes a JSON of
results (tests/helpers/integration_trl_checks.py) that the tests below read. No network on first use fails
these tests, saying so.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from peer_checks import check_result, run_in_peer_venv


@pytest.fixture(scope="module")
def checks(warm_model_dir, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("trl-checks") / "checks.json"
    return run_in_peer_venv("trl", "integration_trl_checks.py", [str(warm_model_dir)], out)


def test_importing_the_module_needs_no_trl_and_its_classes_name_the_extra() -> None:
    import pacs.integrations.trl as integration

    if subprocess.run([sys.executable, "-c", "import trl"], capture_output=True).returncode == 0:
        pytest.skip("TRL is installed in this venv")
    with pytest.raises(ImportError, match=r"pacs\[trl\]"):
        integration.PACSTrainer


def assert_gradients_match(check: dict) -> None:
    assert check["gradient_names"] and check["max_abs_grad"] > 1e-4
    assert check["max_abs_grad_diff"] <= 1e-6 * max(1.0, check["max_abs_grad"])


def test_one_step_gradient_equals_pacs_algos_on_the_whole_batch_though_trl_splits_its_groups(checks) -> None:
    exact = check_result(checks, "exact")
    assert exact["groups_split"] >= 1, f"no group was split across micro-batches: {exact['micro_batch_rows']}"
    assert len(exact["micro_batch_rows"]) == 2 and 0 < sum(exact["rewards"]) < len(exact["rewards"])
    assert_gradients_match(exact)


def test_the_loss_trl_logs_is_the_pacs_loss(checks) -> None:
    assert check_result(checks, "exact")["trl_loss"] == pytest.approx(checks["exact"]["reference_loss"], abs=1e-6)


def test_the_optimizer_step_moves_the_parameters(checks) -> None:
    assert check_result(checks, "exact")["parameters_moved"]


def test_two_processes_compute_the_gradient_of_one_process_on_both_batches(checks) -> None:
    """`accelerate launch` with 2 processes (gloo on a CPU), a prompt's completions split across them:
    each process's (averaged) gradient is pacs_loss's on the 12 rows of both."""
    two = check_result(checks, "two_processes")
    assert two["num_processes"] == [2, 2] and two["prompts_split_across_processes"] >= 1
    assert sorted(two["rows"][0] + two["rows"][1]) == list(range(12))
    assert_gradients_match(two)


def test_checkpoints_are_written_at_each_save_step_with_the_config_pickled(checks) -> None:
    saved = check_result(checks, "checkpoints")
    assert saved["checkpoints"] == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    assert saved["saved_args_class"] == "pacs.integrations.trl_trainer.PACSConfig"
    assert saved["saved_model"]


def test_a_run_resumed_from_a_checkpoint_continues_it_exactly(checks) -> None:
    """Resumed from checkpoint-2 of a 3-step run, the trainer runs step 3 only and ends with the
    weights the uninterrupted run ended with."""
    saved = check_result(checks, "checkpoints")
    assert saved["resumed_steps"] == [3] and saved["resumed_global_step"] == 3
    assert saved["parameters_moved_in_step_3"]
    assert saved["max_abs_param_diff"] == 0.0


def test_vllm_mismatch_correction_scales_each_completions_whole_coefficient_by_its_own_weight(checks) -> None:
    """TRL's sequence-level vLLM correction and off-policy mask kept, in PACS's sound form: the
    gradient is Σ_k ρ_k · (completion k's part of pacs_loss's gradient), ρ from TRL's own ratios."""
    corrected = check_result(checks, "sampler_correction")
    weights = corrected["weights"]
    assert corrected["trl_logged_ratio"]
    assert 0.0 in weights and any(weight not in (0.0, 1.0) for weight in weights), weights
    assert_gradients_match(corrected)


def test_a_reward_function_returning_none_is_handled_as_trl_does(checks) -> None:
    """None counts as 0 when another function scored the completion; a completion no function
    scored is left out of its prompt's group (groups of 3 and 4) and of the loss's mean."""
    unscored = check_result(checks, "unscored_rewards")
    assert unscored["rewards"] == [1.0, None, 1.0, 0.0, 1.0, 0.25, 1.0, 0.0]
    assert unscored["group_sizes"] == [3, 4]
    assert unscored["trl_loss"] == pytest.approx(unscored["reference_loss"], abs=1e-6)
    assert_gradients_match(unscored)


def test_a_short_run_raises_the_probability_of_what_its_reward_pays_for(checks) -> None:
    """16 steps rewarded for answers that begin with an odd digit raise the probability of such an
    answer, read exactly from the model, by more than 0.1, whichever warm model this machine built
    (`make warm-model-variants` checks it against six; their gains are in docs/results.md)."""
    train = checks["train"]
    assert len(train["reward"]) == 16 and checks["finite"]
    assert train["odd_first_digit_after"] > train["odd_first_digit_before"] + 0.1, train


@pytest.mark.parametrize(
    "case, setting",
    [("kl", "beta=0.04"), ("num_iterations", "num_iterations=2"), ("steps_per_generation", "steps_per_generation=4"),
     ("estimator", "pacs_estimator='mean'"),
     ("token_level_sampler_correction", "vllm_importance_sampling_mode='token_truncate'"),
     ("one_generation_in_eval", "num_generations_eval=1")],
)  # fmt: skip
def test_settings_it_cannot_compute_exactly_are_refused_by_name(checks, case, setting) -> None:
    message = check_result(checks, "refusals")[case]
    assert message is not None and setting in message


# --- pacs's 2025 baselines against TRL's own loss code (tests/helpers/baselines_trl_checks.py) ------------


@pytest.mark.parametrize("method", ["dr_grpo", "dapo", "gspo", "cispo"])
def test_pacs_baselines_loss_and_gradient_equal_trls(checks, method) -> None:
    compared = check_result(checks, "baselines")[method]
    assert compared["max_abs_grad"] > 1e-3 and compared["clip_fraction"] > 0
    assert compared["max_abs_grad_diff"] <= 1e-6
    assert compared["pacs_loss"] == pytest.approx(compared["loss"], abs=1e-6)


def test_the_grpo_scores_coefficients_at_zero_proxy_are_rloos_rescaled_as_in_pacs_trainer(monkeypatch) -> None:
    """`pacs_coefficients` (c = ∂L/∂r at r = 0, every update of TRL) floors the grpo score's spread
    at pacs_beta: c_grpo = (n − 1)/(n β) · c_rloo, not (n − 1)/n / 1e-6 times it. It uses no TRL
    object, so TRL is stubbed here (float64)."""
    import importlib
    import types

    import torch

    stub = types.ModuleType("trl")
    stub.GRPOConfig, stub.GRPOTrainer = type("GRPOConfig", (), {}), type("GRPOTrainer", (), {})
    monkeypatch.setitem(sys.modules, "trl", stub)
    monkeypatch.delitem(sys.modules, "pacs.integrations.trl_trainer", raising=False)
    package = importlib.import_module("pacs.integrations")
    monkeypatch.setattr(package, "trl_trainer", None, raising=False)  # restored (or removed) after the test
    trl_trainer = importlib.import_module("pacs.integrations.trl_trainer")
    monkeypatch.setitem(sys.modules, "pacs.integrations.trl_trainer", trl_trainer)  # removed after the test
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    scored = torch.ones(8, dtype=torch.bool)
    beta = 2.0
    _, grpo = trl_trainer.pacs_coefficients(rewards, scored, 4, estimator="grpo", weighting="question", beta=beta)
    _, rloo = trl_trainer.pacs_coefficients(rewards, scored, 4, estimator="rloo", weighting="question", beta=beta)
    torch.testing.assert_close(grpo, 3 / (4 * beta) * rloo, atol=1e-15, rtol=1e-12)
    assert grpo.abs().max() > 0


@pytest.mark.parametrize("model", ["builtin:smollm2-135m-instruct", "/models/smollm2.gguf"], ids=["built-in", "gguf"])
def test_trl_model_turns_a_pacs_model_path_into_the_folder_pacs_makes_of_it(model, monkeypatch) -> None:
    """What pacs alone can load (a built-in model, a GGUF file) reaches TRL as the folder that
    `resolve_model_path` builds or converts (tested in tests/models/test_models_gguf.py)."""
    import pacs.models.loading
    from pacs.integrations.trl import trl_model

    monkeypatch.setattr(pacs.models.loading, "resolve_model_path", lambda path: f"/cache/{path}")
    assert trl_model(model) == f"/cache/{model}"


@pytest.mark.parametrize("model", ["Qwen/Qwen2.5-0.5B", "/models/mine", object()], ids=["hub id", "folder", "model object"])
def test_trl_model_passes_on_what_trl_loads_itself(model) -> None:
    from pacs.integrations.trl import trl_model

    assert trl_model(model) is model
