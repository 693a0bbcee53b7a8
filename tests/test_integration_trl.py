"""Specification of `pacs.integrations.trl` (PACS for TRL users), checked against TRL itself.

TRL is not a dependency of pacs: the checks run in one subprocess in the TRL venv `.peer-venvs/trl`
(made by benchmarks/peer_venvs.py on first use, minutes; reused afterwards), which writes a JSON of
results (tests/integration_trl_checks.py) that the tests below read. No network on first use fails
these tests, saying so.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from peer_checks import run_in_peer_venv


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


def test_one_step_gradient_equals_pacs_algos_on_the_whole_batch_though_trl_splits_its_groups(checks) -> None:
    exact = checks["exact"]
    assert exact["groups_split"] >= 1, f"no group was split across micro-batches: {exact['micro_batch_rows']}"
    assert len(exact["micro_batch_rows"]) == 2 and 0 < sum(exact["rewards"]) < len(exact["rewards"])
    assert exact["gradient_names"] and exact["max_abs_grad"] > 1e-4
    assert exact["max_abs_grad_diff"] <= 1e-6 * max(1.0, exact["max_abs_grad"])


def test_the_loss_trl_logs_is_the_pacs_loss(checks) -> None:
    assert checks["exact"]["trl_loss"] == pytest.approx(checks["exact"]["reference_loss"], abs=1e-6)


def test_the_optimizer_step_moves_the_parameters(checks) -> None:
    assert checks["exact"]["parameters_moved"]


def test_a_short_run_raises_the_probability_of_what_its_reward_pays_for(checks) -> None:
    """16 steps rewarded for answers that begin with an odd digit raise the probability of such an
    answer, read exactly from the model, by more than 0.1: measured +0.21 to +0.35 (from 0.42-0.50)
    on the six warm models `make warm-model-variants` builds (1 and 2 threads, seeds 0-2)."""
    train = checks["train"]
    assert len(train["reward"]) == 16 and checks["finite"]
    assert train["odd_first_digit_after"] > train["odd_first_digit_before"] + 0.1, train


@pytest.mark.parametrize(
    "case, setting",
    [("kl", "beta=0.04"), ("num_iterations", "num_iterations=2"), ("steps_per_generation", "steps_per_generation=4"),
     ("estimator", "pacs_estimator='mean'")],
)  # fmt: skip
def test_settings_it_cannot_compute_exactly_are_refused_by_name(checks, case, setting) -> None:
    message = checks["refusals"][case]
    assert message is not None and setting in message


# --- pacs's 2025 baselines against TRL's own loss code (tests/baselines_trl_checks.py) ------------


@pytest.mark.parametrize("method", ["dr_grpo", "dapo", "gspo", "cispo"])
def test_pacs_baselines_loss_and_gradient_equal_trls(checks, method) -> None:
    compared = checks["baselines"][method]
    assert compared["max_abs_grad"] > 1e-3 and compared["clip_fraction"] > 0
    assert compared["max_abs_grad_diff"] <= 1e-6
    assert compared["pacs_loss"] == pytest.approx(compared["loss"], abs=1e-6)
