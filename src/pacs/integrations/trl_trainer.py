"""`PACSConfig` and `PACSTrainer`, TRL's `GRPOConfig` and `GRPOTrainer` with PACS's loss (the user's
guide is `pacs.integrations.trl`, which loads this module on first use). This module imports TRL:
its classes are defined at module level, so that checkpoints (which pickle the config) and
`resume_from_checkpoint` find them by name.

Per generation batch (B completions over every process, rows [g*n, (g+1)*n) prompt g's):

    R_i    = Σ_f reward_weight_f · reward_f(o_i), a None counted as 0 (TRL's nansum); a completion
             no function scored is left out of its group (TRL's "unscorable")
    c_i    = ∂L/∂r_i at θ = θ_old (r = 0),  L = S / B_scored  (`pacs.algos.pacs_advantages`; the grpo
             score's denominator floored at pacs_beta · GRPO_SPREAD_FLOOR, as in pacs's trainer)
    c'_i   = ρ_i · c_i  with vLLM's sequence-level importance ratio ρ (TRL's
             vllm_importance_sampling_correction) times TRL's off-policy mask
             (`pacs.algos.sampler_corrected_coefficients`), else c' = c
    loss   = Σ_{i ∈ micro} c'_i · r_i(θ), r_i = β Σ_t m_it (log π_θ − log π_old)   per micro-batch
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import trl

from pacs.algos import ESTIMATORS, WEIGHTINGS, pacs_advantages, reward_proxy, sampler_corrected_coefficients
from pacs.algos.pacs import GRPO_SPREAD_FLOOR
from pacs.integrations.trl import trl_model

SEQUENCE_LEVEL_MODES = ("sequence_mask", "sequence_truncate")
"""TRL's vllm_importance_sampling_mode values whose ratio is one per completion, as PACS needs."""
MULTIMODAL_INPUTS = (
    "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
    "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids",
)  # fmt: skip
"""Inputs TRL passes to its model forward for vision-language models; passed on unchanged."""


def unsupported_settings(args: Any) -> list[str]:
    """The settings of a `PACSConfig` that this trainer cannot compute exactly, each with what to set."""
    found = []
    if args.num_iterations != 1:
        found.append(f"num_iterations={args.num_iterations}: set 1 (the constants c_i hold at θ_old only)")
    if args.steps_per_generation != args.gradient_accumulation_steps:
        found.append(
            f"steps_per_generation={args.steps_per_generation} with gradient_accumulation_steps="
            f"{args.gradient_accumulation_steps}: set them equal (one optimizer step per generation batch)"
        )
    if args.beta != 0.0:
        found.append(f"beta={args.beta} (TRL's KL coefficient): set 0.0; PACS's β is pacs_beta")
    if args.entropy_coef != 0.0 or getattr(args, "use_adaptive_entropy", False):
        found.append(f"entropy_coef={args.entropy_coef}, use_adaptive_entropy: set 0.0 and False")
    if args.top_entropy_quantile != 1.0:
        found.append(f"top_entropy_quantile={args.top_entropy_quantile}: set 1.0")
    if args.multi_objective_aggregation != "sum_then_normalize":
        found.append(f"multi_objective_aggregation={args.multi_objective_aggregation!r}: set 'sum_then_normalize'")
    if args.use_liger_kernel:
        found.append("use_liger_kernel=True: set False")
    correction = args.use_vllm and args.vllm_importance_sampling_correction
    if correction and args.vllm_importance_sampling_mode not in SEQUENCE_LEVEL_MODES:
        found.append(
            f"vllm_importance_sampling_mode={args.vllm_importance_sampling_mode!r}: set 'sequence_mask' (TRL's "
            "default) or 'sequence_truncate' (PACS weights a completion as a whole, not token by token)"
        )
    if not (isinstance(args.pacs_beta, (int, float)) and math.isfinite(args.pacs_beta)):
        found.append(f"pacs_beta={args.pacs_beta!r}: a finite number")
    if args.pacs_estimator not in ESTIMATORS:
        found.append(f"pacs_estimator={args.pacs_estimator!r}: one of {', '.join(ESTIMATORS)}")
    elif args.pacs_estimator != "naive" and args.num_generations_eval is not None and args.num_generations_eval < 2:
        found.append(
            f"num_generations_eval={args.num_generations_eval} with pacs_estimator={args.pacs_estimator!r}: set 2 "
            "or more (the score compares the completions of a prompt), or pacs_estimator='naive'"
        )
    if args.pacs_weighting not in WEIGHTINGS:
        found.append(f"pacs_weighting={args.pacs_weighting!r}: one of {', '.join(WEIGHTINGS)}")
    return found


