"""Specification of tool tokens in a response (multi-turn rollouts): the policy attends to a tool's
output, but no algorithm scores it. Every algorithm's update sees `PolicyBatch.loss_mask`
(response_mask · model_token_mask), in float64, at any micro-batch size, padded or packed."""

from __future__ import annotations

import copy

import pytest
import torch
from batches import policy_batch
from exact_float64 import GradientRecordingAdamW, normalise_float64_in_float64

from pacs.algos.pacs import reward_proxy
from pacs.config import ALGORITHM_CONFIGS
from pacs.distributed.world import World
from pacs.models.loading import load_causal_lm
from pacs.train.batch import PolicyBatch
from pacs.train.logprobs import fill_rollout_logprobs, response_logprobs
from pacs.train.update import UpdateSettings, update_policy

GROUP_SIZE = 4
PROMPTS = 4
ALGORITHMS = {
    "pacs with kl, entropy": {"name": "pacs", "beta": 2.0, "kl_coef": 0.1, "entropy_coef": 0.01, "pacs_reference": "fixed"},
    "pacs sampler-corrected": {"name": "pacs", "rollout_is_cap": 1.5, "rollout_is_level": "geometric_mean"},
    "pacs mean_logprob": {"name": "pacs", "proxy": "mean_logprob", "overlong_buffer": 4},
    "grpo with kl": {"name": "grpo", "kl_coef": 0.1, "kl_estimator": "k2", "rollout_is_cap": 1.5},
    "rloo": {"name": "rloo", "loss_agg": "seq-mean-token-sum", "kl_in_reward": True, "kl_coef": 0.05},
    "ppo": {"name": "ppo", "entropy_coef": 0.01},
    "dr_grpo": {"name": "dr_grpo"},
    "dapo": {"name": "dapo", "loss_agg": "token-mean"},
    "gspo": {"name": "gspo"},
    "cispo": {"name": "cispo", "entropy_coef": 0.01},
}
MAX_RESPONSE_LENGTH = 14


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    normalise_float64_in_float64()
    return load_causal_lm(str(tiny_model_dir), dtype="float64")


def tool_batch(vocab_size: int) -> PolicyBatch:
    """4 prompts x 4 responses, each [model tokens | tool output | model tokens], every other
    response ending in a tool output of its own (cut off by the length limit); mixed rewards and
    random reference log-probs, values and sampler log-probs."""
    generator = torch.Generator().manual_seed(0)

    def randint(low: int, high: int) -> int:
        return int(torch.randint(low, high, (1,), generator=generator))

    prompts, responses, model_tokens = [], [], []
    for _ in range(PROMPTS):
        prompt = torch.randint(1, vocab_size, (randint(3, 9),), generator=generator)
        for k in range(GROUP_SIZE):
            segments = [(randint(1, 4), 1), (randint(1, 4), 0), (randint(1, 4), 1), (randint(1, 3) if k % 2 else 0, 0)]
            prompts.append(prompt)
            responses.append(torch.randint(1, vocab_size, (sum(length for length, _ in segments),), generator=generator))
            model_tokens.append(torch.cat([torch.full((length,), is_model) for length, is_model in segments]))
    batch = policy_batch(prompts, responses, [1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0], model_tokens=model_tokens)
    shape = batch.response_mask.shape
    batch.row_terms["ref_logprobs"] = -torch.rand(shape, generator=generator, dtype=torch.float64) * 3
    batch.row_terms["values"] = torch.rand(shape, generator=generator, dtype=torch.float64)
    return batch


def tool_positions(batch: PolicyBatch) -> torch.Tensor:
    """(B, R) True at the tokens of a tool's output."""
    return (batch.response_mask == 1) & (batch.model_token_mask == 0)


def trailing_tool_positions(batch: PolicyBatch) -> torch.Tensor:
    """(B, R) True at the tool tokens after a response's last model token (no model token sees them)."""
    last_model_token = (batch.model_token_mask * torch.arange(1, batch.response_mask.shape[1] + 1)).argmax(dim=1, keepdim=True)
    return tool_positions(batch) & (torch.arange(batch.response_mask.shape[1]) > last_model_token)


