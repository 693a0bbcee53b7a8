"""The transformers rollout engine: grouped, EOS-terminated samples from the policy the trainer scores."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers
from instruct_style import instruct_generation_config
from transformers import GenerationConfig
from transformers.cache_utils import DynamicCache, StaticCache

from pacs.models.loading import load_causal_lm, load_tokenizer
from pacs.models.tiny import build_char_tokenizer, tiny_model_config
from pacs.rollout import hf
from pacs.rollout.base import SamplingParams
from pacs.rollout.hf import TransformersEngine
from pacs.train.batch import PolicyBatch
from pacs.train.logprobs import response_logprobs

PROMPTS = ["<|user|>What is 3+4?<|end|><|assistant|>", "<|user|>Hi<|end|><|assistant|>"]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    return TransformersEngine(load_causal_lm(str(tiny_model_dir), dtype="float64"), tokenizer, max_sequences_per_call=4)


def test_a_model_without_generate_is_refused_naming_its_class_and_the_causal_lm_loader():
    tokenizer = build_char_tokenizer()
    config = tiny_model_config(len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    backbone = transformers.Qwen2Model(config)
    with pytest.raises(TypeError, match=r"got Qwen2Model: load it with pacs\.models\.loading\.load_causal_lm"):
        TransformersEngine(backbone, tokenizer)


def prompt_ids(engine):
    return [engine.tokenizer(text, add_special_tokens=False)["input_ids"] for text in PROMPTS]


def test_rows_of_a_group_share_their_prompt(engine):
    rollouts = engine.generate(prompt_ids(engine), SamplingParams(n=3, max_new_tokens=6))
    assert rollouts.response_ids.shape[0] == 6 and len(rollouts.response_texts) == 6
    for row in range(6):
        real = rollouts.prompt_ids[row][rollouts.prompt_mask[row].bool()].tolist()
        assert real == prompt_ids(engine)[row // 3]


def test_response_mask_ends_at_the_first_end_token(engine):
    torch.manual_seed(0)
    rollouts = engine.generate(prompt_ids(engine) * 8, SamplingParams(n=4, max_new_tokens=12))
    eos = engine.tokenizer.eos_token_id
    lengths = rollouts.response_mask.sum(dim=1)
    assert (lengths >= 1).all() and (lengths <= 12).all()
    for ids, length in zip(rollouts.response_ids, lengths):
        assert eos not in ids[: length - 1].tolist()
        if length < 12:
            assert ids[length - 1] == eos
    assert (lengths < 12).any(), "a random tiny model should emit the end token within 12 tokens sometimes"


def test_a_preallocated_cache_samples_what_a_growing_cache_samples(engine, monkeypatch):
    """The tiny Qwen2 model generates on a `StaticCache`; with the growing cache instead, the
    same seed draws the same responses with the same log-probs."""
    params = SamplingParams(n=4, temperature=0.7, max_new_tokens=10, return_logprobs=True)
    torch.manual_seed(5)
    preallocated = engine.generate(prompt_ids(engine) * 3, params)
    monkeypatch.setattr(hf, "_preallocated", lambda cache, config, max_length: cache)
    torch.manual_seed(5)
    growing = engine.generate(prompt_ids(engine) * 3, params)
    assert torch.equal(preallocated.response_ids, growing.response_ids)
    assert torch.allclose(preallocated.response_logprobs, growing.response_logprobs, atol=1e-10)


def stops_after_one_to_eight_tokens(tokens: list[int]) -> bool:
    """A stop check decided by the row's own samples: after its first 1 + (first token mod 8) tokens."""
    return len(tokens) >= 1 + tokens[0] % 8


@pytest.mark.parametrize("n", [1, 4])
def test_a_stop_check_ends_each_row_at_its_token_and_leaves_every_draw_as_without_it(engine, n):
    """One chunk of rows, float64: with `SamplingParams.stop` each row keeps the tokens and
    log-probs the same seed gives without it, through the token the check is true at (or its
    end-of-sequence token, if earlier), and generation ends when the last row has stopped."""
    one_chunk = TransformersEngine(engine.model, engine.tokenizer)
    prompts = prompt_ids(engine) * 3
    params = SamplingParams(n=n, temperature=0.7, max_new_tokens=12, return_logprobs=True)
    torch.manual_seed(7)
    free = one_chunk.generate(prompts, params)
    torch.manual_seed(7)
    stopped = one_chunk.generate(prompts, dataclasses.replace(params, stop=stops_after_one_to_eight_tokens))
    kept = []
    for row in range(free.response_ids.shape[0]):
        tokens = free.response_ids[row, : int(free.response_mask[row].sum())].tolist()
        kept.append(min(len(tokens), 1 + tokens[0] % 8))
        assert stopped.response_ids[row, : kept[-1]].tolist() == tokens[: kept[-1]]
        assert int(stopped.response_mask[row].sum()) == kept[-1]
        assert torch.equal(stopped.response_logprobs[row, : kept[-1]], free.response_logprobs[row, : kept[-1]])
    assert stopped.response_ids.shape[1] == max(kept) < 12


def test_only_full_attention_layers_get_a_preallocated_cache(tiny_model_dir):
    """Qwen2's layers get a `StaticCache`; a sliding-window model (Mistral) keeps its own cache."""
    from tiny_architectures import ARCHITECTURES

    qwen2 = load_causal_lm(str(tiny_model_dir), dtype="float32")
    mistral = transformers.AutoModelForCausalLM.from_config(ARCHITECTURES["mistral"]())
    for model, expected in ((qwen2, StaticCache), (mistral, DynamicCache)):
        cache = model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=True).past_key_values
        assert type(hf._preallocated(cache, model.config, 8)) is expected


