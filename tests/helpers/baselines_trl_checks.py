"""pacs's Dr. GRPO, DAPO, GSPO and CISPO against TRL's own loss code, in the TRL venv: imported by
tests/helpers/integration_trl_checks.py (one subprocess for every TRL check), whose JSON holds `results()`
under "baselines"; tests/integrations/test_integration_trl.py asserts on it.

TRL computes every GRPO-family loss in `GRPOTrainer._compute_loss(model, inputs)`, by `loss_type`
(and `importance_sampling_level="sequence"` for GSPO). Each case calls that method itself on one
batch of 3 prompts x 4 responses (float64, ragged lengths) standing for one optimizer step (no
gradient accumulation, one process), on a stand-in for the trainer that holds the attributes the
method reads and returns the case's log-probs from the model call
(`_get_per_token_logps_and_entropies`); the advantages are pacs's (TRL's own adds 1e-4 to the std
where GRPO, verl and pacs add 1e-6). pacs's plug-in runs on the same rows. TRL's CISPO has no lower
bound and caps the weight at `epsilon_high` itself (pacs: 1 + clip_high, clip_low = 1).
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import torch
from baseline_peer_data import GROUPS, HORIZON, SHIFTS, N, T, pacs_plugin_loss, rollout
from trl import GRPOTrainer

from pacs.algos import CISPO, DAPO, GSPO, DrGRPO

CASES = {
    "dr_grpo": dict(pacs=DrGRPO, trl=dict(loss_type="dr_grpo", epsilon_low=0.2, epsilon_high=0.2)),
    "dapo": dict(pacs=DAPO, trl=dict(loss_type="dapo", epsilon_low=0.2, epsilon_high=0.28)),
    "gspo": dict(pacs=GSPO, trl=dict(loss_type="grpo", importance_sampling_level="sequence", epsilon_low=3e-4, epsilon_high=4e-4)),
    "cispo": dict(pacs=CISPO, trl=dict(loss_type="cispo", epsilon_low=0.2, epsilon_high=5.0)),
}  # fmt: skip
"""Each method's pacs class at its defaults and TRL's settings of the same method."""


def trainer_stand_in(settings: dict, logprobs: torch.Tensor) -> SimpleNamespace:
    """What `GRPOTrainer._compute_loss` reads of its trainer, for one process, one optimizer step per
    batch and no KL, entropy bonus, vLLM or Liger; the model call returns `logprobs`."""
    accelerator = SimpleNamespace(
        num_processes=1, sync_gradients=True, gather=lambda x: x, gather_for_metrics=lambda x: x,
        reduce=lambda x, reduction="sum": x,
    )  # fmt: skip
    settings = {"importance_sampling_level": "token", **settings}
    return SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (logprobs, torch.zeros_like(logprobs), None),
        aux_loss_enabled=False, top_entropy_quantile=1.0, off_policy_mask_threshold=None, beta=0.0, args=SimpleNamespace(delta=None, steps_per_generation=1, use_bias_correction_kl=False),
        use_vllm=False, vllm_importance_sampling_correction=False, model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1, max_completion_length=HORIZON, accelerator=accelerator,
        _entropy_bonus_enabled=False, _metrics=defaultdict(lambda: defaultdict(list)), **settings,
    )  # fmt: skip


def trl_loss(case: dict, batch: dict, advantages: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    rows = GROUPS * N
    inputs = {
        "prompt_ids": torch.zeros(rows, 1, dtype=torch.long), "prompt_mask": torch.ones(rows, 1, dtype=torch.long),
        "completion_ids": torch.zeros(rows, T, dtype=torch.long), "completion_mask": batch["mask"].long(),
        "advantages": advantages, "old_per_token_logps": batch["old"], "num_items_in_batch": batch["mask"].sum(),
    }  # fmt: skip
    return GRPOTrainer._compute_loss(trainer_stand_in(case["trl"], logprobs), None, inputs)


def compare(name: str, case: dict) -> dict:
    batch = rollout(SHIFTS[name])
    logprobs = batch["current"].clone().requires_grad_(True)
    advantages, pacs_value, metrics = pacs_plugin_loss(case["pacs"](N, max_response_length=HORIZON), batch, logprobs)
    (pacs_grad,) = torch.autograd.grad(pacs_value, logprobs)
    trl_logprobs = batch["current"].clone().requires_grad_(True)
    trl_value = trl_loss(case, batch, advantages.detach(), trl_logprobs)
    (trl_grad,) = torch.autograd.grad(trl_value, trl_logprobs)
    return {
        "loss": trl_value.item(),
        "pacs_loss": pacs_value.item(),
        "max_abs_grad_diff": (trl_grad - pacs_grad).abs().max().item(),
        "max_abs_grad": pacs_grad.abs().max().item(),
        "clip_fraction": metrics["actor/clip_fraction"],
    }


def results() -> dict:
    return {name: compare(name, case) for name, case in CASES.items()}