def with_rollout_terms(model, batch: PolicyBatch) -> PolicyBatch:
    """`batch` with the rollout policy's log-probs and entropy, and sampler log-probs near them."""
    batch = copy.deepcopy(batch)
    fill_rollout_logprobs(model, batch, slice(None), micro_batch_size=5, temperature=1.0)
    noise = torch.randn(batch.old_logprobs.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    batch.row_terms["sampler_logprobs"] = batch.old_logprobs + 0.3 * noise * batch.response_mask
    return batch


def trained_gradients(model, batch: PolicyBatch, options: dict, micro_batch_size: int, padding_free: bool = False):
    """Every update's gradients (2 epochs x 2 mini-batches of 2 prompts) of the algorithm of
    `options` on `batch`, whose step terms it prepares first."""
    algorithm = ALGORITHM_CONFIGS[options["name"]](**options).build(
        group_size=GROUP_SIZE, max_response_length=MAX_RESPONSE_LENGTH
    )
    batch = copy.deepcopy(batch)
    batch.row_terms.update(algorithm.prepare_step(batch.tensors()))
    trained = copy.deepcopy(model)
    optimizer = GradientRecordingAdamW(trained.parameters(), lr=1e-2)
    settings = UpdateSettings(
        mini_batch_size=2, micro_batch_size=micro_batch_size, epochs=2, grad_clip=1.0, padding_free=padding_free
    )
    update_policy(trained, optimizer, World.single(), batch, algorithm, settings)
    return optimizer.gradients


def largest_difference(first, second) -> float:
    return max((a - b).abs().max().item() for update, other in zip(first, second) for a, b in zip(update, other))


def test_every_registered_algorithm_is_checked_with_tool_tokens():
    assert {options["name"] for options in ALGORITHMS.values()} == set(ALGORITHM_CONFIGS)


@pytest.mark.parametrize("options", ALGORITHMS.values(), ids=ALGORITHMS.keys())
def test_what_lies_at_tool_tokens_changes_no_algorithms_gradient(model, options):
    batch = with_rollout_terms(model, tool_batch(model.config.vocab_size))
    perturbed = copy.deepcopy(batch)
    at_tools, generator = tool_positions(batch), torch.Generator().manual_seed(2)
    garbage = -30 * torch.rand(batch.response_mask.shape, generator=generator, dtype=torch.float64)
    perturbed.old_logprobs = torch.where(at_tools, garbage, batch.old_logprobs)
    perturbed.entropy = torch.where(at_tools, -garbage, batch.entropy)
    for name, term in batch.row_terms.items():
        perturbed.row_terms[name] = torch.where(at_tools, garbage.flip(0), term)
    trailing = trailing_tool_positions(batch)
    assert trailing.sum() >= 4
    perturbed.response_ids = torch.where(trailing, (batch.response_ids + 7) % model.config.vocab_size, batch.response_ids)
    gradients = trained_gradients(model, batch, options, micro_batch_size=3)
    assert max(g.abs().max().item() for g in gradients[0]) > 1e-3
    assert largest_difference(trained_gradients(model, perturbed, options, micro_batch_size=3), gradients) < 1e-12


def test_a_tool_output_is_context_the_model_tokens_after_it_attend_to(model):
    batch = tool_batch(model.config.vocab_size)
    changed = copy.deepcopy(batch)
    middle_tools = tool_positions(batch) & ~trailing_tool_positions(batch)
    changed.response_ids = torch.where(middle_tools, (batch.response_ids + 7) % model.config.vocab_size, batch.response_ids)
    before, after = response_logprobs(model, batch).detach(), response_logprobs(model, changed).detach()
    first_tool = middle_tools.int().argmax(dim=1, keepdim=True)
    positions = torch.arange(batch.response_mask.shape[1])
    scored = batch.loss_mask == 1
    assert torch.equal(before[scored & (positions < first_tool)], after[scored & (positions < first_tool)])
    assert (before[scored & (positions > first_tool)] - after[scored & (positions > first_tool)]).abs().min() > 0


def test_pacs_score_is_beta_times_the_log_ratio_summed_over_the_models_tokens_only(model):
    batch = with_rollout_terms(model, tool_batch(model.config.vocab_size))
    logprobs = response_logprobs(model, batch).detach() + 0.1 * batch.row_terms["ref_logprobs"]
    tensors = batch.tensors()
    scores = reward_proxy(logprobs, tensors["old_logprobs"], tensors["response_mask"], beta=2.0)
    for row in range(len(batch)):
        model_positions = [t for t in range(batch.response_mask.shape[1]) if batch.model_token_mask[row, t] == 1]
        expected = 2.0 * sum(float(logprobs[row, t] - batch.old_logprobs[row, t]) for t in model_positions)
        assert float(scores[row]) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert float(tool_positions(batch).sum()) >= len(batch)


@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("options", ALGORITHMS.values(), ids=ALGORITHMS.keys())
def test_updates_with_tool_tokens_are_the_same_at_any_micro_batch_size(model, options, padding_free):
    batch = with_rollout_terms(model, tool_batch(model.config.vocab_size))
    whole = trained_gradients(model, batch, options, micro_batch_size=2 * GROUP_SIZE)
    for micro_batch_size in (1, 3):
        split = trained_gradients(model, batch, options, micro_batch_size, padding_free=padding_free)
        assert len(split) == len(whole) == 4
        assert largest_difference(split, whole) < 1e-10, micro_batch_size
