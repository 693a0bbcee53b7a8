"""A run's whole configuration, `Config`: every section, and the checks of combinations across them
(one ValueError listing every problem).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    model_validator,
)

from pacs.config.algorithms import ALGORITHM_CONFIGS, DEFAULT_ALGORITHM, AlgorithmConfig
from pacs.config.base import Section
from pacs.config.sections import (
    ASYNC_IS_CAP,
    CriticConfig,
    DataConfig,
    EvalConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
    TrainConfig,
)


class Config(Section):
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
    algorithm: AlgorithmConfig = ALGORITHM_CONFIGS[DEFAULT_ALGORITHM].model_validate({})
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
        problems += self._tool_problems()
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

    def _tool_problems(self) -> list[str]:
        """What multi-turn rollouts (rollout.tools) do not run with yet."""
        tools = self.rollout.tools
        if tools is None:
            return []
        problems = []
        if self.rollout.engine == "vllm" and self.rollout.vllm.tensor_parallel_size > 1:
            problems.append(
                f"rollout.tools={tools!r} with rollout.vllm.tensor_parallel_size={self.rollout.vllm.tensor_parallel_size}: "
                "every rank of a tensor-parallel engine runs the tool itself, and a program whose output differs between "
                "runs (time, randomness, a time-out) would feed them different prompts; set tensor_parallel_size=1"
            )
        if self.rollout.max_staleness:
            problems.append(
                f"rollout.tools={tools!r} with rollout.max_staleness={self.rollout.max_staleness}: the generator "
                "process of asynchronous generation does not call tools; set rollout.max_staleness=0"
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
