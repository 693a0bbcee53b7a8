"""Specification of `pacs.integrations.verl` (PACS in verl's registries), checked against verl itself.

verl is not a dependency of pacs: the checks run in one subprocess in the verl venv `.peer-venvs/verl`
(made by benchmarks/peer_venvs.py on first use, minutes; reused afterwards: verl 0.9.1 installed with
--no-deps beside what `verl.trainer.ppo.core_algos` and the actor's config import, see
benchmarks/requirements-verl.txt), which writes a JSON of results (tests/integration_verl_checks.py)
that the tests below read. No network on first use fails these tests, saying so.
"""

from __future__ import annotations

import importlib.util

import pytest

from peer_checks import run_in_peer_venv


@pytest.fixture(scope="module")
def checks(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("verl-checks") / "checks.json"
    return run_in_peer_venv("verl", "integration_verl_checks.py", [], out)


def test_importing_the_module_needs_no_verl_and_registering_names_the_extra() -> None:
    import pacs.integrations.verl as integration

    if importlib.util.find_spec("verl") is not None:
        pytest.skip("verl is installed in this venv")
    with pytest.raises(ImportError, match=r"pacs\[verl\]"):
        integration.register()


def test_importing_verl_registers_pacs_through_its_plugin_entry_point(checks) -> None:
    assert checks["registered_on_import"] == {"policy_loss": True, "adv_estimator": True}


@pytest.mark.parametrize("case", ["defaults", "two_ranks", "grpo_beta2"])
def test_the_registered_functions_called_as_verls_actor_calls_them_give_pacs_loss_and_gradient(checks, case) -> None:
    exact = checks["exact"][case]
    assert exact["max_abs_grad"] > 1e-3
    assert exact["max_abs_grad_diff"] <= 1e-6
    assert exact["loss"] == pytest.approx(exact["reference_loss"], abs=1e-6)


@pytest.mark.parametrize(
    "case, named",
    [
        ("micro_batch_splits_a_group", "ppo_micro_batch_size_per_gpu=6"),
        ("dynamic_bsz", "use_dynamic_bsz=True"),
        ("shuffle", "shuffle=True"),
        ("rollout_correction", "rollout_correction"),
        ("grpo_advantages", "adv_estimator=pacs"),
        ("groups_not_consecutive", "balance_batch=False"),
        ("rewards_outside_0_1", "use_kl_in_reward"),
    ],
)
def test_settings_it_cannot_compute_exactly_are_refused_by_name(checks, case, named) -> None:
    message = checks["refusals"][case]
    assert message is not None and named in message


# --- pacs's 2025 baselines against verl's own code (tests/baselines_verl_checks.py) ---------------


@pytest.mark.parametrize("method", ["dr_grpo", "dapo", "gspo", "cispo"])
def test_pacs_baselines_loss_and_gradient_equal_verls(checks, method) -> None:
    compared = checks["baselines"][method]
    assert compared["max_abs_grad"] > 1e-3 and compared["clip_fraction"] > 0
    assert compared["max_abs_advantage_diff"] <= 1e-6
    assert compared["max_abs_grad_diff"] <= 1e-6
    assert compared["pacs_loss"] == pytest.approx(compared["loss"], abs=1e-6)
