"""The paper baseline configs reproduce the update the paper's verl made (docs/paper-fidelity.md):
for every `configs/paper-grpo-*` and `paper-ppo-*`, pacs's clipped gradient, with the
config's own settings, equals the reference's clipped gradient up to one constant factor, the
same for every mini-batch (Adam is invariant to such a factor up to its epsilon).

The reference is written from the formulas of the paper's setup (verl as vendored in
ritzz-ai/PACS at 432f9e, run by scripts/baseline/grpo.sh and ppo.sh with verl's defaults), not
from verl's code:

    per rank, the mini-batch's rows in micro-batches of 8 (ppo_micro_batch_size_per_gpu);
    micro-batch loss      Σ_{i ∈ micro} Σ_t m_it ℓ_it / W     (seq-mean-token-sum-norm; W the padded
                                                            width = the maximum response length)
    backward of           micro-batch loss / (micro-batches per rank)   (gradient accumulation)
    gradient              the mean over ranks, then clipped to norm 1.0 (grad_clip, actor and critic)
    actor  ℓ_it = max(−A ρ, −A clip(ρ, 0.8, 1.2)), and where A < 0: min(ℓ_it, −3 A)   (clip_ratio_c 3)
    critic ℓ_it = max((V − G)², (V_old + clip(V − V_old, −0.5, 0.5) − G)²)         (no ½)

Scaled down from the paper's per-GPU layout: 16 prompts x 8 responses of 1 to W tokens, 2 ranks,
mini-batches of 8 prompts (32 rows per rank = 4 micro-batches of 8). The parameters θ enter the
log-probs (and φ the values) linearly, lp = lp_old + z + s X θ at θ = 0, so each mini-batch's
gradient norm is set by its scale s: the reference's is 0.5 on one mini-batch (not clipped) and
4 on the other (clipped), so a clip point that differs from the paper's shows as a factor that
changes between them, and the log-ratios z put tokens beyond the dual clip.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pacs import compare as compare_module
from pacs.algos.base import MiniBatchTotals
from pacs.cli import main
from pacs.compare import PAPER_BASELINES as PAPER_BASELINES_OVERRIDES
from pacs.config import Config, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
PAPER_BASELINE_CONFIGS = sorted(CONFIGS.glob("paper-grpo-*.yaml")) + sorted(CONFIGS.glob("paper-ppo-*.yaml"))
PAPER_PPO_CONFIGS = [path for path in PAPER_BASELINE_CONFIGS if path.name.startswith("paper-ppo-")]

GROUP_SIZE = 8
PROMPTS = 16
MINI_BATCH_PROMPTS = 8
RANKS = 2
VERL_MICRO_BATCH = 8
WIDTH = 12
FEATURES = 10
VERL_GRAD_CLIP = 1.0
REFERENCE_GRADIENT_NORMS = (0.5, 4.0)
"""The reference's unclipped gradient norm on mini-batch 0 and 1: below and above its clip."""
PACS_MICRO_BATCH = 5
"""pacs's micro-batch size here: any value gives pacs's update, none is the paper's 8."""


def rollout(seed: int = 0) -> dict[str, torch.Tensor]:
    """One step's float64 rollout data: rewards (B,), response_mask, old log-probs, log-ratios z,
    rollout values, value offsets u and features X, Y (B, W[, D]); every group holds both rewards."""
    generator = torch.Generator().manual_seed(seed)
    rows = PROMPTS * GROUP_SIZE

    def normal(*shape, std=1.0):
        return std * torch.randn(*shape, generator=generator, dtype=torch.float64)

    rewards = (torch.rand(rows, generator=generator) < 0.5).double()
    rewards.view(PROMPTS, GROUP_SIZE)[:, :2] = torch.tensor([0.0, 1.0], dtype=torch.float64)
    lengths = torch.randint(1, WIDTH + 1, (rows,), generator=generator)
    mask = (torch.arange(WIDTH) < lengths[:, None]).double()
    return {
        "rewards": rewards,
        "response_mask": mask,
        "old_logprobs": -normal(rows, WIDTH).abs(),
        "log_ratios": normal(rows, WIDTH, std=0.8),
        "values": normal(rows, WIDTH, std=0.5),
        "value_offsets": normal(rows, WIDTH, std=0.7),
        "policy_features": normal(rows, WIDTH, FEATURES),
        "critic_features": normal(rows, WIDTH, FEATURES),
    }


