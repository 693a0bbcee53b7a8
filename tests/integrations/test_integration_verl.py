"""Specification of `pacs.integrations.verl` (PACS in verl's registries), checked against verl itself.

verl is not a dependency of pacs: the checks run in one subprocess in the verl venv `.peer-venvs/verl`
(made by benchmarks/peer_venvs.py on first use, minutes; reused afterwards: verl 0.9.1 installed with
--no-deps beside what its algorithms, actor config, losses, micro-batching and rollout-correction
modules import, see benchmarks/requirements-verl.txt), which writes a JSON of results
(tests/helpers/integration_verl_checks.py: verl's balancing, rollout correction, registered estimator,
mini-batch iterator, `prepare_micro_batches` and `ppo_loss`, in the order a step of its trainer
runs them) that the tests below read. No network on first use fails these tests, saying so.
"""

from __future__ import annotations

import importlib.util

import pytest
from peer_checks import check_result, run_in_peer_venv


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


@pytest.mark.parametrize("case", ["defaults", "sampler_correction", "one_rank_grpo_beta2"])
def test_verls_own_step_gives_the_gradient_of_pacs_loss_though_it_scatters_every_group(checks, case) -> None:
    """Balanced across 2 ranks (1 for the last case), shuffled, packed by token count: no micro-batch
    holds a whole group, yet the summed gradient is pacs_loss's on the batch, each response's part
    times its rollout-correction weight."""
    exact = check_result(checks, case)
    assert exact["groups_whole_in_a_micro_batch"] == 0 and exact["micro_batches"] > 2
    assert exact["max_abs_grad"] > 1e-3
    assert exact["max_abs_grad_diff"] <= 1e-6 * max(1.0, exact["max_abs_grad"])


def test_balancing_puts_responses_of_one_prompt_on_both_ranks(checks) -> None:
    assert check_result(checks, "defaults")["prompts_split_across_ranks"] >= 1


def test_sequence_level_correction_weights_truncate_and_reject_whole_responses(checks) -> None:
    weights = check_result(checks, "sampler_correction")["weights"]
    assert 0.0 in weights and 2.0 in weights and any(0 < weight < 1 for weight in weights), weights


def test_each_mini_batch_carries_its_share_of_the_batch_gradient_at_its_own_scale(checks) -> None:
    """Two mini-batches at θ = θ_old: their gradients sum to twice pacs_loss's on the whole batch
    (each normalised by its own size, as verl's losses are)."""
    two = check_result(checks, "two_mini_batches")
    assert two["mini_batches"] == 2
    assert two["max_abs_grad_diff"] <= 1e-6 * max(1.0, two["max_abs_grad"])


@pytest.mark.parametrize(
    "case, named",
    [
        ("rewards_outside_0_1", "use_kl_in_reward"),
        ("no_prompt_ids", "uid"),
        ("token_level_is", "rollout_is='token'"),
        ("token_level_rejection", "rollout_rs=token_k1"),
        ("bypass_mode", "bypass_mode=True"),
        ("token_level_weights", "rollout_is='sequence'"),
        ("per_token_advantages", "adv_estimator=pacs"),
        ("one_response_per_prompt", "rollout.n=1"),
    ],
)
def test_settings_it_cannot_compute_exactly_are_refused_by_name(checks, case, named) -> None:
    message = check_result(checks, "refusals")[case]
    assert message is not None and named in message


def test_a_failed_registration_is_logged_as_an_error_and_raised(checks) -> None:
    """verl's plugin loader logs a plugin's exception at DEBUG level only; pacs logs it at ERROR."""
    failed = check_result(checks, "failed_registration")
    assert failed["raised"] is not None and "already been registered" in failed["raised"]
    assert [level for level, _ in failed["logged"]] == ["ERROR"]
    assert "Unsupported loss mode: pacs" in failed["logged"][0][1]


# --- pacs's 2025 baselines against verl's own code (tests/helpers/baselines_verl_checks.py) ---------------


@pytest.mark.parametrize("method", ["dr_grpo", "dapo", "gspo", "cispo"])
def test_pacs_baselines_loss_and_gradient_equal_verls(checks, method) -> None:
    compared = check_result(checks, "baselines")[method]
    assert compared["max_abs_grad"] > 1e-3 and compared["clip_fraction"] > 0
    assert compared["max_abs_advantage_diff"] <= 1e-6
    assert compared["max_abs_grad_diff"] <= 1e-6
    assert compared["pacs_loss"] == pytest.approx(compared["loss"], abs=1e-6)


@pytest.mark.parametrize("beta", [0.5, 2.0])
def test_the_grpo_scores_advantages_at_zero_proxy_are_rloos_rescaled_as_in_pacs_trainer(beta) -> None:
    """verl evaluates PACS's advantages at r = 0 on every update: with the spread floor β the grpo
    score's are the rloo score's times (n − 1)/(n β), not times (n − 1)/n / 1e-6 (float64, no verl)."""
    import torch

    from pacs.integrations.verl import pacs_advantage_estimator

    generator = torch.Generator().manual_seed(0)
    rewards = torch.randint(2, (12,), generator=generator).double()
    rewards[:4] = torch.tensor([1.0, 0.0, 0.0, 0.0])
    mask = torch.ones(12, 3, dtype=torch.float64)
    token_rewards = torch.zeros(12, 3, dtype=torch.float64)
    token_rewards[:, -1] = rewards
    index = [f"prompt-{row // 4}" for row in range(12)]
    grpo, _ = pacs_advantage_estimator(estimator="grpo", beta=beta)(token_rewards, mask, index=index)
    rloo, _ = pacs_advantage_estimator(estimator="rloo", beta=beta)(token_rewards, mask, index=index)
    torch.testing.assert_close(grpo, 3 / (4 * beta) * rloo, atol=1e-15, rtol=1e-12)
    assert 0 < grpo.abs().max() <= rloo.abs().max() / beta
