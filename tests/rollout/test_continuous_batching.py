"""The transformers engine with `continuous_batching`: transformers' continuous batching sampling
exactly what the engine's `generate` samples from (pure softmax(logits / T), the declared end
tokens), its log-probs those the trainer recomputes, reproducible by seed."""

from __future__ import annotations

import json

import pytest
import torch
from instruct_style import instruct_generation_config
from running import run

from pacs.config import load_config
from pacs.models.loading import load_causal_lm, load_tokenizer
from pacs.rollout import hf
from pacs.rollout.base import SamplingParams
from pacs.rollout.continuous_batching import continuous_batching_on, generate_continuously
from pacs.rollout.hf import TransformersEngine
from pacs.train.batch import PolicyBatch
from pacs.train.logprobs import response_logprobs
from pacs.train.metrics import read_metrics
from pacs.train.trainer import train

PROMPTS = ["<|user|>What is 3+4?<|end|><|assistant|>", "<|user|>Hi<|end|><|assistant|>", "<|user|>12+7=<|end|><|assistant|>"]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tokenizer):
    model = load_causal_lm(str(tiny_model_dir), dtype="float64")
    return TransformersEngine(model, tokenizer, max_sequences_per_call=8, continuous_batching=True)


def prompt_ids(tokenizer):
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in PROMPTS]


def recomputed_logprobs(model, rollouts, temperature):
    batch = PolicyBatch.from_rollouts(rollouts, torch.zeros(len(rollouts.response_texts)), torch.float64)
    with torch.no_grad():
        return response_logprobs(model, batch, temperature=temperature), batch.response_mask.bool()


def test_auto_batches_continuously_on_cuda_only():
    assert continuous_batching_on("auto", torch.device("cuda", 0))
    assert not continuous_batching_on("auto", torch.device("cpu"))
    assert continuous_batching_on(True, torch.device("cpu")) and not continuous_batching_on(False, torch.device("cuda"))


def test_the_n_samples_of_a_prompt_are_adjacent_rows_of_that_prompt(engine, tokenizer):
    rollouts = engine.generate(prompt_ids(tokenizer), SamplingParams(n=3, max_new_tokens=6))
    assert rollouts.response_ids.shape[0] == 9 and rollouts.group_size == 3
    for row in range(9):
        assert rollouts.prompt_ids[row][rollouts.prompt_mask[row].bool()].tolist() == prompt_ids(tokenizer)[row // 3]


def test_sampled_logprobs_are_those_the_trainer_recomputes(engine, tokenizer):
    """The same check as the `generate` engine's (tests/rollout/test_rollout.py), at T = 0.7."""
    torch.manual_seed(3)
    params = SamplingParams(n=4, temperature=0.7, max_new_tokens=12, return_logprobs=True)
    rollouts = engine.generate(prompt_ids(tokenizer) * 2, params)
    recomputed, mask = recomputed_logprobs(engine.model, rollouts, 0.7)
    assert mask.sum() > 100
    assert torch.allclose(recomputed[mask], rollouts.response_logprobs[mask].double(), atol=1e-5)


def test_the_same_seed_draws_the_same_samples_and_another_seed_others(engine, tokenizer):
    params = SamplingParams(n=4, max_new_tokens=10, return_logprobs=True)
    draws = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        draws.append(engine.generate(prompt_ids(tokenizer) * 2, params))
    assert torch.equal(draws[0].response_ids, draws[1].response_ids)
    assert torch.equal(draws[0].response_logprobs, draws[1].response_logprobs)
    assert not torch.equal(draws[0].response_ids, draws[2].response_ids)


def test_greedy_decoding_decodes_what_generate_decodes(engine, tokenizer):
    padded = TransformersEngine(engine.model, tokenizer, max_sequences_per_call=8)
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=10)
    assert (
        engine.generate(prompt_ids(tokenizer), params).response_texts
        == padded.generate(prompt_ids(tokenizer), params).response_texts
    )


@pytest.fixture(scope="module")
def instruct_style_engine(tiny_model_dir, tokenizer):
    """The tiny model with an instruct model's generation defaults (a repetition penalty, its own
    temperature / top-p / top-k) and two end-of-turn tokens, batching continuously."""
    model = load_causal_lm(str(tiny_model_dir), dtype="float64")
    model.generation_config = instruct_generation_config(tokenizer)
    return TransformersEngine(model, tokenizer, continuous_batching=True)


def test_the_models_generation_defaults_do_not_reshape_sampling(instruct_style_engine, tokenizer):
    torch.manual_seed(0)
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=24, return_logprobs=True)
    rollouts = instruct_style_engine.generate(prompt_ids(tokenizer) * 2, params)
    recomputed, mask = recomputed_logprobs(instruct_style_engine.model, rollouts, 1.0)
    assert mask.sum() > 100
    assert torch.allclose(recomputed[mask], rollouts.response_logprobs[mask].double(), atol=1e-5)
    assert instruct_style_engine.model.generation_config.repetition_penalty == 1.05