DATA = rollout()


def mini_batches() -> list[slice]:
    rows = MINI_BATCH_PROMPTS * GROUP_SIZE
    return [slice(start, start + rows) for start in range(0, PROMPTS * GROUP_SIZE, rows)]


def logprobs_of(theta, data, rows, scale):
    """(b, W) log-probs of `rows`: lp_old + z + s X θ (at θ = 0 the log-ratio is z)."""
    return data["old_logprobs"][rows] + data["log_ratios"][rows] + scale * data["policy_features"][rows] @ theta


def values_of(phi, data, rows, scale):
    """(b, W) critic values of `rows`: V_old + u + s Y φ."""
    return data["values"][rows] + data["value_offsets"][rows] + scale * data["critic_features"][rows] @ phi


# --- the reference: the paper's verl update, from its formulas ---------------------------------


def reference_advantages(data: dict[str, torch.Tensor], algorithm: str) -> torch.Tensor:
    """GRPO: (R − mean) / (std + 1e-6) per group (std unbiased), per row. PPO at γ = λ = 1:
    Â_t = R − V_t on response tokens, whitened over every response token of the step
    ((Â − μ) / sqrt(var + 1e-8), var unbiased)."""
    rewards, mask = data["rewards"], data["response_mask"]
    if algorithm == "grpo":
        grouped = rewards.view(-1, GROUP_SIZE)
        return ((grouped - grouped.mean(-1, keepdim=True)) / (grouped.std(-1, keepdim=True) + 1e-6)).reshape(-1)
    raw = rewards[:, None] - data["values"]
    tokens = raw[mask.bool()]
    return torch.where(mask.bool(), (raw - tokens.mean()) / torch.sqrt(tokens.var() + 1e-8), 0.0)


def reference_actor_losses(logprobs, rows, data, advantages):
    """Per-token dual-clipped surrogate, clip 0.2, dual clip 3."""
    token_advantages = advantages[rows] if advantages.dim() == 2 else advantages[rows, None].expand(-1, WIDTH)
    ratio = torch.exp(logprobs - data["old_logprobs"][rows])
    losses = torch.maximum(-token_advantages * ratio, -token_advantages * ratio.clamp(0.8, 1.2))
    return torch.where(token_advantages < 0, torch.minimum(losses, -3.0 * token_advantages), losses)


def reference_critic_losses(values, rows, data):
    """Per-token clipped value loss, clip 0.5, returns G = R (γ = λ = 1), no ½."""
    returns = data["rewards"][rows, None]
    clipped = data["values"][rows] + (values - data["values"][rows]).clamp(-0.5, 0.5)
    return torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)


def reference_gradient(parameter, mini_batch: slice, per_token_losses) -> torch.Tensor:
    """The unclipped gradient verl accumulates for one mini-batch: each rank's share in
    micro-batches of 8, Σ m ℓ / W per micro-batch, / accumulation steps, mean over ranks.
    `per_token_losses(rows)` gives (b, W) losses of the rows `rows`, with gradient."""
    rows_per_rank = (mini_batch.stop - mini_batch.start) // RANKS
    accumulation = rows_per_rank // VERL_MICRO_BATCH
    rank_gradients = []
    for rank in range(RANKS):
        rank_start = mini_batch.start + rank * rows_per_rank
        gradient = torch.zeros_like(parameter)
        for micro_start in range(rank_start, rank_start + rows_per_rank, VERL_MICRO_BATCH):
            rows = slice(micro_start, micro_start + VERL_MICRO_BATCH)
            losses = per_token_losses(rows)
            micro_loss = (losses * DATA["response_mask"][rows]).sum() / losses.shape[-1]
            (micro_gradient,) = torch.autograd.grad(micro_loss / accumulation, parameter)
            gradient += micro_gradient
        rank_gradients.append(gradient)
    return torch.stack(rank_gradients).mean(0)


