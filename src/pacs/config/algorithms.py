"""The `algorithm` section: one class per algorithm, picked by `algorithm.name`; each class's fields
are its algorithm's options, and it builds the algorithm (`BaseAlgorithmConfig.build`).

`algorithm.name` is a built-in's name, looked up in the registry `ALGORITHM_CONFIGS` (each built-in
section registers itself with `register_algorithm`), or an import path ``package.module:Class`` to a
user's section, a subclass of `BaseAlgorithmConfig` whose `builds` is the user's algorithm
(`plugin_section`, imported as `reward.function` is, by `pacs.plugins`; docs/algorithms/custom.md).
Either way the section is validated, its options checked against the algorithm's constructor, and
a user's algorithm built once, before any model loads.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Protocol, Union

from pydantic import (
    Discriminator,
    Field,
    SerializeAsAny,
    Tag,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)

from pacs.algos.aggregation import LossAggregation
from pacs.algos.base import CRITIC_METHODS, NEEDS, Algorithm
from pacs.algos.cispo import CISPO
from pacs.algos.dapo import DAPO
from pacs.algos.dr_grpo import DrGRPO
from pacs.algos.grpo import GRPO
from pacs.algos.gspo import GSPO
from pacs.algos.importance import ROLLOUT_IS_LEVELS, RolloutIsLevel, RolloutIsMode, check_rollout_is
from pacs.algos.kl import KlEstimator, check_kl_penalty
from pacs.algos.pacs import PACS, Estimator, Proxy, Reference, Weighting
from pacs.algos.pg import ClippedPolicyGradient
from pacs.algos.ppo import PPO
from pacs.algos.rloo import RLOO
from pacs.config.base import Section
from pacs.config.sections import DataConfig, RolloutConfig
from pacs.plugins import import_function


class RunSettings(Protocol):
    """What an algorithm's `problems` reads of the run's configuration (`pacs.config.run.Config`)."""

    @property
    def rollout(self) -> RolloutConfig: ...

    @property
    def data(self) -> DataConfig: ...


class BaseAlgorithmConfig(Section):
    """What every algorithm's section holds; `algorithm.name` picks the section (`AlgorithmConfig`):
    a built-in's name, or the import path `package.module:Class` of a user's subclass of this class
    (docs/algorithms/custom.md), whose options are the fields below and its own. A section builds
    its algorithm (`build`) with its fields as the keywords of the constructor in `builds`; a
    constructor that does not take one of the options below takes only its default."""

    builds: ClassVar[Callable[..., Algorithm]]
    """The algorithm class (`pacs.algos.base.Algorithm`) that this section configures, called as
    ``builds(group_size, max_response_length=..., **options)``."""

    name: str
    """The algorithm: a built-in's name, or `package.module:Class`, a user's section; each takes the
    options of its own section, and refuses the others'."""
    kl_coef: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Weight of the KL penalty to the frozen initial model; 0 loads no reference."""
    kl_estimator: KlEstimator = "k3"
    """Per-token KL estimator used as the loss: k2 follows the gradient of KL(π_θ‖π_ref), k3 (GRPO's
    default) that of KL(π_ref‖π_θ); k1's expected gradient is zero, so it is refused with kl_coef > 0
    unless the penalty goes into the reward (`kl_in_reward` of every algorithm but pacs)."""
    entropy_coef: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Weight of the entropy bonus."""
    loss_agg: LossAggregation = "seq-mean-token-sum-norm"
    """How per-token losses are aggregated into a mini-batch's loss (`pacs.algos.aggregation.aggregation_weights`):
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
    response, the product of its tokens' ratios, for every token of it; `geometric_mean`, one per
    response, that product's per-token geometric mean (AReaL's and OpenRLHF's sequence-level
    masks), which stays near 1 for long responses. pacs takes `sequence` or `geometric_mean`."""
    rollout_is_floor: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    """The bottom F of mask mode's kept range [F, C] (rollout_is_mode=mask only); None: 1/C."""
    overlong_buffer: int = Field(0, ge=0)
    """DAPO's overlong reward shaping, for every algorithm: over the last `overlong_buffer` tokens
    before data.max_response_length a response's reward falls linearly by up to
    `overlong_penalty` (`pacs.algos.shaping.overlong_penalty`; PACS keeps its label in [0, 1]); 0: off."""
    overlong_penalty: float = Field(1.0, ge=0, allow_inf_nan=False)
    """The largest overlong penalty, reached at the maximum length (DAPO's rewards are ±1: 0.5 here
    gives its relative penalty on 0/1 rewards)."""

    def build(self, group_size: int, max_response_length: int) -> Algorithm:
        """The algorithm, for groups of `group_size` responses of at most `max_response_length` tokens, given
        every option its constructor takes (`constructor_keywords`)."""
        options = self.model_dump(exclude={"name"})
        taken = constructor_keywords(self.builds)
        if taken is not None:
            options = {key: value for key, value in options.items() if key in taken}
        return self.builds(group_size, max_response_length=max_response_length, **options)

    def uses_reference(self) -> bool:
        """Whether the algorithm computes log-probs of the reference model (the KL penalty's)."""
        return self.kl_coef > 0

    def problems(self, config: RunSettings) -> list[str]:
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
                self.rollout_is_cap,
                self.rollout_is_mode,
                self.rollout_is_level,
                self.rollout_is_floor,
                levels=getattr(self.builds, "rollout_is_levels", ROLLOUT_IS_LEVELS),  # AlgorithmBase's default
            )
        except ValueError as error:
            found.append(f"algorithm.{error}")
        if self.overlong_buffer > config.data.max_response_length:
            found.append(
                f"algorithm.overlong_buffer={self.overlong_buffer} exceeds data.max_response_length="
                f"{config.data.max_response_length}: the penalty grows over the last overlong_buffer tokens before "
                "the maximum length; set at most the maximum (0: no shaping)"
            )
        if ALGORITHM_CONFIGS.get(self.name) is not type(self):
            found += self._plugin_problems(config)
        return found

    def _plugin_problems(self, config: RunSettings) -> list[str]:
        """What keeps a user's section from building its algorithm: an option given that its
        constructor does not take, a constructor that refuses its options, or an object built that is
        not an algorithm (a `needs` outside `pacs.algos.base.NEEDS`, "values" without the critic's
        methods). Built here, once, so that the run fails before any model loads."""
        algorithm_class = getattr(self.builds, "__name__", repr(self.builds))
        taken = set(type(self).model_fields) if (keywords := constructor_keywords(self.builds)) is None else keywords
        own = set(type(self).model_fields) - set(BaseAlgorithmConfig.model_fields)
        found = [
            f"algorithm.{key}: an option of algorithm.name='{self.name}' that {algorithm_class}() takes no keyword for; "
            f"add `{key}` to its constructor's keywords, or remove the field"
            for key in sorted(own - taken)
        ]
        for key in BaseAlgorithmConfig.model_fields.keys() - taken - {"name"}:
            value, default = getattr(self, key), type(self).model_fields[key].default
            if value != default:
                found.append(
                    f"algorithm.{key}={value!r} with algorithm.name='{self.name}': {algorithm_class}() takes no {key} "
                    f"keyword, so it implements only the default; leave {key}={default!r} (or take {key} in its constructor)"
                )
        if found:
            return found
        try:
            algorithm = self.build(config.rollout.n, config.data.max_response_length)
        except (TypeError, ValueError) as error:
            return [f"algorithm.name='{self.name}': {algorithm_class}(...) refused these options: {error}"]
        needs = getattr(algorithm, "needs", None)
        if not isinstance(needs, frozenset | set) or not needs <= NEEDS:
            return [
                f"algorithm.name='{self.name}': {algorithm_class}.needs={needs!r} must be a frozenset of "
                f"{', '.join(sorted(NEEDS))} (pacs.algos.base.Algorithm)"
            ]
        missing = [method for method in CRITIC_METHODS if not callable(getattr(algorithm, method, None))]
        if "values" in needs and missing:
            return [
                f"algorithm.name='{self.name}': {algorithm_class} needs \"values\" (a critic) but has no "
                f"{', '.join(missing)} (pacs.algos.base.CriticObjective)"
            ]
        return []

    def _kl_problems(self, *, in_reward: bool) -> list[str]:
        try:
            check_kl_penalty(self.kl_coef, self.kl_estimator, in_reward=in_reward)
        except ValueError as error:
            return [f"algorithm.{error}"]
        return []


