"""PACS for TRL users: `PACSTrainer` and `PACSConfig` in place of TRL's `GRPOTrainer` and `GRPOConfig`.

    from pacs.integrations.trl import PACSConfig, PACSTrainer

    args = PACSConfig(output_dir="out", num_generations=8, pacs_beta=1.0)   # any GRPOConfig argument
    trainer = PACSTrainer(model=..., reward_funcs=..., args=args, train_dataset=...)
    trainer.train()

The same dataset, reward functions and TRL arguments; the loss is PACS's (`pacs.algos.pacs`) with
the logratio proxy r_i = β · Σ_t m_it (log π_θ(o_it) − log π_old(o_it)), β = ``pacs_beta``, the
score ``pacs_estimator`` ("rloo", "grpo", "naive") and the class weights ``pacs_weighting``
("question", "none", "only_positive", "only_negative"). The verifier reward R_i is the weighted sum
of the reward functions (TRL's ``reward_weights``) and must lie in [0, 1]: it is the BCE target.

Exact under TRL's micro-batching and gradient accumulation. TRL generates one batch of G groups of
n completions (over all processes), shuffles it and splits it into ``steps_per_generation``
micro-batches, so a group's completions land in different micro-batches and processes. ψ_i needs
the whole group, but r_i depends on row i alone, and while θ = θ_old (the batch's one optimizer
step) r = 0 in closed form; so the constants c_i = ∂L/∂r_i are computed once from the whole batch's
rewards (`pacs.algos.PACS.prepare_update`, as pacs's own trainer does), and each micro-batch
backpropagates Σ_{i ∈ micro} c_i · r_i(θ) (`PACS.micro_batch_loss`):

    Σ_micro ∇_θ Σ_{i ∈ micro} c_i · r_i(θ) = Σ_i c_i ∇_θ r_i(θ) = ∇_θ L,
    L = 1/B · Σ_i w_i · BCE(ψ_i, R_i)

over the B = G · n completions of the generation batch. The value returned for each micro-batch is
L / (accumulation steps), so TRL's logged ``loss`` is L; ``pacs/loss`` and
``pacs/predicted_p_on_correct``/``_incorrect`` (mean σ(ψ) on R = 1 and R = 0) are logged too.

What that needs, checked by `PACSConfig` (a ValueError lists every setting at fault):
    num_iterations = 1 and steps_per_generation = gradient_accumulation_steps (TRL's defaults): one
        optimizer step per generation batch, so θ = θ_old in every micro-batch;
    beta = 0 (TRL's KL coefficient; PACS's β is ``pacs_beta``), entropy_coef = 0, no adaptive
        entropy, top_entropy_quantile = 1, multi_objective_aggregation = "sum_then_normalize",
        use_liger_kernel = False, and with use_vllm, vllm_importance_sampling_correction = False:
        terms this loss does not compute.

TRL is imported on first use of `PACSConfig` or `PACSTrainer`, never by pacs itself.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from pacs.algos import ESTIMATORS, PACS, WEIGHTINGS
from pacs.algos.base import MiniBatchTotals

INSTALL = "pip install 'pacs[trl]'"
MULTIMODAL_INPUTS = (
    "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
    "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids",
)  # fmt: skip
"""Inputs TRL passes to its model forward for vision-language models; passed on unchanged."""


def __getattr__(name: str) -> Any:
    if name in ("PACSConfig", "PACSTrainer"):
        return _classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    if args.use_vllm and args.vllm_importance_sampling_correction:
        found.append("use_vllm=True with vllm_importance_sampling_correction=True: set the correction False")
    if not (isinstance(args.pacs_beta, (int, float)) and math.isfinite(args.pacs_beta)):
        found.append(f"pacs_beta={args.pacs_beta!r}: a finite number")
    if args.pacs_estimator not in ESTIMATORS:
        found.append(f"pacs_estimator={args.pacs_estimator!r}: one of {', '.join(ESTIMATORS)}")
    if args.pacs_weighting not in WEIGHTINGS:
        found.append(f"pacs_weighting={args.pacs_weighting!r}: one of {', '.join(WEIGHTINGS)}")
    return found


def pacs_coefficients(algorithm: PACS, rewards: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """c = ∂L/∂r at θ = θ_old (r = 0) for a whole generation batch, and PACS's metrics there.

    Args:
        algorithm: PACS with the logratio proxy.
        rewards: (B,) rewards R in [0, 1] of the whole batch (every process), rows [g*n, (g+1)*n)
            one prompt's group.

    Returns:
        (B,) c_i in float64 (they multiply r in the model's dtype), and {"loss": L,
        "pacs/predicted_p_on_correct": ..., ...}.
    """
    batch = {"rewards": rewards.double()}
    totals = MiniBatchTotals(num_rows=len(rewards), num_tokens=1.0)
    row_terms, metrics = algorithm.prepare_update(batch, None, policy_is_rollout_policy=True, totals=totals)
    return row_terms["proxy_grad"], metrics


def _import_trl():
    try:
        import trl
    except ImportError as error:
        raise ImportError(f"pacs.integrations.trl needs TRL, which is not installed: {INSTALL}") from error
    return trl


@functools.cache
def _classes() -> dict[str, type]:
    """PACSConfig and PACSTrainer, made on first use (they subclass TRL's classes)."""
    import dataclasses

    trl = _import_trl()

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

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if not isinstance(self.args, PACSConfig):
                raise TypeError(
                    f"PACSTrainer's args must be a pacs.integrations.trl.PACSConfig, got {type(self.args).__name__}"
                )
            if self.aux_loss_enabled:
                raise ValueError("PACSTrainer: the model's MoE router aux loss is not supported (output_router_logits)")
            self._pacs = {
                mode: PACS(
                    group_size,
                    beta=self.args.pacs_beta,
                    proxy="logratio",
                    estimator=self.args.pacs_estimator,
                    weighting=self.args.pacs_weighting,
                )
                for mode, group_size in (("train", self.num_generations), ("eval", self.num_generations_eval))
            }
            self._rewards_per_func = None

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            self._rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            return self._rewards_per_func

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            mode = "train" if self.model.training else "eval"
            weights = self.reward_weights.to(self._rewards_per_func.device)
            rewards = (self._rewards_per_func * weights.unsqueeze(0)).sum(dim=1)  # (B over every process,)
            if not bool(((rewards >= 0) & (rewards <= 1)).all()):
                raise ValueError(
                    "PACSTrainer: the weighted sum of the reward functions (reward_weights) must lie in [0, 1] for "
                    f"every completion (PACS's BCE target); got min {rewards.min().item()}, max {rewards.max().item()}"
                    " (NaN: a completion no reward function scored)"
                )
            proxy_grad, metrics = pacs_coefficients(self._pacs[mode], rewards)
            local_rows = output["completion_ids"].shape[0]
            start = self.accelerator.process_index * local_rows
            output["pacs_proxy_grad"] = proxy_grad[start : start + local_rows]
            output["pacs_loss"] = torch.tensor(metrics.pop("loss"), device=proxy_grad.device)
            self._metrics[mode]["pacs/loss"].append(output["pacs_loss"].item())
            for name, value in metrics.items():
                self._metrics[mode][name].append(value)
            return output

        def _compute_loss(self, model, inputs):
            """P · Σ_{i ∈ micro} c_i · r_i(θ) in gradient (P processes, whose gradients are averaged),
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
            micro = {"old_logprobs": logprobs.detach(), "response_mask": mask}
            surrogate = self._pacs[mode].micro_batch_loss(logprobs, micro, {"proxy_grad": inputs["pacs_proxy_grad"]})
            surrogate = surrogate * self.accelerator.num_processes
            accumulation_steps = self.current_gradient_accumulation_steps if mode == "train" else 1
            return surrogate - surrogate.detach() + inputs["pacs_loss"] / accumulation_steps

    return {"PACSConfig": PACSConfig, "PACSTrainer": PACSTrainer}
