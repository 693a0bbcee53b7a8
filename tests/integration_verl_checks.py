"""The verl integration's checks, run in the verl venv (.peer-venvs/verl) by
tests/test_integration_verl.py, which asserts on the JSON this writes:
`python integration_verl_checks.py OUT_JSON`.

verl's actor calls the policy loss once per micro-batch as `verl.workers.utils.losses.ppo_loss`
does: `config.global_batch_info` set (dp_size, batch_num_tokens, global_batch_size,
loss_scale_factor), then `get_policy_loss_fn(config.policy_loss.loss_mode)(old_log_prob=...,
log_prob=..., advantages=..., response_mask=..., loss_agg_mode=..., config=..., rollout_is_weights=...)`,
and sums the micro-batches' gradients (averaged over data-parallel ranks); the advantages come from
`get_adv_estimator_fn(algorithm.adv_estimator)(token_level_rewards=..., response_mask=...,
config=..., index=uid)` as `ray_trainer.compute_advantage` calls it. The checks call them so, on
float64 tensors, against `pacs.algos.pacs_loss` on the whole batch. Under "baselines", pacs's
Dr. GRPO, DAPO, GSPO and CISPO against verl's own (tests/baselines_verl_checks.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import verl  # noqa: F401  (loads the "verl.plugins" entry points: pacs registers itself here)
from verl.trainer.ppo import core_algos

REGISTERED_ON_IMPORT = {
    "policy_loss": "pacs" in core_algos.POLICY_LOSS_REGISTRY,
    "adv_estimator": "pacs" in core_algos.ADV_ESTIMATOR_REGISTRY,
}

import numpy as np  # noqa: E402
import torch  # noqa: E402
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.workers.config import FSDPActorConfig, PolicyLossConfig  # noqa: E402

import baselines_verl_checks  # noqa: E402
from pacs.algos import pacs_loss  # noqa: E402
from pacs.integrations.verl import register  # noqa: E402

N, T = 4, 6
REWARDS = [1, 0, 0, 1, 1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 1, 0]


def rollout(groups: int, seed: int = 0) -> dict:
    """`groups` prompts x N responses: log-probs, masks, rewards at each response's last token, uids."""
    generator = torch.Generator().manual_seed(seed)
    rows = groups * N
    lengths = torch.randint(1, T + 1, (rows,), generator=generator)
    mask = (torch.arange(T) < lengths.unsqueeze(1)).to(torch.int64)
    old = -torch.rand(rows, T, generator=generator, dtype=torch.float64) * mask
    current = (old + 0.1 * torch.randn(rows, T, generator=generator, dtype=torch.float64)) * mask
    token_rewards = torch.zeros(rows, T, dtype=torch.float32)
    token_rewards[torch.arange(rows), lengths - 1] = torch.tensor(REWARDS[:rows], dtype=torch.float32)
    uid = np.array([f"prompt-{row // N}" for row in range(rows)], dtype=object)
    return {"old": old, "current": current, "mask": mask, "token_rewards": token_rewards, "uid": uid}


def advantages(batch: dict, estimator: str = "pacs", index=None) -> torch.Tensor:
    adv_fn = core_algos.get_adv_estimator_fn(estimator)
    result, _ = adv_fn(
        token_level_rewards=batch["token_rewards"], response_mask=batch["mask"],
        config=AlgoConfig(adv_estimator=estimator), index=batch["uid"] if index is None else index,
    )  # fmt: skip
    return result


def actor_config(loss_mode: str = "pacs", micro: int | None = N, **settings) -> FSDPActorConfig:
    return FSDPActorConfig(
        strategy="fsdp", rollout_n=N, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=micro,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode), **settings,
    )  # fmt: skip