ALGORITHM_CONFIGS: dict[str, type[BaseAlgorithmConfig]] = {}
"""The registry of built-in algorithms, `algorithm.name` -> its section (`register_algorithm`), in the
order they are listed everywhere. Every list of algorithms derives from it: the choices of
`algorithm.name` and of `pacs compare`, the configuration reference, the tests' cases (exactness on
2 processes, end-to-end runs) and the documentation's pages, whose presence a test checks."""


def register_algorithm(section: type[BaseAlgorithmConfig]) -> type[BaseAlgorithmConfig]:
    """Add a built-in's `section` to `ALGORITHM_CONFIGS` under the default of its `name` field (a
    `Literal` of one value); used as a class decorator."""
    name = section.model_fields["name"].default
    if not isinstance(name, str) or ":" in name or name in ALGORITHM_CONFIGS:
        raise ValueError(f"{section.__name__}: a built-in's name must be a new name without ':', got {name!r}")
    ALGORITHM_CONFIGS[name] = section
    return section


@register_algorithm
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
    response scales its whole gradient coefficient: `sequence`, the product of its tokens' ratios;
    `geometric_mean`, that product's per-token geometric mean, near 1 for long responses (its
    effective sample size, rollout_is/ess, stays high where the product's collapses)."""
    pacs_reference: Reference = "rollout"
    """The reference π_ref of the logratio proxy: `rollout`, the policy that sampled the step (the
    authors' code: ψ = 0 on a step's first update); `fixed`, the frozen reference model, the
    initial policy (the paper's text), reset to the current policy every train.reference_reset_every
    steps with the optimizer's state (train.reference_reset_optimizer)."""

    def uses_reference(self) -> bool:
        return super().uses_reference() or self.pacs_reference == "fixed"

    def problems(self, config: RunSettings) -> list[str]:
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

    builds: ClassVar[type[ClippedPolicyGradient]]

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

    def problems(self, config: RunSettings) -> list[str]:
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


