"""Clipped policy gradient: the trainer plug-in shared by GRPO, RLOO, PPO's actor, Dr. GRPO, DAPO,
GSPO and CISPO.

Each algorithm supplies advantages A (``prepare_step``: per response (B,) or per token (B, T));
the update is a per-token surrogate ℓ (``per_token_loss``: PPO's clipped surrogate below, GSPO's
sequence-level one, CISPO's clipped-weight loss) with an optional KL penalty to a reference policy
and an entropy bonus, aggregated over tokens by one loss aggregation mode:

    ρ_it = π_θ(o_it) / π_old(o_it)
    ℓ_it = max(−A_it ρ_it, −A_it clip(ρ_it, 1 − ε_low, 1 + ε_high))
           [dual clip c, where A_it < 0: ℓ_it = min(ℓ_it, −c A_it)]
           + kl_coef · k_it − entropy_coef · H_it
    L    = Σ_i w_i Σ_t m_it ℓ_it      w = aggregation_weights(mini-batch mask, loss_agg)

w_i depends only on row i and constants of the mini-batch, so ``prepare_update`` computes it once
per mini-batch and each micro-batch adds ``Σ_{i ∈ micro} w_i Σ_t m_it ℓ_it``: the shares sum to L in
value and gradient at any micro-batch size (see ``pacs.algos.base``). k is the per-token KL
estimator ``kl_estimator`` (``kl.kl_penalty``): "k2" follows the gradient of KL(π_θ ‖ π_ref), "k3"
(the default, GRPO's) that of KL(π_ref ‖ π_θ); "k1", whose expected gradient is zero, is refused
when kl_coef > 0. See ``surrogates.clipped_surrogate``, ``aggregation.aggregation_weights`` and
``kl.kl_penalty`` for the pieces.

Two options reproduce the paper's verl baselines (docs/paper-fidelity.md):

    loss_scale s:   L ← s · L. verl's seq-mean-token-sum-norm sums each micro-batch of M rows and
                    divides by the padded width (the maximum response length), then by the number
                    of micro-batches, so its gradient is M times this L's; s = M (8 in the paper)
                    gives verl's gradient itself, and with it verl's clip point.
    kl_in_reward:   the KL term leaves the loss: ``kl_coef · k_it`` of the rollout policy
                    (k on ``old_logprobs`` against ``ref_logprobs``) is subtracted from the reward
                    of token t before the advantages (``reward_kl_penalty``), the classic
                    PPO-RLHF penalty (verl's ``use_kl_in_reward``).

The sampler correction (``rollout_is_cap`` C, off by default): the responses come from the rollout
engine's sampler μ, the loss is written for π_old, so each token's clipped surrogate (after the
dual clip) is multiplied by an importance weight, outside the clip (``importance.rollout_is_weights``):

    ℓ'_it = w_it · ℓ_it           level "token" (default):  w_it from ρ_it = π_old(o_it) / μ(o_it)
                                  level "sequence":         w_it = w_i from ρ_i = Π_t ρ_it, every
                                                            token of response i alike
    w = min(ρ, C)                 mode "truncate" (default; verl's TIS)
    w = ρ · 1[F ≤ ρ ≤ C]          mode "mask" (verl's MIS, IcePop), F = ``rollout_is_floor`` or 1/C

which is verl's rollout correction (``compute_policy_loss_vanilla``: ``pg_losses *
rollout_is_weights``) and the decoupled PPO objective of AReaL with π_old as the proximal policy
and μ the behaviour policy: the clip bounds the step from π_old, the weight corrects for sampling
from μ. The KL penalty, the entropy bonus and PPO's critic are not weighted (nor are they in verl).

DAPO's overlong reward shaping (``overlong_buffer`` L_cache > 0, ``shaping.overlong_penalty``) adds
p · R_length(o_i) ∈ [−p, 0] to each outcome reward before the advantages, for every algorithm here.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from pacs.algos.aggregation import (
    LOSS_AGG_MODES,
    aggregation_weights,
    weighted_token_sum,
)
from pacs.algos.base import MiniBatchTotals
from pacs.algos.groups import (
    GRPO_STD_EPS,
    check_group_size,
    group_normalised,
    mixed_group_fraction,
)
from pacs.algos.importance import (
    ROLLOUT_IS_LEVELS,
    check_rollout_is,
    rollout_is_weights,
)
from pacs.algos.kl import check_kl_penalty, kl_penalty
from pacs.algos.masks import check_choice, masked_mean
from pacs.algos.shaping import (
    check_overlong_shaping,
    outcome_token_rewards,
    response_lengths,
    shaped_rewards,
)
from pacs.algos.surrogates import check_clip_range, clipped_surrogate


class ClippedPolicyGradient:
    """Base of the policy-gradient plug-ins (`pacs.algos.base.Algorithm`). A subclass may define
    ``prepare_step``, returning at least ``{"advantages": (B,) or (B, T)}`` (here GRPO's
    group-normalised rewards), and ``per_token_loss`` (here PPO's clipped surrogate).

    Args:
        group_size: responses per prompt n.
        max_response_length: the maximum response length (``seq-mean-token-sum-norm`` divides by it).
        clip_low, clip_high: ε_low in (0, 1] and ε_high > 0 of the clip range [1 − ε_low, 1 + ε_high].
        dual_clip: c > 1, or None.
        loss_agg: one of ``LOSS_AGG_MODES``; the default is the paper's GRPO baseline (Dr. GRPO).
        kl_coef: weight ≥ 0 of the per-token KL to the reference policy; > 0 needs "ref_logprobs".
        kl_estimator: ``"k2"`` (gradient of KL(π_θ ‖ π_ref)) or ``"k3"`` (gradient of KL(π_ref ‖ π_θ));
            ``"k1"`` only with kl_coef = 0 or in the reward (see ``kl.kl_penalty``).
        entropy_coef: weight ≥ 0 of the entropy bonus; > 0 needs "entropy".
        loss_scale: s > 0 multiplying the whole loss (1: the mean-normalised loss; see above).
        kl_in_reward: subtract the KL estimate of the rollout policy from the reward instead of adding
            it to the loss; needs kl_coef > 0, "ref_logprobs" and every row's ``old_logprobs`` in
            ``prepare_step``. Any estimator, k1 included, is valid there.
        rollout_is_cap: C >= 1 of the importance-sampling correction of the sampler mismatch, or
            None (off): each token's surrogate ℓ_it is multiplied by its weight w_it (the module
            docstring; ``importance.rollout_is_weights``, μ the rollout engine's "sampler_logprobs");
            the KL and entropy terms are not. Needs "sampler_logprobs" and every row's
            ``old_logprobs`` in ``prepare_step``.
        rollout_is_mode: "truncate" (w = min(ρ, C)) or "mask" (w = ρ inside [floor, C], else 0).
        rollout_is_level: "token" (one ratio per token) or "sequence" (one per response, the
            product of its tokens').
        rollout_is_floor: F in (0, 1], the bottom of mask mode's kept range; None: 1/C.
        overlong_buffer: L_cache >= 0 of DAPO's overlong reward shaping (0: off; see the module
            docstring), at most ``max_response_length``.
        overlong_penalty: p >= 0, the shaping's largest penalty.
    """

    min_group_size = 1
    per_token_loss: Callable[..., tuple[torch.Tensor, dict[str, float]]] = staticmethod(clipped_surrogate)
    """The surrogate ℓ: ``(logprobs, old_logprobs, advantages, response_mask, *, clip_low, clip_high,
    [dual_clip]) -> ((B, T) per-token losses, {"clip_fraction", "approx_kl"})``."""
    surrogate_needs_logprobs = False
    """True when the surrogate's value depends on the log-probs themselves, not only on the ratio
    to ``old_logprobs`` (CISPO): its first-update "loss" metric then needs them."""
    rollout_is_levels = ROLLOUT_IS_LEVELS
    """The levels of the sampler correction these algorithms take: token and sequence."""
    startup_note: str | None = None

    def __init__(
        self,
        group_size: int,
        *,
        max_response_length: int,
        clip_low: float = 0.2,
        clip_high: float = 0.2,
        dual_clip: float | None = None,
        loss_agg: str = "seq-mean-token-sum-norm",
        kl_coef: float = 0.0,
        kl_estimator: str = "k3",
        entropy_coef: float = 0.0,
        loss_scale: float = 1.0,
        kl_in_reward: bool = False,
        rollout_is_cap: float | None = None,
        rollout_is_mode: str = "truncate",
        rollout_is_level: str = "token",
        rollout_is_floor: float | None = None,
        overlong_buffer: int = 0,
        overlong_penalty: float = 1.0,
    ):
        check_group_size(group_size, self.min_group_size, type(self).__name__)
        check_rollout_is(rollout_is_cap, rollout_is_mode, rollout_is_level, rollout_is_floor, levels=self.rollout_is_levels)
        check_overlong_shaping(overlong_buffer, overlong_penalty, max_response_length)
        check_clip_range(clip_low, clip_high, dual_clip)
        check_choice("loss_agg", loss_agg, LOSS_AGG_MODES)
        if isinstance(max_response_length, bool) or not isinstance(max_response_length, int) or max_response_length < 1:
            raise ValueError(
                f"max_response_length must be a positive integer (the maximum response length), got {max_response_length!r}"
            )
        for name, coef in (("kl_coef", kl_coef), ("entropy_coef", entropy_coef)):
            if not (math.isfinite(coef) and coef >= 0):
                raise ValueError(f"{name} must be a finite number >= 0 (0 switches the term off), got {coef!r}")
        if not (math.isfinite(loss_scale) and loss_scale > 0):
            raise ValueError(f"loss_scale must be a finite number > 0 (1: no scaling), got {loss_scale!r}")
        if kl_in_reward and not kl_coef > 0:
            raise ValueError(f"kl_in_reward needs kl_coef > 0 (the weight of the reward's KL penalty), got {kl_coef!r}")
        check_kl_penalty(kl_coef, kl_estimator, in_reward=kl_in_reward)
        self.group_size, self.max_response_length = group_size, max_response_length
        self.loss_scale, self.kl_in_reward = loss_scale, kl_in_reward
        self.clip_low, self.clip_high, self.dual_clip = clip_low, clip_high, dual_clip
        self.loss_agg, self.kl_estimator = loss_agg, kl_estimator
        self.kl_coef, self.entropy_coef = kl_coef, entropy_coef
        self.rollout_is_cap, self.rollout_is_floor = rollout_is_cap, rollout_is_floor
        self.rollout_is_mode, self.rollout_is_level = rollout_is_mode, rollout_is_level
        self.overlong_buffer, self.overlong_penalty = overlong_buffer, overlong_penalty
        needs = set()
        if kl_coef > 0:
            needs.add("ref_logprobs")
        if rollout_is_cap is not None:
            needs.add("sampler_logprobs")
        if entropy_coef > 0:
            needs.add("entropy")
        self.needs = frozenset(needs)
        self.first_update_may_supply_old_logprobs = not kl_in_reward
        """The reward's KL penalty is a step term of every row's old log-probs. The correction's
        weights are not: each row's depends on its own old log-probs alone, so rows whose old
        log-probs the first update gives get theirs from them (``with_rollout_is_weights``)."""

    def rollout_is_terms(self, batch) -> dict[str, torch.Tensor]:
        """{"rollout_is_weight": the IS weights, (B, T) per token or (B,) per response by
        ``rollout_is_level``} with ``rollout_is_cap`` and ``batch``'s "old_logprobs", else {}
        (without old log-probs, as in ``prepare_step`` when the first update gives some of them,
        the weights are made later from each mini- or micro-batch's own: ``with_rollout_is_weights``)."""
        if self.rollout_is_cap is None or "old_logprobs" not in batch:
            return {}
        weights = rollout_is_weights(
            batch["old_logprobs"], batch["sampler_logprobs"], batch["response_mask"], self.rollout_is_cap,
            mode=self.rollout_is_mode, level=self.rollout_is_level, floor=self.rollout_is_floor,
        )  # fmt: skip
        return {"rollout_is_weight": weights}

    def with_rollout_is_weights(self, rows):
        """``rows`` with their sampler-correction weights: the step's "rollout_is_weight" when
        ``prepare_step`` made them, else (with ``rollout_is_cap``) ``rollout_is_terms`` of the rows'
        own "old_logprobs". A row's weight depends on its own log-probs alone, so the two are the
        same numbers; on the step's first update π_old = π_θ, and the old log-probs its forward pass
        gives (detached) make the weights exactly."""
        if self.rollout_is_cap is None or "rollout_is_weight" in rows:
            return rows
        return {**rows, **self.rollout_is_terms(rows)}

    def reward_kl_penalty(self, batch) -> torch.Tensor:
        """(B, T) per-token KL penalty of the rollout policy, kl_coef · k_it, subtracted from the
        reward with ``kl_in_reward`` (0 at padding; no gradient).

        Formula: kl_coef · k(old_logprobs, ref_logprobs), k the estimator ``kl_estimator``
        (``kl.kl_penalty``); ``batch`` holds "old_logprobs", "ref_logprobs" and "response_mask".
        """
        kl = kl_penalty(batch["old_logprobs"].detach(), batch["ref_logprobs"], batch["response_mask"], self.kl_estimator)
        return self.kl_coef * kl

    def outcome_rewards(self, batch) -> torch.Tensor:
        """(B,) the verifier's rewards R_i, with DAPO's overlong penalty added when
        ``overlong_buffer`` > 0 (``shaping.shaped_rewards``)."""
        if not self.overlong_buffer:
            return batch["rewards"]
        return shaped_rewards(
            batch["rewards"], response_lengths(batch), max_length=self.max_response_length, buffer=self.overlong_buffer,
            penalty=self.overlong_penalty,
        )  # fmt: skip

    def group_relative_terms(self, batch, *, norm_by_std: bool, eps: float = GRPO_STD_EPS) -> dict[str, torch.Tensor]:
        """{"advantages": (B,)} of GRPO and its variants, and the ``rollout_is_terms``.

        Formula (mean and std over the n rows of the group of i, std unbiased; R = ``sequence_rewards``):
            norm_by_std:  A_i = (R_i − mean_j R_j) / (std_j R_j + eps)
            otherwise:    A_i =  R_i − mean_j R_j
        """
        rewards = self.sequence_rewards(batch).detach()
        rewards = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
        advantages = group_normalised(rewards, self.group_size, divide_by_std=norm_by_std, eps=eps)
        return {**self.rollout_is_terms(batch), "advantages": advantages}

    def sequence_rewards(self, batch) -> torch.Tensor:
        """(B,) the rewards that group baselines (GRPO, RLOO) compare.

        Formula: R_i (``outcome_rewards``), or with ``kl_in_reward`` R_i − Σ_t kl_coef · k_it
        (``reward_kl_penalty``, the sum over i's response tokens of the per-token rewards, as verl sums them).
        """
        rewards = self.outcome_rewards(batch)
        if not self.kl_in_reward:
            return rewards
        penalty = self.reward_kl_penalty(batch).sum(dim=-1)
        dtype = torch.promote_types(rewards.dtype, torch.float32)
        return rewards.to(dtype) - penalty.to(dtype)

    def token_rewards(self, batch) -> torch.Tensor:
        """(B, T) per-token rewards (PPO's GAE): each outcome reward R_i (``outcome_rewards``) on its
        response's last token (``outcome_token_rewards``), minus ``reward_kl_penalty`` at every token
        with ``kl_in_reward``."""
        token_rewards = outcome_token_rewards(self.outcome_rewards(batch), batch["response_mask"])
        if not self.kl_in_reward:
            return token_rewards
        return token_rewards - self.reward_kl_penalty(batch).to(token_rewards.dtype)

    def prepare_step(self, batch, sum_over_ranks=None) -> dict[str, torch.Tensor]:
        """{"advantages": (B,) GRPO's group-normalised ``sequence_rewards``} (and the
        ``rollout_is_terms``): DAPO's, GSPO's and CISPO's; the other algorithms define their own."""
        return self.group_relative_terms(batch, norm_by_std=True)

    def surrogate(self, logprobs: torch.Tensor, rows) -> tuple[torch.Tensor, dict[str, float]]:
        """(B, T) per-token policy loss ℓ and its metrics: ``per_token_loss`` on ``rows``'
        "old_logprobs", "advantages" and "response_mask", with the clip range (and dual clip, when set)."""
        dual_clip = {} if self.dual_clip is None else {"dual_clip": self.dual_clip}
        return self.per_token_loss(
            logprobs,
            rows["old_logprobs"],
            rows["advantages"],
            rows["response_mask"],
            clip_low=self.clip_low,
            clip_high=self.clip_high,
            **dual_clip,
        )

    def _policy_loss(self, logprobs: torch.Tensor, rows) -> tuple[torch.Tensor, dict[str, float]]:
        """(B, T) per-token surrogate (times the IS weight with ``rollout_is_cap``, a response's
        own for every token at the sequence level) +
        kl_coef · KL unless ``kl_in_reward`` (no entropy), and its metrics."""
        rows = self.with_rollout_is_weights(rows)
        mask = rows["response_mask"]
        per_token, surrogate_metrics = self.surrogate(logprobs, rows)
        metrics = {f"actor/{name}": value for name, value in surrogate_metrics.items()}
        if "rollout_is_weight" in rows:
            weights = rows["rollout_is_weight"].to(per_token.dtype)
            per_token = per_token * (weights[:, None] if weights.dim() == 1 else weights)
        if self.kl_coef > 0:
            kl = kl_penalty(logprobs, rows["ref_logprobs"], mask, self.kl_estimator)
            if not self.kl_in_reward:
                per_token = per_token + self.kl_coef * kl
            metrics["actor/kl_ref"] = float(masked_mean(kl.detach().flatten(), mask.flatten()))
        return per_token, metrics

    def prepare_update(self, minibatch, current_logprobs, policy_is_rollout_policy, totals=None):
        """row_terms["loss_weight"]: (B,) aggregation weights w of the mini-batch's rows.

        Metrics, at the current policy (on the first update after a rollout the ratio is 1:
        ``old_logprobs``, or none when not computed yet and neither the KL penalty nor the sampler
        correction needs their values; else one no-grad pass ``current_logprobs()``, the price of an
        exact "loss", which the update's own forward gives when the mini-batch is one micro-batch): "loss" (L
        without the entropy bonus, since entropy reaches micro-batches only), "actor/clip_fraction",
        "actor/approx_kl" (k3 of KL(π_old ‖ π_θ)), "actor/kl_ref" (mean per-token estimate k of the
        KL to the reference, if kl_coef > 0), "advantages/mean" (over rows, or response tokens if per
        token) and "groups/mixed_fraction", all of this share of the mini-batch. The weights are
        those of the global mini-batch (`totals`); "loss" is this share's own loss (its rows
        weighted as if they were the mini-batch).
        """
        mask = minibatch["response_mask"]
        if not policy_is_rollout_policy:
            logprobs, rows = current_logprobs(), minibatch
        else:
            if "old_logprobs" in minibatch:
                logprobs = minibatch["old_logprobs"]
            elif self.kl_coef > 0 or self.surrogate_needs_logprobs or self.rollout_is_cap is not None:
                # not computed yet: the KL, the surrogate or the correction's weights need them
                logprobs = current_logprobs()
            else:  # not computed yet: a ratio of 1 needs no values
                logprobs = torch.zeros_like(mask)
            rows = {**minibatch, "old_logprobs": logprobs}
        totals = totals or MiniBatchTotals.of(mask)
        loss_weight = self.loss_scale * aggregation_weights(
            mask,
            self.loss_agg,
            num_rows=totals.num_rows,
            num_tokens=totals.num_tokens,
            max_response_length=self.max_response_length,
        )
        with torch.no_grad():
            per_token, metrics = self._policy_loss(logprobs, rows)
            own_weights = self.loss_scale * aggregation_weights(mask, self.loss_agg, max_response_length=self.max_response_length)
            loss = weighted_token_sum(per_token, mask, own_weights)
        advantages = minibatch["advantages"]
        if advantages.dim() == 1:
            mean_advantage = advantages.mean()
        else:
            mean_advantage = masked_mean(advantages.flatten(), mask.flatten())
        metrics = {
            "loss": float(loss),
            **metrics,
            "advantages/mean": float(mean_advantage),
            "groups/mixed_fraction": mixed_group_fraction(minibatch["rewards"], self.group_size),
        }
        if self.overlong_buffer:
            metrics["reward/overlong_penalty"] = float((self.outcome_rewards(minibatch) - minibatch["rewards"]).mean())
        return {"loss_weight": loss_weight}, metrics

    def metric_weights(self, minibatch) -> dict[str, float]:
        """Response tokens for the per-token means (and "loss" under token-mean, "advantages/mean"
        when advantages are per token); see `pacs.algos.base`."""
        tokens = float(minibatch["response_mask"].sum())
        weights = {"actor/clip_fraction": tokens, "actor/approx_kl": tokens, "actor/kl_ref": tokens}
        if self.loss_agg == "token-mean":
            weights["loss"] = tokens
        if minibatch["advantages"].dim() == 2:
            weights["advantages/mean"] = tokens
        return weights

    def micro_batch_loss(self, logprobs, micro, row_terms) -> torch.Tensor:
        """Σ_{i ∈ micro} w_i Σ_t m_it ℓ_it: this micro-batch's share of L (entropy bonus included)."""
        per_token, _ = self._policy_loss(logprobs, micro)
        if self.entropy_coef > 0:
            per_token = per_token - self.entropy_coef * micro["entropy"]
        return weighted_token_sum(per_token, micro["response_mask"], row_terms["loss_weight"])