def test_a_response_ends_at_the_first_of_any_declared_end_token_or_at_the_cap(instruct_style_engine, tokenizer):
    end_ids = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|user|>")}
    torch.manual_seed(1)
    rollouts = instruct_style_engine.generate(prompt_ids(tokenizer) * 8, SamplingParams(n=4, max_new_tokens=16))
    lengths = rollouts.response_mask.sum(dim=1)
    assert (lengths >= 1).all() and (lengths <= 16).all()
    for ids, length in zip(rollouts.response_ids, lengths):
        assert not end_ids & set(ids[: length - 1].tolist())
    ended = lengths < 16
    last_tokens = rollouts.response_ids[torch.arange(len(lengths)), lengths - 1]
    assert set(last_tokens[ended].tolist()) == end_ids, "both end tokens should end some response"


def test_the_model_is_left_in_training_mode_with_its_attention_implementation(tiny_model_dir, tokenizer):
    model = load_causal_lm(str(tiny_model_dir), dtype="float32").train()
    model.set_attn_implementation("eager")  # the manager swaps eager for its paged version while it runs
    TransformersEngine(model, tokenizer, continuous_batching=True).generate(
        prompt_ids(tokenizer), SamplingParams(max_new_tokens=4)
    )
    assert model.training and model.config._attn_implementation == "eager"


def test_a_float32_model_under_bf16_autocast_samples_from_its_bf16_weights(tiny_model_dir, tokenizer):
    """The paged cache holds one dtype and the generation thread runs outside the caller's
    autocast: under bf16 autocast the engine generates with the weights in bf16 (what the trainer
    recomputes under autocast, up to bf16 rounding), and the float32 weights come back untouched."""
    model = load_causal_lm(str(tiny_model_dir), dtype="float32")
    before = {name: parameter.clone() for name, parameter in model.named_parameters()}
    engine = TransformersEngine(model, tokenizer, continuous_batching=True)
    params = SamplingParams(n=4, max_new_tokens=10, return_logprobs=True)
    torch.manual_seed(2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = engine.generate(prompt_ids(tokenizer) * 2, params)
        recomputed, mask = recomputed_logprobs(model, mixed, 1.0)
    torch.manual_seed(2)
    exact = engine.generate(prompt_ids(tokenizer) * 2, params)
    assert (recomputed[mask].float() - mixed.response_logprobs[mask]).abs().mean() < 0.05
    assert not torch.equal(mixed.response_logprobs, exact.response_logprobs), "the bf16 weights sampled"
    assert all(
        torch.equal(parameter, before[name]) and parameter.dtype == torch.float32 for name, parameter in model.named_parameters()
    )


@pytest.fixture
def continuous_calls(monkeypatch):
    """Every call of the engine's continuous batching, as the number of prompts it got."""
    calls: list[int] = []

    def counted(model, prompt_token_ids, *args):
        calls.append(len(prompt_token_ids))
        return generate_continuously(model, prompt_token_ids, *args)

    monkeypatch.setattr(hf, "generate_continuously", counted)
    return calls


@pytest.mark.slow
def test_training_and_validation_sample_continuously_when_asked(tmp_path, tiny_model_dir, continuous_calls):
    settings = [
        f"output_dir={tmp_path / 'run'}",
        f"model.path={tiny_model_dir}",
        "data.train=builtin:arithmetic?size=16",
        "data.val=builtin:arithmetic?size=4",
        "train.steps=2",
        "train.batch_size=4",
        "train.mini_batch_size=4",
        "rollout.n=2",
        "eval.n=2",
        "reward.num_workers=0",
        "rollout.hf.continuous_batching=true",
    ]
    train(load_config("builtin:demo", settings), show_progress=False)
    rows = read_metrics(tmp_path / "run")
    assert [row["step"] for row in rows] == [0, 1, 2] and all("val/arithmetic/pass@1" in rows[i] for i in (0, -1))
    assert continuous_calls == [4, 4, 4, 4], "the validation before training, two steps' rollouts, then the validation"


@pytest.mark.slow
def test_pacs_eval_samples_continuously_when_asked(tmp_path, tiny_model_dir, continuous_calls):
    arguments = ["--model", str(tiny_model_dir), "--data", "builtin:arithmetic?size=3", "--n", "2", "--out", str(tmp_path)]
    assert run(["eval", *arguments, "--max-tokens", "8", "--continuous-batching", "true"]) == 0
    assert continuous_calls == [3]
    assert json.loads((tmp_path / "eval_metrics.json").read_text())["settings"]["continuous_batching"] is True