@register_algorithm
class GrpoConfig(ClippedPolicyGradientConfig):
    builds = GRPO

    name: Literal["grpo"] = "grpo"
    """GRPO: group-normalised outcome rewards as every token's advantage (`pacs.algos.grpo`)."""
    norm_by_std: bool = True
    """Divide group-centred rewards by the group's standard deviation."""


@register_algorithm
class RlooConfig(ClippedPolicyGradientConfig):
    builds = RLOO

    name: Literal["rloo"] = "rloo"
    """RLOO: each reward minus the mean of the others to its prompt as the advantage (`pacs.algos.rloo`)."""


@register_algorithm
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


@register_algorithm
class DrGrpoConfig(ClippedPolicyGradientConfig):
    builds = DrGRPO

    name: Literal["dr_grpo"] = "dr_grpo"
    """Dr. GRPO: group-centred rewards (no std division) and a constant token-sum divisor
    (`pacs.algos.dr_grpo`)."""


@register_algorithm
class DapoConfig(ClippedPolicyGradientConfig):
    builds = DAPO

    name: Literal["dapo"] = "dapo"
    """DAPO's objective: GRPO's advantages, clip-higher, token-level loss (`pacs.algos.dapo`); its
    dynamic sampling is rollout.dynamic_sampling, its overlong shaping algorithm.overlong_buffer."""
    clip_high: float = Field(0.28, gt=0, allow_inf_nan=False)
    """ε_high: the probability ratio is clipped above at 1 + clip_high (DAPO's clip-higher: 0.28)."""
    loss_agg: LossAggregation = "token-mean"
    """How per-token losses are aggregated (DAPO: token-mean, every token of the mini-batch alike)."""


@register_algorithm
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


@register_algorithm
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


PLUGIN_TAG = "package.module:Class"
"""What selects a user's section in `AlgorithmConfig` (any `algorithm.name` with a colon)."""