def clipped(gradient: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Norm clipping as torch's clip_grad_norm_: g · min(1, max_norm / (‖g‖ + 1e-6))."""
    return gradient * min(1.0, max_norm / (float(gradient.norm()) + 1e-6))


def calibrated_scales(per_token_losses_at_scale) -> list[float]:
    """The scale s of each mini-batch that makes the reference's unclipped gradient norm the
    mini-batch's entry of REFERENCE_GRADIENT_NORMS (the gradient is linear in s)."""
    parameter = torch.zeros(FEATURES, dtype=torch.float64, requires_grad=True)
    scales = []
    for mini_batch, target in zip(mini_batches(), REFERENCE_GRADIENT_NORMS):
        gradient = reference_gradient(parameter, mini_batch, lambda rows: per_token_losses_at_scale(parameter, rows, 1.0))
        scales.append(target / float(gradient.norm()))
    return scales


# --- pacs: the config's algorithm, through its update contract ---------------------------------


def paper_algorithm(config: Config):
    return config.algorithm.build(group_size=config.rollout.n, max_response_length=WIDTH)


def pacs_step_terms(algorithm) -> dict[str, torch.Tensor]:
    step = {name: DATA[name] for name in ("rewards", "response_mask", "values")}
    return {**step, "old_logprobs": DATA["old_logprobs"], **algorithm.prepare_step(step)}


def pacs_clipped_gradient(parameter, mini_batch, row_terms, micro_loss, max_norm) -> torch.Tensor:
    """Micro-batches of PACS_MICRO_BATCH rows back-propagate `micro_loss(rows, row_terms of rows)`;
    the summed gradient is clipped as the trainer clips it."""
    parameter.grad = None
    for micro_start in range(mini_batch.start, mini_batch.stop, PACS_MICRO_BATCH):
        rows = slice(micro_start, min(micro_start + PACS_MICRO_BATCH, mini_batch.stop))
        local = slice(rows.start - mini_batch.start, rows.stop - mini_batch.start)
        micro_loss(rows, {name: value[local] for name, value in row_terms.items()}).backward()
    torch.nn.utils.clip_grad_norm_([parameter], max_norm)
    return parameter.grad.detach().clone()


def rows_of(tensors: dict[str, torch.Tensor], rows: slice) -> dict[str, torch.Tensor]:
    return {name: value[rows] for name, value in tensors.items()}


def assert_equal_up_to_one_factor(pacs_gradients, reference_gradients) -> None:
    """Each pacs gradient is factor · the reference's, with one factor for every mini-batch."""
    factors = []
    for pacs, reference in zip(pacs_gradients, reference_gradients):
        factor = float(pacs @ reference / (reference @ reference))
        torch.testing.assert_close(pacs, factor * reference, rtol=1e-9, atol=1e-12)
        factors.append(factor)
    assert factors == pytest.approx([factors[0]] * len(factors), rel=1e-9), f"factor per mini-batch: {factors}"


@pytest.mark.parametrize("path", PAPER_BASELINE_CONFIGS, ids=lambda path: path.stem)
def test_paper_config_clips_the_actor_gradient_where_the_paper_did(path):
    config = load_config(str(path))
    algorithm = paper_algorithm(config)
    terms = pacs_step_terms(algorithm)
    advantages = reference_advantages(DATA, config.algorithm.name)
    scales = calibrated_scales(
        lambda theta, rows, scale: reference_actor_losses(logprobs_of(theta, DATA, rows, scale), rows, DATA, advantages)
    )
    theta = torch.zeros(FEATURES, dtype=torch.float64, requires_grad=True)
    pacs_gradients, reference_gradients = [], []
    for mini_batch, scale in zip(mini_batches(), scales):
        minibatch_terms = rows_of(terms, mini_batch)
        row_terms, _ = algorithm.prepare_update(
            minibatch_terms,
            lambda: logprobs_of(theta, DATA, mini_batch, scale).detach(),
            policy_is_rollout_policy=False,
            totals=MiniBatchTotals.of(minibatch_terms["response_mask"]),
        )

        def micro_loss(rows, micro_row_terms):
            return algorithm.micro_batch_loss(logprobs_of(theta, DATA, rows, scale), rows_of(terms, rows), micro_row_terms)

        pacs_gradients.append(pacs_clipped_gradient(theta, mini_batch, row_terms, micro_loss, config.train.grad_clip))
        reference = reference_gradient(
            theta, mini_batch, lambda rows: reference_actor_losses(logprobs_of(theta, DATA, rows, scale), rows, DATA, advantages)
        )
        reference_gradients.append(clipped(reference, VERL_GRAD_CLIP))
    assert_equal_up_to_one_factor(pacs_gradients, reference_gradients)


@pytest.mark.parametrize("path", PAPER_PPO_CONFIGS, ids=lambda path: path.stem)
def test_paper_ppo_config_clips_the_critic_gradient_where_the_paper_did(path):
    config = load_config(str(path))
    algorithm = paper_algorithm(config)
    terms = pacs_step_terms(algorithm)
    scales = calibrated_scales(lambda phi, rows, scale: reference_critic_losses(values_of(phi, DATA, rows, scale), rows, DATA))
    phi = torch.zeros(FEATURES, dtype=torch.float64, requires_grad=True)
    critic_clip = config.critic.grad_clip or config.train.grad_clip
    pacs_gradients, reference_gradients = [], []
    for mini_batch, scale in zip(mini_batches(), scales):
        minibatch_terms = rows_of(terms, mini_batch)
        row_terms = algorithm.critic_row_terms(minibatch_terms, totals=MiniBatchTotals.of(minibatch_terms["response_mask"]))

        def micro_loss(rows, micro_row_terms):
            return algorithm.critic_micro_batch_loss(values_of(phi, DATA, rows, scale), rows_of(terms, rows), micro_row_terms)

        pacs_gradients.append(pacs_clipped_gradient(phi, mini_batch, row_terms, micro_loss, critic_clip))
        reference = reference_gradient(
            phi, mini_batch, lambda rows: reference_critic_losses(values_of(phi, DATA, rows, scale), rows, DATA)
        )
        reference_gradients.append(clipped(reference, VERL_GRAD_CLIP))
    assert_equal_up_to_one_factor(pacs_gradients, reference_gradients)


def test_the_rollout_has_tokens_beyond_the_dual_clip_and_outside_the_value_clip():
    """What lets the tests above fail: tokens with A < 0 and ratio > 3 (where the dual clip
    changes the loss) and values more than 0.5 from their rollout value."""
    mask = DATA["response_mask"].bool()
    negative = reference_advantages(DATA, "grpo")[:, None] < 0
    assert (mask & negative & (DATA["log_ratios"].exp() > 3)).sum() >= 10
    assert (mask & (DATA["value_offsets"].abs() > 0.5)).sum() >= 10


# --- the two kinds of comparison in `pacs compare` -----------------------------------------------

FIDELITY_KEYS = ("dual_clip", "loss_agg", "loss_scale", "critic_loss_agg", "critic_loss_scale")


@pytest.mark.parametrize("path", PAPER_PPO_CONFIGS, ids=lambda path: path.stem)
def test_compare_paper_baselines_switch_sets_what_the_paper_configs_set(path):
    paper = load_config(str(path))
    switched = load_config("builtin:compare-demo", PAPER_BASELINES_OVERRIDES, algorithm="ppo")
    assert {key: getattr(switched.algorithm, key) for key in FIDELITY_KEYS} == {
        key: getattr(paper.algorithm, key) for key in FIDELITY_KEYS
    }
    assert (switched.critic.grad_clip or switched.train.grad_clip) == paper.critic.grad_clip


def test_compare_demo_normalises_every_method_alike():
    """Without the switch, every loss is mean-normalised and clipped at train.grad_clip, as PACS's."""
    config = load_config("builtin:compare-demo", algorithm="ppo")
    assert (config.algorithm.loss_scale, config.algorithm.critic_loss_scale, config.algorithm.dual_clip) == (1.0, 1.0, None)


def test_cli_compare_paper_baselines_flag_passes_the_switch_before_the_users_overrides(monkeypatch):
    calls = []
    monkeypatch.setattr(compare_module, "run_comparison", lambda *args, **kwargs: calls.append(kwargs["overrides"]))
    main(["compare", "--config", "builtin:compare-demo", "--out", "unused", "--paper-baselines", "train.steps=2"])
    main(["compare", "--config", "builtin:compare-demo", "--out", "unused", "train.steps=2"])
    assert calls == [[*PAPER_BASELINES_OVERRIDES, "train.steps=2"], ["train.steps=2"]]
