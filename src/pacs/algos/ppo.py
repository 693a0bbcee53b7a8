"""PPO with a learned critic and GAE (Schulman et al. 2017, arXiv 1707.06347; GAE: Schulman et
al. 2016, arXiv 1506.02438), as verl runs it for RLVR.

The outcome reward is the reward of the last response token (``outcome_token_rewards``; with
``kl_in_reward``, every token's reward is lowered by the rollout policy's KL penalty:
``ClippedPolicyGradient.token_rewards``); the critic's values V_t of the states before each response token give per-token advantages by GAE,
computed once per step over the response tokens of each row:

    δ_t = r_t + γ V_{t+1} − V_t          V after the last response token = 0
    Â_t = δ_t + γ λ Â_{t+1}              Â after the last response token = 0
    G_t = Â_t + V_t                      the critic's regression target (returns)
    A_t = (Â_t − mean Â) / sqrt(var Â + 1e-8)   whitened over every response token of the step

(t+1 is the next response token: padding positions are skipped.) The actor follows PPO's clipped
surrogate on A (``pacs.algos.pg``); the critic minimises the clipped value loss

    ℓ^V_t = ½ · max((V_t − G_t)², (clip(V_t, V^old_t − c, V^old_t + c) − G_t)²)

aggregated by ``critic_loss_agg`` and multiplied by ``critic_loss_scale``
(``critic_micro_batch_loss``).
verl's value loss has no ½ and is aggregated per micro-batch like its actor loss
(``pg.ClippedPolicyGradient``, ``loss_scale``): with seq-mean-token-sum-norm its gradient is 2·M
times this one's for micro-batches of M rows, so ``critic_loss_scale = 2·M`` (16 in the paper)
gives verl's critic gradient. verl also trains the value of the state after the last response
token (towards return 0) and bootstraps GAE from it; pacs does neither (no action follows that
state), which at γ = λ = 1 leaves the advantages and returns of response tokens unchanged.
Training the critic itself (its model, optimizer, gradient clip and warm-up) is the trainer's job.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field

from pacs.algos.aggregation import (
    LOSS_AGG_MODES,
    LossAggregation,
    aggregation_weights,
    weighted_token_sum,
)
from pacs.algos.base import MiniBatchTotals, SumOverRanks
from pacs.algos.masks import check_choice, check_same_shape
from pacs.algos.options import ClippedPolicyGradientConfig
from pacs.algos.pg import ClippedPolicyGradient

WHITEN_EPS = 1e-8
CONSTANT_RETURNS_ULPS = 1000
"""``explained_variance`` treats returns as constant when their std is within this many machine
epsilons of their scale (rounding error, not signal)."""


def check_discounts(gamma: float, lam: float) -> None:
    """Raise ValueError unless the discount γ and GAE λ both lie in [0, 1]."""
    for name, value in (("gamma", gamma), ("lam", lam)):
        if not 0 <= value <= 1:
            raise ValueError(f"{name} must be in [0, 1], got {value!r}")


def check_value_clip(clip: float | None) -> None:
    """Raise ValueError unless the value clip range c is None (no clipping) or > 0."""
    if clip is not None and not clip > 0:
        raise ValueError(f"value_clip must be None or > 0 (e.g. 0.5), got {clip!r}")


def whiten(
    values: torch.Tensor,
    response_mask: torch.Tensor,
    eps: float = WHITEN_EPS,
    sum_over_ranks: SumOverRanks | None = None,
) -> torch.Tensor:
    """Standardise ``values`` over every response token of the batch (verl's ``masked_whiten``).

    Formula (N = Σ_it m_it, sums over response tokens of every process's rows):
        μ = Σ v / N,   σ² = Σ (v − μ)² / max(N − 1, 1)  (unbiased),   out = (v − μ) / sqrt(σ² + eps)
    Padding positions of the output are 0.

    Args:
        values: (B, T) values, e.g. advantages.
        response_mask: (B, T) 1 at response tokens, 0 at padding.
        eps: added to the variance, > 0.
        sum_over_ranks: sums over the processes of a data-parallel run (None: this batch is all).

    Returns:
        (B, T) whitened values.
    """
    check_same_shape(values=values, response_mask=response_mask)
    total = sum_over_ranks or (lambda tensor: tensor)
    is_response = response_mask.bool()
    flat_values, flat_mask = values.flatten(), is_response.flatten()
    count_and_sum = total(torch.stack([flat_mask.sum().to(values.dtype), flat_values[flat_mask].sum()]))
    num_tokens = int(count_and_sum[0])
    mean = count_and_sum[1] / max(num_tokens, 1)
    variance = total(((flat_values - mean) ** 2)[flat_mask].sum()) / max(num_tokens - 1, 1)
    whitened = (values - mean) / torch.sqrt(variance + eps)
    return torch.where(is_response, whitened, torch.zeros_like(whitened))


def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    sum_over_ranks: SumOverRanks | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimates over response tokens, whitened, and the returns.

    Formula (per row, t and t+1 consecutive response tokens; padding positions are skipped):
        δ_t = r_t + γ V_{t+1} − V_t,   Â_t = δ_t + γ λ Â_{t+1},   V and Â after the last token = 0
        returns G_t = Â_t + V_t  (from the raw Â)
        advantages  = whiten(Â) over every response token of the batch (see ``whiten``)
    With γ = λ = 1 and an outcome reward R on the last token, G_t = R and Â_t = R − V_t.

    Args:
        token_rewards: (B, T) per-token rewards (``outcome_token_rewards``).
        values: (B, T) critic values V_t of the state before response token t, constants; values
            at padding positions are ignored.
        response_mask: (B, T) 1 at response tokens, 0 at padding (float, int or bool).
        gamma: discount γ in [0, 1].
        lam: GAE λ in [0, 1].
        sum_over_ranks: whitening statistics over every process (see ``whiten``).

    Returns:
        (advantages, returns), both (B, T), 0 at padding positions, no gradient.

    Raises:
        ValueError: shapes that differ, or γ or λ outside [0, 1].
    """
    check_same_shape(token_rewards=token_rewards, values=values, response_mask=response_mask)
    check_discounts(gamma, lam)
    is_response = response_mask.bool()
    dtype = torch.promote_types(torch.promote_types(token_rewards.dtype, values.dtype), torch.float32)
    rewards = torch.where(is_response, token_rewards.detach().to(dtype), 0.0)
    values = torch.where(is_response, values.detach().to(dtype), 0.0)
    next_value = torch.zeros_like(values[:, 0])
    next_advantage = torch.zeros_like(values[:, 0])
    raw_advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        next_advantage = torch.where(is_response[:, t], advantage, next_advantage)
        next_value = torch.where(is_response[:, t], values[:, t], next_value)
        raw_advantages[:, t] = next_advantage
    raw_advantages = torch.where(is_response, raw_advantages, 0.0)
    return whiten(raw_advantages, response_mask, sum_over_ranks=sum_over_ranks), raw_advantages + values


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip: float | None = 0.5,
) -> torch.Tensor:
    """Per-token clipped value loss (PPO2's value clipping).

    Formula (c = ``clip``):
        ℓ^V_t = ½ · max((V_t − G_t)², (clip(V_t, V^old_t − c, V^old_t + c) − G_t)²)
        clip None: ℓ^V_t = ½ (V_t − G_t)²

    Args:
        values: (B, T) current critic values V, with gradient.
        old_values: (B, T) the critic's values at rollout time V^old, constants.
        returns: (B, T) targets G (``gae_advantages``), constants.
        response_mask: (B, T) 1 at response tokens, 0 at padding; the loss is 0 at padding.
        clip: c > 0, or None for no clipping.

    Returns:
        (B, T) per-token losses; aggregate with ``aggregate_loss``.

    Raises:
        ValueError: shapes that differ or ``clip`` ≤ 0.
    """
    check_same_shape(values=values, old_values=old_values, returns=returns, response_mask=response_mask)
    check_value_clip(clip)
    squared_error = (values - returns) ** 2
    if clip is not None:
        clipped_values = old_values + (values - old_values).clamp(-clip, clip)
        squared_error = torch.maximum(squared_error, (clipped_values - returns) ** 2)
    return torch.where(response_mask.bool(), 0.5 * squared_error, torch.zeros_like(squared_error))


def explained_variance(values: torch.Tensor, returns: torch.Tensor, response_mask: torch.Tensor) -> float:
    """How much of the returns' variance the values explain, over every response token.

    Formula: EV = 1 − Var[G − V] / Var[G], variances over response tokens; 1 is perfect, 0 no
    better than a constant, < 0 worse. Undefined when the returns are constant (e.g. every reward
    of the step equal): then EV is nan, which the metrics writer records as null. Returns count
    as constant when std[G] ≤ 1000 · ε · max_t(|G_t|, |V_t|), ε the machine epsilon of their dtype
    (1.2e-7 in float32): G = Â + V carries rounding error of order ε · |V|, and dividing by its
    variance instead of 0 would give EV ≈ −1e14.

    Args:
        values: (B, T) critic values V.
        returns: (B, T) returns G, floating point.
        response_mask: (B, T) 1 at response tokens, 0 at padding.

    Returns:
        EV as a float, nan if undefined (constant returns or no response token).
    """
    check_same_shape(values=values, returns=returns, response_mask=response_mask)
    is_response = response_mask.bool()
    returns_at_tokens = returns.detach()[is_response].double()
    values_at_tokens = values.detach()[is_response].double()
    if returns_at_tokens.numel() == 0:
        return math.nan
    scale = float(torch.maximum(returns_at_tokens.abs(), values_at_tokens.abs()).max())
    returns_variance = float(returns_at_tokens.var(unbiased=False))
    if math.sqrt(returns_variance) <= CONSTANT_RETURNS_ULPS * torch.finfo(returns.dtype).eps * scale:
        return math.nan
    return 1.0 - float((returns_at_tokens - values_at_tokens).var(unbiased=False)) / returns_variance


class PPO(ClippedPolicyGradient):
    """PPO's actor as a trainer plug-in, plus the loss of its critic.

    Its options are its constructor's keywords, each described in the configuration reference
    (docs/reference/configuration.md, generated from its section below, `pacs.algos.ppo.PpoConfig`).
    ``needs`` holds "values": the critic's values of the rollout.

    The critic's update follows the same contract as the actor's: per mini-batch
    ``critic_row_terms(minibatch)``, then per micro-batch ``critic_micro_batch_loss(values, micro,
    row_terms)``, whose gradients sum to that of the mini-batch value loss.
    """

    def __init__(
        self,
        group_size: int,
        *,
        gamma: float = 1.0,
        lam: float = 1.0,
        value_clip: float | None = 0.5,
        critic_loss_agg: str = "token-mean",
        critic_loss_scale: float = 1.0,
        **options,
    ):
        super().__init__(group_size, **options)
        check_choice("critic_loss_agg", critic_loss_agg, LOSS_AGG_MODES)
        if not (math.isfinite(critic_loss_scale) and critic_loss_scale > 0):
            raise ValueError(f"critic_loss_scale must be a finite number > 0 (1: no scaling), got {critic_loss_scale!r}")
        self.critic_loss_scale = critic_loss_scale
        check_discounts(gamma, lam)
        check_value_clip(value_clip)
        self.gamma, self.lam, self.value_clip, self.critic_loss_agg = gamma, lam, value_clip, critic_loss_agg
        self.needs = self.needs | {"values"}

    def prepare_step(self, batch, sum_over_ranks=None) -> dict[str, torch.Tensor]:
        """{"advantages": (B, T) whitened GAE, "returns": (B, T)} from the step's rewards and values
        (and the ``rollout_is_terms``)."""
        mask = batch["response_mask"]
        token_rewards = self.token_rewards(batch)
        advantages, returns = gae_advantages(
            token_rewards, batch["values"], mask, gamma=self.gamma, lam=self.lam, sum_over_ranks=sum_over_ranks
        )
        return {**self.rollout_is_terms(batch), "advantages": advantages, "returns": returns}

    def critic_row_terms(self, minibatch, totals: MiniBatchTotals | None = None) -> dict[str, torch.Tensor]:
        """{"loss_weight": (B,) aggregation weights of the mini-batch's rows under critic_loss_agg,
        times critic_loss_scale}, normalised by the global mini-batch's `totals` (None: `minibatch`
        is all of it)."""
        mask = minibatch["response_mask"]
        totals = totals or MiniBatchTotals.of(mask)
        weights = self.critic_loss_scale * aggregation_weights(
            mask,
            self.critic_loss_agg,
            num_rows=totals.num_rows,
            num_tokens=totals.num_tokens,
            max_response_length=self.max_response_length,
        )
        return {"loss_weight": weights}

    def critic_micro_batch_loss(self, values: torch.Tensor, micro, row_terms) -> torch.Tensor:
        """Σ_{i ∈ micro} w_i Σ_t m_it ℓ^V_it: this micro-batch's share of the mini-batch value loss.

        ``values`` (b, R) are the critic's current values, with gradient; ``micro`` holds
        "values" (rollout-time values), "returns" and "response_mask" of the same rows.
        """
        mask = micro["response_mask"]
        per_token = value_loss(values, micro["values"], micro["returns"], mask, clip=self.value_clip)
        return weighted_token_sum(per_token, mask, row_terms["loss_weight"])

    def critic_metric_weights(self, minibatch) -> dict[str, float]:
        """Response tokens for "critic/value_loss" under a token-mean critic loss and for
        "critic/explained_variance" (a ratio of variances over tokens: the token-weighted mean of
        the ranks' values approximates the global one; it is exact with one process)."""
        tokens = float(minibatch["response_mask"].sum())
        weights = {"critic/explained_variance": tokens}
        if self.critic_loss_agg == "token-mean":
            weights["critic/value_loss"] = tokens
        return weights

    def critic_metrics(self, values: torch.Tensor, minibatch) -> dict[str, float]:
        """ "critic/value_loss" (the mini-batch value loss) and "critic/explained_variance" of
        ``values`` (B, R), e.g. the rollout-time ``minibatch["values"]`` or a no-grad pass."""
        with torch.no_grad():
            loss = self.critic_micro_batch_loss(values, minibatch, self.critic_row_terms(minibatch))
        return {
            "critic/value_loss": float(loss),
            "critic/explained_variance": explained_variance(values, minibatch["returns"], minibatch["response_mask"]),
        }


class PpoConfig(ClippedPolicyGradientConfig):
    builds = PPO

    name: Literal["ppo"] = "ppo"
    """PPO: GAE advantages from a learned critic (settings under `critic`; `pacs.algos.ppo`)."""
    gamma: float = Field(1.0, ge=0, le=1)
    """GAE's discount γ."""
    lam: float = Field(1.0, ge=0, le=1)
    """GAE's λ."""
    value_clip: float | None = Field(0.5, gt=0, allow_inf_nan=False)
    """Clip range of the critic's values around their rollout-time values; None: no clipping."""
    critic_loss_agg: LossAggregation = "token-mean"
    """How the per-token value loss ½·max((V − G)², (V_clipped − G)²) is aggregated."""
    critic_loss_scale: float = Field(1.0, gt=0, allow_inf_nan=False)
    """Multiplies the value loss (16 for the paper's verl critic: 2 for its missing ½, times 8)."""
