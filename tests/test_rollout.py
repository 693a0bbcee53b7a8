"""The transformers rollout engine: grouped, EOS-terminated samples from the policy the trainer scores."""

from __future__ import annotations

import pytest
import torch

from pacs.models.loading import load_causal_lm, load_tokenizer
from pacs.rollout.base import SamplingParams, pad_rows
from pacs.rollout.hf import TransformersEngine
from pacs.train.batch import PolicyBatch, response_logprobs

PROMPTS = ["<|user|>What is 3+4?<|end|><|assistant|>", "<|user|>Hi<|end|><|assistant|>"]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    return TransformersEngine(load_causal_lm(str(tiny_model_dir), dtype="float64"), tokenizer, max_sequences_per_call=4)


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


def test_recomputed_logprobs_are_those_of_the_sampling_distribution(engine):
    """Scores returned by `generate` (float32 logits / temperature) against the trainer's recomputation."""
    params = SamplingParams(n=2, temperature=0.7, max_new_tokens=8)
    config = engine._generation_config(params)
    config.output_logits, config.return_dict_in_generate = True, True
    ids = [torch.tensor(p) for p in prompt_ids(engine)]
    input_ids = pad_rows(ids, engine.tokenizer.pad_token_id, left=True)
    attention_mask = pad_rows([torch.ones_like(p) for p in ids], 0, left=True)
    torch.manual_seed(3)
    output = engine.model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    sampled = output.sequences[:, input_ids.shape[1] :]
    expected = torch.log_softmax(torch.stack(output.logits, dim=1).double() / 0.7, dim=-1)
    expected = expected.gather(-1, sampled.unsqueeze(-1)).squeeze(-1)

    torch.manual_seed(3)
    rollouts = engine.generate(prompt_ids(engine), params)
    width = rollouts.response_ids.shape[1]
    assert torch.equal(rollouts.response_ids[rollouts.response_mask.bool()], sampled[:, :width][rollouts.response_mask.bool()])
    batch = PolicyBatch.from_rollouts(rollouts, torch.zeros(4), torch.float64)
    recomputed = response_logprobs(engine.model, batch, temperature=0.7)
    mask = batch.response_mask.bool()
    assert torch.allclose(recomputed[mask], expected[:, :width][mask], atol=1e-5)