def scored_rewards(rewards_per_func: torch.Tensor, reward_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The verifier reward R of each completion, as TRL sums its reward functions, and which were scored.

    Args:
        rewards_per_func: (B, F) each reward function's value, NaN where it returned None.
        reward_weights: (F,) TRL's ``reward_weights``.

    Returns:
        (B,) R_i = Σ_f weight_f · reward_f with NaN counted as 0 (TRL's nansum), and (B,) bool:
        scored by at least one function (TRL leaves the others out of their group's baseline).
    """
    weighted = rewards_per_func * reward_weights.to(rewards_per_func.device).unsqueeze(0)
    return weighted.nansum(dim=1), ~torch.isnan(rewards_per_func).all(dim=1)


def pacs_coefficients(
    rewards: torch.Tensor, scored: torch.Tensor, group_size: int, *, estimator: str, weighting: str, beta: float = 1.0
) -> tuple[float, torch.Tensor]:
    """PACS's loss L and c = ∂L/∂r at θ = θ_old (r = 0) for a whole generation batch.

    L = 1/B_s · Σ_i w_i · BCE(ψ_i, R_i) over the B_s scored completions, each prompt's group made of
    its scored completions (see `pacs.algos.pacs_advantages`).

    Args:
        rewards: (B,) R in [0, 1], rows [g*n, (g+1)*n) one prompt's.
        scored: (B,) bool, False for completions no reward function scored (c = 0 there).
        group_size: completions per prompt n.
        beta: PACS's β (``pacs_beta``): the grpo score's spread floor is β · GRPO_SPREAD_FLOOR.

    Returns:
        L, and (B,) c in float64 (they multiply r in the model's dtype).
    """
    rows = torch.arange(len(rewards), device=rewards.device)
    proxy_rewards = torch.zeros(int(scored.sum()), dtype=torch.float64, device=rewards.device)
    summed_loss, advantages = pacs_advantages(
        proxy_rewards, rewards[scored].double(), rows[scored] // group_size, estimator=estimator, weighting=weighting,
        spread_floor=beta * GRPO_SPREAD_FLOOR,
    )  # fmt: skip
    num_scored = max(int(scored.sum()), 1)
    proxy_grad = torch.zeros(len(rewards), dtype=torch.float64, device=rewards.device)
    proxy_grad[scored] = -advantages / num_scored
    return float(summed_loss) / num_scored, proxy_grad


@dataclasses.dataclass
class PACSConfig(trl.GRPOConfig):
    """TRL's GRPOConfig plus PACS's β (``pacs_beta``), score (``pacs_estimator``) and class
    weights (``pacs_weighting``); see `pacs.integrations.trl`."""

    pacs_beta: float = dataclasses.field(default=1.0, metadata={"help": "PACS's proxy scale β."})
    pacs_estimator: str = dataclasses.field(default="rloo", metadata={"help": "rloo, grpo or naive."})
    pacs_weighting: str = dataclasses.field(
        default="question", metadata={"help": "question, none, only_positive or only_negative."}
    )

    def __post_init__(self):
        super().__post_init__()
        unsupported = unsupported_settings(self)
        if unsupported:
            raise ValueError("PACSConfig: settings PACS cannot compute exactly:\n  " + "\n  ".join(unsupported))


class PACSTrainer(trl.GRPOTrainer):
    """TRL's GRPOTrainer with PACS's loss; `args` must be a `PACSConfig`."""

    def __init__(self, model, *args, **kwargs):
        super().__init__(trl_model(model), *args, **kwargs)
        if not isinstance(self.args, PACSConfig):
            raise TypeError(f"PACSTrainer's args must be a pacs.integrations.trl.PACSConfig, got {type(self.args).__name__}")
        if self.aux_loss_enabled:
            raise ValueError("PACSTrainer: the model's MoE router aux loss is not supported (output_router_logits)")
        self._rewards_per_func = None

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        self._rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        return self._rewards_per_func

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        rewards, scored = scored_rewards(self._rewards_per_func, self.reward_weights)  # every process's rows
        if not bool(((rewards[scored] >= 0) & (rewards[scored] <= 1)).all()):
            raise ValueError(
                "PACSTrainer: the weighted sum of the reward functions (reward_weights) must lie in [0, 1] for "
                f"every scored completion (PACS's BCE target); got min {rewards[scored].min().item()}, max "
                f"{rewards[scored].max().item()}"
            )
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        settings = {"estimator": self.args.pacs_estimator, "weighting": self.args.pacs_weighting, "beta": self.args.pacs_beta}
        loss, proxy_grad = pacs_coefficients(rewards, scored, group_size, **settings)
        local_rows = output["completion_ids"].shape[0]
        start = self.accelerator.process_index * local_rows
        proxy_grad = proxy_grad[start : start + local_rows]
        weights = self._response_weights(output, advantages=-proxy_grad)
        if weights is not None:
            proxy_grad = sampler_corrected_coefficients(proxy_grad, weights.double())
        output["pacs_proxy_grad"] = proxy_grad
        output["pacs_loss"] = torch.tensor(loss, device=proxy_grad.device)
        self._metrics[mode]["pacs/loss"].append(loss)
        return output

    def _response_weights(self, output: dict, advantages: torch.Tensor) -> torch.Tensor | None:
        """(B_local,) per-completion weights ρ: vLLM's sequence-level importance ratio (truncated or
        masked as TRL's vllm_importance_sampling_mode says) times TRL's off-policy sequence mask
        (off_policy_mask_threshold, DeepSeek-V3.2's; the advantage's sign is that of −c); None when
        neither applies."""
        weights = None
        if "importance_sampling_ratio" in output:
            weights = output["importance_sampling_ratio"].squeeze(-1)  # (B, 1) in the sequence modes
        if self.off_policy_mask_threshold is not None and "sampling_per_token_logps" in output:
            mask = output["completion_mask"]
            mask = mask if "tool_mask" not in output else mask * output["tool_mask"]
            keep = self.get_off_policy_mask(
                advantages=advantages.unsqueeze(-1),
                per_token_logps=output["old_per_token_logps"],
                sampling_per_token_logps=output["sampling_per_token_logps"],
                mask=mask,
                off_policy_threshold=self.off_policy_mask_threshold,
            ).squeeze(-1)
            weights = keep if weights is None else weights * keep
        return weights

    def _compute_loss(self, model, inputs):
        """P · Σ_{i ∈ micro} c'_i · r_i(θ) in gradient (P processes, whose gradients are averaged),
        L / (accumulation steps) in value."""
        mode = "train" if self.model.training else "eval"
        completion_mask = inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        logprobs, _, _ = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            inputs["completion_ids"].size(1),
            **{name: inputs.get(name) for name in MULTIMODAL_INPUTS},
        )  # (B_micro, T)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        proxy_rewards = reward_proxy(logprobs, logprobs.detach(), mask, beta=self.args.pacs_beta)  # 0 in value
        surrogate = (inputs["pacs_proxy_grad"] * proxy_rewards).sum() * self.accelerator.num_processes
        accumulation_steps = self.current_gradient_accumulation_steps if mode == "train" else 1
        return surrogate - surrogate.detach() + inputs["pacs_loss"] / accumulation_steps
