"""The options of an algorithm, as a configuration section: `Section` (the base of every section
of a run's configuration, these and `pacs.config`'s), `BaseAlgorithmConfig` (the options every
algorithm shares, and how a section builds its algorithm), `ClippedPolicyGradientConfig` (the
clipped baselines' options), and the checks that a user's section (`algorithm.name` an import path)
can build its algorithm before any model loads.

A built-in algorithm's section is a subclass of one of these written in its own module beside its
math (`pacs.algos.gspo.GspoConfig` is the model); `pacs.config.algorithms.registry` finds it there.
They live in `pacs.algos`, below `pacs.config`, so that a section can sit beside the algorithm it
builds: they import pydantic and `pacs.algos`' own modules only, and read the rest of a run's
configuration through `RunSettings`, a description of its shape.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from typing import ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from pacs.algos.aggregation import LossAggregation
from pacs.algos.base import CRITIC_METHODS, NEEDS, Algorithm
from pacs.algos.importance import ROLLOUT_IS_LEVELS, RolloutIsLevel, RolloutIsMode, check_rollout_is
from pacs.algos.kl import KlEstimator, check_kl_penalty
from pacs.algos.pg import ClippedPolicyGradient


class Section(BaseModel):
    """A section of the configuration: its fields' docstrings are their descriptions (`model_fields`)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)

    @field_validator("*", mode="before")
    @classmethod
    def _refuse_booleans_for_numbers(cls, value: object, info: ValidationInfo) -> object:
        """pydantic would read true as 1; YAML reads yes/no/on/off as booleans."""
        if isinstance(value, bool) and info.field_name and _is_numeric(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"expected a number, got {value!r} (YAML reads yes/no/on/off/true/false as booleans)")
        return value


def _is_numeric(annotation: object) -> bool:
    """Whether a field of this type holds an int or a float (``float | None`` included)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_is_numeric(member) for member in typing.get_args(annotation))
    return annotation in (int, float)


def is_import_path(name: object) -> bool:
    """Whether `algorithm.name` = `name` names a user's section (``package.module:Class``) rather
    than a built-in (whose names, its modules' names, hold no colon)."""
    return isinstance(name, str) and ":" in name


class RolloutSettings(Protocol):
    """What a section's `problems` reads of the run's `rollout` section (`pacs.config.sections.RolloutConfig`)."""

    @property
    def engine(self) -> str: ...

    @property
    def n(self) -> int: ...

    @property
    def max_staleness(self) -> int: ...


class DataSettings(Protocol):
    """What a section's `problems` reads of the run's `data` section (`pacs.config.sections.DataConfig`)."""

    @property
    def max_response_length(self) -> int: ...


class RunSettings(Protocol):
    """What an algorithm's `problems` reads of the run's configuration (`pacs.config.run.Config`),
    described here by shape so that the sections, below `pacs.config`, need not import it."""

    @property
    def rollout(self) -> RolloutSettings: ...

    @property
    def data(self) -> DataSettings: ...


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
        if is_import_path(self.name):
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


def constructor_keywords(algorithm_class: Callable[..., Algorithm]) -> set[str] | None:
    """The names of the parameters of `algorithm_class(group_size, max_response_length=..., **options)`: the
    options of a section it takes; None when it takes ``**options`` (every option)."""
    parameters = inspect.signature(algorithm_class).parameters.values()
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        return None
    return {parameter.name for parameter in parameters}
