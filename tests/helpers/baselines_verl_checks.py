"""pacs's Dr. GRPO, DAPO, GSPO and CISPO against verl's own code, in the verl venv: imported by
tests/helpers/integration_verl_checks.py (one subprocess for every verl check), whose JSON holds
`results()` under "baselines"; tests/integrations/test_integration_verl.py asserts on it.

Each case computes, on the same float64 rollouts (3 prompts x 4 responses, ragged lengths), verl's
advantages (`get_adv_estimator_fn("grpo")`, with `norm_adv_by_std_in_grpo` as the method needs)
and verl's policy loss as its actor calls it, one micro-batch per prompt with the global batch's
counts in `config.global_batch_info`, summed; and pacs's plug-in (`prepare_step`, `prepare_update`,
`micro_batch_loss`) on the same rows. verl's dual clip (`clip_ratio_c`, on in its vanilla loss)
is set out of reach (1e6) for Dr. GRPO and DAPO, whose papers have none (pacs: `dual_clip=None`).
"""

from __future__ import annotations

import torch
from baseline_peer_data import GROUPS, HORIZON, SHIFTS, N, pacs_plugin_loss, rollout
from verl.trainer.ppo import core_algos
from verl.workers.config import FSDPActorConfig, PolicyLossConfig

from pacs.algos import CISPO, DAPO, GSPO, DrGRPO

NO_DUAL_CLIP = 1e6

CASES = {
    "dr_grpo": dict(
        pacs=DrGRPO, norm_by_std=False, loss_mode="vanilla",
        actor=dict(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=NO_DUAL_CLIP, loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=HORIZON),
    ),
    "dapo": dict(
        pacs=DAPO, norm_by_std=True, loss_mode="vanilla",
        actor=dict(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=NO_DUAL_CLIP, loss_agg_mode="token-mean"),
    ),
    "gspo": dict(
        pacs=GSPO, norm_by_std=True, loss_mode="gspo",
        actor=dict(clip_ratio_low=3e-4, clip_ratio_high=4e-4, loss_agg_mode="seq-mean-token-mean"),
    ),
    "cispo": dict(
        pacs=CISPO, norm_by_std=True, loss_mode="cispo",
        actor=dict(clip_ratio_low=1.0, clip_ratio_high=4.0, loss_agg_mode="token-mean"),
    ),
}  # fmt: skip
"""Each method's pacs class at its defaults and the verl settings of the same method."""


def verl_loss(case: dict, batch: dict, log_prob: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's advantages (B,) and its loss summed over one micro-batch per prompt."""
    token_advantages, _ = core_algos.get_adv_estimator_fn("grpo")(
        token_level_rewards=batch["token_rewards"], response_mask=batch["mask"], index=batch["uid"],
        norm_adv_by_std_in_grpo=case["norm_by_std"],
    )  # fmt: skip
    config = FSDPActorConfig(
        strategy="fsdp", rollout_n=N, ppo_mini_batch_size=GROUPS, ppo_micro_batch_size_per_gpu=N,
        policy_loss=PolicyLossConfig(loss_mode=case["loss_mode"]), **case["actor"],
    )  # fmt: skip
    config.global_batch_info.update(
        dp_size=1, batch_num_tokens=int(batch["mask"].sum()), global_batch_size=GROUPS * N,
        loss_scale_factor=config.loss_scale_factor,
    )  # fmt: skip
    policy_loss = core_algos.get_policy_loss_fn(case["loss_mode"])
    total = 0
    for start in range(0, GROUPS * N, N):
        rows = slice(start, start + N)
        loss, _ = policy_loss(
            old_log_prob=batch["old"][rows], log_prob=log_prob[rows], advantages=token_advantages[rows],
            response_mask=batch["mask"][rows].bool(), loss_agg_mode=config.loss_agg_mode, config=config,
        )  # fmt: skip
        total = total + loss
    last_tokens = batch["mask"].sum(-1).long() - 1
    return token_advantages[torch.arange(GROUPS * N), last_tokens], total


def pacs_loss(case: dict, batch: dict, logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """pacs's advantages (B,) and its plug-in's loss on the whole batch; the fraction of tokens
    (GSPO: responses) clipped in `case["clip_fraction"]`."""
    advantages, loss, metrics = pacs_plugin_loss(case["pacs"](N, max_response_length=HORIZON), batch, logprobs)
    case["clip_fraction"] = metrics["actor/clip_fraction"]
    return advantages, loss


def compare(name: str, case: dict) -> dict:
    batch = rollout(SHIFTS[name])
    results = {}
    for side, compute in (("verl", verl_loss), ("pacs", pacs_loss)):
        logprobs = batch["current"].clone().requires_grad_(True)
        advantages, loss = compute(case, batch, logprobs)
        (grad,) = torch.autograd.grad(loss, logprobs)
        results[side] = (advantages.detach(), loss.detach(), grad)
    (verl_adv, verl_value, verl_grad), (pacs_adv, pacs_value, pacs_grad) = results["verl"], results["pacs"]
    return {
        "loss": verl_value.item(),
        "pacs_loss": pacs_value.item(),
        "max_abs_advantage_diff": (verl_adv - pacs_adv).abs().max().item(),
        "max_abs_grad_diff": (verl_grad - pacs_grad).abs().max().item(),
        "max_abs_grad": pacs_grad.abs().max().item(),
        "clip_fraction": case["clip_fraction"],
    }


def results() -> dict:
    return {name: compare(name, dict(case)) for name, case in CASES.items()}