def constructor_keywords(algorithm_class: Callable[..., Algorithm]) -> set[str] | None:
    """The names of the parameters of `algorithm_class(group_size, max_response_length=..., **options)`: the
    options of a section it takes; None when it takes ``**options`` (every option)."""
    parameters = inspect.signature(algorithm_class).parameters.values()
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        return None
    return {parameter.name for parameter in parameters}


def plugin_section(spec: str) -> type[BaseAlgorithmConfig]:
    """The user's section that `algorithm.name` = `spec` (``package.module:Class``) names, imported
    by `pacs.plugins` as `reward.function` is; ValueError naming `spec` and what is wrong: the
    module or the attribute missing, or an object that is not an algorithm's section (a subclass of
    `BaseAlgorithmConfig` whose `builds` has the protocol's `prepare_update` and `micro_batch_loss`)."""
    try:
        found = import_function(spec, kind="class")
    except ValueError as error:
        raise ValueError(f"algorithm.name={spec!r}: {error}") from None
    how = "a subclass of pacs.config.BaseAlgorithmConfig whose `builds` is the algorithm class (docs/algorithms/custom.md)"
    if not (isinstance(found, type) and issubclass(found, BaseAlgorithmConfig)):
        what = f"the class {found.__name__}" if isinstance(found, type) else f"a {type(found).__name__}"
        raise ValueError(f"algorithm.name={spec!r} is not an algorithm's configuration: it names {what}; name {how}")
    builds = getattr(found, "builds", None)
    missing = [method for method in ("prepare_update", "micro_batch_loss") if not callable(getattr(builds, method, None))]
    if builds is None or missing:
        got = (
            "sets no `builds`"
            if builds is None
            else f"builds {getattr(builds, '__name__', builds)}, which has no {', '.join(missing)}"
        )
        raise ValueError(
            f"algorithm.name={spec!r} is not an algorithm: {found.__name__} {got}; its `builds` must be an algorithm "
            "class (pacs.algos.base.Algorithm: subclass pacs.algos.base.AlgorithmBase and write prepare_update and "
            "micro_batch_loss)"
        )
    return found


def _validate_plugin(value: Any, handler: ValidatorFunctionWrapHandler) -> BaseAlgorithmConfig:
    """A user's section (`plugin_section`) from the `algorithm` mapping `value`; an option it does
    not have is refused with its valid options."""
    if isinstance(value, BaseAlgorithmConfig) or not isinstance(value, dict):
        return handler(value)
    spec = str(value.get("name"))
    section = plugin_section(spec)
    for key in value:
        if key not in section.model_fields:
            close = difflib.get_close_matches(str(key), list(section.model_fields), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"algorithm.{key}: unknown option of algorithm.name={spec!r}{hint}; its options: {', '.join(section.model_fields)}"
            )
    return section.model_validate(value)


def algorithm_name(section: object) -> object:
    """The `name` of an `algorithm` section, given (a mapping) or validated; pacs when absent."""
    if isinstance(section, dict):
        return section.get("name", PacsConfig.model_fields["name"].default)
    return getattr(section, "name", None)


def algorithm_tag(section: object) -> object:
    """What selects the member of `AlgorithmConfig`: the built-in's name, or `PLUGIN_TAG` for an
    import path."""
    name = algorithm_name(section)
    return PLUGIN_TAG if isinstance(name, str) and ":" in name else name


if TYPE_CHECKING:  # a union built from the registry at import: a section of this class to a type checker
    AlgorithmConfig = BaseAlgorithmConfig
else:
    AlgorithmConfig = Annotated[
        Union[
            tuple(Annotated[section, Tag(name)] for name, section in ALGORITHM_CONFIGS.items())
            + (Annotated[SerializeAsAny[BaseAlgorithmConfig], WrapValidator(_validate_plugin), Tag(PLUGIN_TAG)],)
        ],
        Discriminator(algorithm_tag),
    ]
"""The `algorithm` section: the one of `ALGORITHM_CONFIGS` that `name` picks (pacs when absent), or
the user's section that an import path names (`plugin_section`)."""