def micro_batch_loss(config, batch, adv, log_prob, rows: slice, dp_size: int, global_rows: int, weights=None):
    """One micro-batch's loss, computed as verl's ppo_loss computes it."""
    mask = batch["mask"][rows]
    config.global_batch_info["dp_size"] = dp_size
    config.global_batch_info["batch_num_tokens"] = int(batch["mask"].sum())
    config.global_batch_info["global_batch_size"] = global_rows
    config.global_batch_info["loss_scale_factor"] = config.loss_scale_factor
    policy_loss_fn = core_algos.get_policy_loss_fn(config.policy_loss.get("loss_mode", "vanilla"))
    loss, metrics = policy_loss_fn(
        old_log_prob=batch["old"][rows], log_prob=log_prob[rows], advantages=adv[rows].to(torch.float64),
        response_mask=mask.to(bool), loss_agg_mode=config.loss_agg_mode, config=config, rollout_is_weights=weights,
    )  # fmt: skip
    return loss


def exact(loss_mode: str, settings: dict, groups: int, dp_size: int) -> dict:
    """Σ over ranks and micro-batches (one group each) of verl's calls vs pacs_loss on the whole batch."""
    batch = rollout(groups)
    adv = advantages(batch)
    config = actor_config(loss_mode)
    log_prob = batch["current"].clone().requires_grad_(True)
    rows_per_rank = groups * N // dp_size
    total = 0
    for start in range(0, groups * N, N):
        total = total + micro_batch_loss(config, batch, adv, log_prob, slice(start, start + N), dp_size, groups * N)
    total = total / dp_size  # DDP / FSDP average the ranks' gradients
    (verl_grad,) = torch.autograd.grad(total, log_prob)
    reference_log_prob = batch["current"].clone().requires_grad_(True)
    rewards = batch["token_rewards"].sum(dim=-1)
    reference = pacs_loss(reference_log_prob, batch["old"], batch["mask"], rewards, N, **settings)
    (reference_grad,) = torch.autograd.grad(reference, reference_log_prob)
    return {
        "rows_per_rank": rows_per_rank,
        "loss": total.item(),
        "reference_loss": reference.item(),
        "max_abs_grad_diff": (verl_grad - reference_grad).abs().max().item(),
        "max_abs_grad": reference_grad.abs().max().item(),
    }


def refusal(call) -> str | None:
    try:
        call()
    except ValueError as error:
        return str(error)
    return None


def refusals() -> dict:
    batch = rollout(3)
    adv = advantages(batch)
    log_prob = batch["current"]

    def loss(config, rows=slice(0, N), weights=None):
        return lambda: micro_batch_loss(config, batch, adv, log_prob, rows, 1, 3 * N, weights)

    grpo_adv = advantages(batch, "grpo_vectorized")
    interleaved = np.array([f"prompt-{row % 3}" for row in range(3 * N)], dtype=object)
    over_one = dict(batch, token_rewards=batch["token_rewards"] * 2)
    return {
        "micro_batch_splits_a_group": refusal(loss(actor_config(micro=6), slice(0, 6))),
        "dynamic_bsz": refusal(loss(actor_config(micro=None, use_dynamic_bsz=True))),
        "shuffle": refusal(loss(actor_config(shuffle=True))),
        "rollout_correction": refusal(loss(actor_config(), weights=torch.ones(N, T, dtype=torch.float64))),
        "grpo_advantages": refusal(
            lambda: core_algos.get_policy_loss_fn("pacs")(
                old_log_prob=batch["old"][:N], log_prob=log_prob[:N], advantages=grpo_adv[:N].double(),
                response_mask=batch["mask"][:N].to(bool), config=actor_config(),
            )  # fmt: skip
        ),
        "groups_not_consecutive": refusal(lambda: advantages(batch, index=interleaved)),
        "rewards_outside_0_1": refusal(lambda: advantages(over_one)),
    }


def main() -> None:
    out_path = Path(sys.argv[1])
    torch.set_num_threads(1)
    register("pacs_grpo_beta2", beta=2.0, estimator="grpo", weighting="none")
    results = {
        "registered_on_import": REGISTERED_ON_IMPORT,
        "exact": {
            "defaults": exact("pacs", {}, groups=3, dp_size=1),
            "two_ranks": exact("pacs", {}, groups=4, dp_size=2),
            "grpo_beta2": exact("pacs_grpo_beta2", {"beta": 2.0, "estimator": "grpo", "weighting": "none"}, 3, 1),
        },
        "refusals": refusals(),
        "baselines": baselines_verl_checks.results(),
    }
    out_path.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