def test_a_float32_model_generates_under_bf16_autocast(engine, tiny_model_dir):
    """Mixed precision (`model.dtype=bfloat16`: float32 weights, bf16 autocast) gives new tokens'
    values another dtype than the prompt's; generation takes both (a growing cache)."""
    mixed = TransformersEngine(load_causal_lm(str(tiny_model_dir), dtype="float32"), engine.tokenizer)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rollouts = mixed.generate(prompt_ids(engine), SamplingParams(n=2, max_new_tokens=6))
    assert len(rollouts.response_texts) == 2 * len(prompt_ids(engine))


def recomputed_logprobs(engine, rollouts, temperature):
    batch = PolicyBatch.from_rollouts(rollouts, torch.zeros(len(rollouts.response_texts)), torch.float64)
    return response_logprobs(engine.model, batch, temperature=temperature), batch.response_mask.bool()


def test_recomputed_logprobs_are_those_of_the_sampling_distribution(engine):
    torch.manual_seed(3)
    rollouts = engine.generate(prompt_ids(engine), SamplingParams(n=2, temperature=0.7, max_new_tokens=8, return_logprobs=True))
    recomputed, mask = recomputed_logprobs(engine, rollouts, 0.7)
    assert torch.allclose(recomputed[mask], rollouts.response_logprobs[mask].double(), atol=1e-5)


@pytest.fixture(scope="module")
def instruct_style_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model with an instruct model's generation defaults, as Qwen2.5-Instruct ships them:
    a repetition penalty, its own temperature / top-p / top-k, and two end-of-turn tokens."""
    directory = tmp_path_factory.mktemp("instruct") / "model"
    model = load_causal_lm(str(tiny_model_dir), dtype="float64")
    tokenizer = load_tokenizer(str(tiny_model_dir))
    model.generation_config = instruct_generation_config(tokenizer)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def instruct_engine(instruct_style_model_dir):
    model = load_causal_lm(str(instruct_style_model_dir), dtype="float64")
    return TransformersEngine(model, load_tokenizer(str(instruct_style_model_dir)))


def test_the_models_generation_defaults_do_not_reshape_sampling(instruct_engine):
    """Behaviour log-probs (from generate's processed scores) equal the trainer's recomputation,
    although the model's generation_config.json asks for a repetition penalty, top-k and top-p."""
    torch.manual_seed(0)
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=24, return_logprobs=True)
    rollouts = instruct_engine.generate(prompt_ids(instruct_engine) * 2, params)
    recomputed, mask = recomputed_logprobs(instruct_engine, rollouts, 1.0)
    assert mask.sum() > 100
    assert torch.allclose(recomputed[mask], rollouts.response_logprobs[mask].double(), atol=1e-5)


def test_the_models_generation_config_is_restored_after_generating(instruct_engine):
    instruct_engine.generate(prompt_ids(instruct_engine), SamplingParams(n=1, max_new_tokens=2))
    assert instruct_engine.model.generation_config.repetition_penalty == 1.05


def test_a_response_ends_at_any_declared_end_of_sequence_token(instruct_engine):
    tokenizer = instruct_engine.tokenizer
    end_ids = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|user|>")}
    assert set(instruct_engine.eos_ids) == end_ids
    torch.manual_seed(1)
    rollouts = instruct_engine.generate(prompt_ids(instruct_engine) * 16, SamplingParams(n=4, max_new_tokens=16))
    lengths = rollouts.response_mask.sum(dim=1)
    last_tokens = rollouts.response_ids[torch.arange(len(lengths)), lengths - 1]
    for ids, length in zip(rollouts.response_ids, lengths):
        assert not end_ids & set(ids[: length - 1].tolist())
    ended = lengths < 16
    assert set(last_tokens[ended].tolist()) == end_ids, "both end tokens should end some response"


def test_a_prompts_samples_are_those_of_generate_with_num_return_sequences(engine):
    """Running each prompt once for its n samples draws exactly what `generate` draws when it
    runs the prompt n times (same seed, float64 model)."""
    wide = TransformersEngine(engine.model, engine.tokenizer, max_sequences_per_call=64)
    ids = prompt_ids(engine)
    torch.manual_seed(5)
    rollouts = wide.generate(ids, SamplingParams(n=3, temperature=0.8, max_new_tokens=10))
    pad = engine.tokenizer.pad_token_id
    width = max(map(len, ids))
    input_ids = torch.tensor([[pad] * (width - len(row)) + row for row in ids])
    attention_mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in ids])
    config = GenerationConfig(
        do_sample=True,
        temperature=0.8,
        top_p=1.0,
        top_k=0,
        max_new_tokens=10,
        num_return_sequences=3,
        eos_token_id=list(wide.eos_ids),
        pad_token_id=pad,
    )
    torch.manual_seed(5)
    expected = engine.model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    for row, length in enumerate(rollouts.response_mask.sum(dim=1).long().tolist()):
        assert rollouts.response_ids[row, :length].tolist() == expected[row, width : width + length].tolist()


def test_an_engine_on_the_trained_model_refuses_weights_to_load(engine):
    """`RolloutEngine.load_weights` is for engines with their own copy; transformers' has none."""
    assert not engine.holds_own_weights
    with pytest.raises(TypeError, match="holds no weights"):
        engine.load_weights(iter([]))
