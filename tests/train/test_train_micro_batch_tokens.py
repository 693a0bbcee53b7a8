"""Specification of micro-batches budgeted in tokens (`train.micro_batch_tokens`) and of the
padding-free no-grad passes (old log-probs, the reference's, the critic's values) and critic
updates (`train.padding_free`): the same log-probs, values, losses and gradients as fixed
micro-batches of padded rows, in float64."""

from __future__ import annotations

import copy

import pytest
import torch
from batches import ALGORITHMS, GROUP_SIZE, ragged_batch
from exact_float64 import GradientRecordingAdamW, assert_same_updates, normalise_float64_in_float64
from mixed_rewards import EXACT_TWO_STEPS
from safetensors.torch import load_file

from pacs.config import ALGORITHM_CONFIGS, ConfigError, load_config
from pacs.distributed.world import World
from pacs.models.loading import load_causal_lm, load_value_model
from pacs.train import batch as batch_module
from pacs.train import logprobs as logprobs_module
from pacs.train import update as update_module
from pacs.train.batch import micro_batch_slices, row_tokens
from pacs.train.logprobs import fill_rollout_logprobs, response_logprobs_no_grad, response_values_no_grad
from pacs.train.trainer import train
from pacs.train.update import UpdateSettings, update_critic, update_policy

BUDGETS = [9, 16, 25]
"""Tokens per micro-batch over `ragged_batch`'s rows of 5-10 tokens: 9 leaves the rows of 10
alone, 16 makes pairs and single rows, 25 triples."""


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    normalise_float64_in_float64()
    return load_causal_lm(str(tiny_model_dir), dtype="float64")


@pytest.fixture(scope="module")
def critic(tiny_model_dir):
    normalise_float64_in_float64()
    return load_value_model(str(tiny_model_dir), dtype="float64")


def test_micro_batches_take_whole_rows_in_order_within_the_token_budget_and_the_row_count():
    batch = ragged_batch(1000)
    tokens = row_tokens(batch).tolist()
    assert tokens == [7, 9, 10, 8, 7, 6, 9, 8, 6, 10, 10, 9, 7, 9, 5, 5]
    assert micro_batch_slices(batch, max_rows=16, max_tokens=16) == [
        slice(0, 2), slice(2, 3), slice(3, 5), slice(5, 7), slice(7, 9), slice(9, 10), slice(10, 11), slice(11, 13),
        slice(13, 15), slice(15, 16),
    ]  # fmt: skip
    assert micro_batch_slices(batch, max_rows=2, max_tokens=100) == [slice(start, start + 2) for start in range(0, 16, 2)]


def test_a_row_longer_than_the_budget_is_a_micro_batch_of_its_own():
    batch = ragged_batch(1000)
    slices = micro_batch_slices(batch, max_rows=16, max_tokens=8)
    tokens = row_tokens(batch)
    assert [rows.start for rows in slices] == sorted(rows.start for rows in slices)
    assert sum(rows.stop - rows.start for rows in slices) == len(batch)
    for rows in slices:
        assert int(tokens[rows].sum()) <= 8 or rows.stop - rows.start == 1
    assert slice(2, 3) in slices and int(tokens[2]) == 10


def test_without_a_token_budget_micro_batches_are_the_fixed_row_count():
    assert micro_batch_slices(ragged_batch(1000), max_rows=5, max_tokens=None) == [
        slice(0, 5),
        slice(5, 10),
        slice(10, 15),
        slice(15, 16),
    ]


def test_every_rank_cuts_its_share_where_any_ranks_micro_batch_would_pass_the_budget(monkeypatch):
    batch = ragged_batch(1000)
    other_rank = torch.tensor([[2, 2, 2, 2, 15, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]])
    monkeypatch.setattr(batch_module, "gather_rows", lambda world, tokens: torch.cat([tokens, other_rank]))
    slices = micro_batch_slices(batch, max_rows=16, max_tokens=16, world=World.single())
    assert slices == [
        slice(0, 2), slice(2, 3), slice(3, 4), slice(4, 5), slice(5, 7), slice(7, 9), slice(9, 10), slice(10, 11),
        slice(11, 13), slice(13, 15), slice(15, 16),
    ]  # fmt: skip


@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("options", ALGORITHMS.values(), ids=ALGORITHMS.keys())
def test_every_algorithms_updates_in_token_budgeted_micro_batches_are_the_fixed_size_ones(
    model, options, budget, padding_free, monkeypatch
):
    algorithm = ALGORITHM_CONFIGS[options["name"]](**options).build(group_size=GROUP_SIZE, max_response_length=6)
    batch = ragged_batch(model.config.vocab_size)
    fill_rollout_logprobs(model, batch, slice(None), micro_batch_size=5, temperature=1.0)
    batch.row_terms.update(algorithm.prepare_step(batch.tensors()))
    planned = []
    monkeypatch.setattr(
        update_module, "micro_batch_slices", lambda *a, **k: planned.append(micro_batch_slices(*a, **k)) or planned[-1]
    )
    runs = []
    for tokens in (None, budget):
        trained = copy.deepcopy(model)
        optimizer = GradientRecordingAdamW(trained.parameters(), lr=1e-2)
        settings = UpdateSettings(
            mini_batch_size=2, micro_batch_size=3, epochs=2, grad_clip=1.0, padding_free=padding_free, micro_batch_tokens=tokens
        )
        metrics = update_policy(trained, optimizer, World.single(), copy.deepcopy(batch), algorithm, settings)
        runs.append((optimizer.gradients, metrics))
    assert planned[4:] != planned[:4]  # the budget, not the row count, cut the mini-batches
    assert_same_updates(*runs, steps=4)


@pytest.mark.parametrize("budget", [None, 16])
def test_packed_old_and_reference_logprob_passes_give_the_padded_ones(model, budget):
    padded, packed = (
        ragged_batch(model.config.vocab_size, empty_response=True),
        ragged_batch(model.config.vocab_size, empty_response=True),
    )
    fill_rollout_logprobs(model, padded, slice(2, None), micro_batch_size=5, temperature=0.7)
    fill_rollout_logprobs(
        model, packed, slice(2, None), micro_batch_size=5, micro_batch_tokens=budget, temperature=0.7, padding_free=True
    )
    torch.testing.assert_close(packed.old_logprobs, padded.old_logprobs, rtol=0, atol=1e-12, equal_nan=True)
    torch.testing.assert_close(packed.entropy, padded.entropy, rtol=0, atol=1e-12, equal_nan=True)
    assert padded.old_logprobs[2:][padded.response_mask[2:] > 0].abs().min() > 0
    reference = response_logprobs_no_grad(model, padded, micro_batch_size=5)
    packed_reference = response_logprobs_no_grad(model, padded, micro_batch_size=5, micro_batch_tokens=budget, padding_free=True)
    torch.testing.assert_close(packed_reference, reference, rtol=0, atol=1e-12)


@pytest.mark.parametrize("budget", [None, 16])
def test_packed_critic_values_are_the_padded_ones_and_zero_at_padding(critic, budget):
    batch = ragged_batch(critic.config.vocab_size, empty_response=True)
    values = response_values_no_grad(critic, batch, micro_batch_size=5)
    packed_values = response_values_no_grad(critic, batch, micro_batch_size=5, micro_batch_tokens=budget, padding_free=True)
    torch.testing.assert_close(packed_values, values, rtol=0, atol=1e-12)
    assert (values[batch.response_mask == 0] == 0).all()
    assert values[batch.response_mask > 0].abs().min() > 0


@pytest.mark.parametrize("budget", [None, 16])
def test_critic_updates_in_packed_token_budgeted_micro_batches_are_the_padded_fixed_size_ones(critic, budget):
    algorithm = ALGORITHM_CONFIGS["ppo"]().build(group_size=GROUP_SIZE, max_response_length=6)
    batch = ragged_batch(critic.config.vocab_size)
    batch.row_terms.update(algorithm.prepare_step(batch.tensors()))
    runs = []
    for padding_free, tokens in ((False, None), (True, budget)):
        trained = copy.deepcopy(critic)
        optimizer = GradientRecordingAdamW(trained.parameters(), lr=1e-2)
        settings = UpdateSettings(
            mini_batch_size=2, micro_batch_size=3, epochs=2, grad_clip=1.0, padding_free=padding_free, micro_batch_tokens=tokens
        )
        metrics = update_critic(trained, optimizer, World.single(), copy.deepcopy(batch), algorithm, settings)
        runs.append((optimizer.gradients, metrics))
    assert_same_updates(*runs, steps=4)


def test_a_token_budget_that_never_limits_a_micro_batch_is_refused_naming_the_fix():
    overrides = ["train.micro_batch_size=4", "data.max_prompt_length=100", "data.max_response_length=28"]
    with pytest.raises(ConfigError) as refused:
        load_config("builtin:demo", [*overrides, "train.micro_batch_tokens=512"])
    message = str(refused.value)
    assert "train.micro_batch_tokens=512" in message and "train.micro_batch_size=4" in message and "below 512" in message
    assert load_config("builtin:demo", [*overrides, "train.micro_batch_tokens=511"]).train.micro_batch_tokens == 511


@pytest.mark.slow
def test_a_run_with_token_budgeted_packed_passes_trains_the_weights_of_the_fixed_padded_run(
    tmp_path, tiny_model_dir, monkeypatch
):
    planned = []
    original = batch_module.micro_batch_slices

    def recorded(batch, **limits):
        planned.append(limits["max_tokens"])
        return original(batch, **limits)

    for module in (update_module, logprobs_module):
        monkeypatch.setattr(module, "micro_batch_slices", recorded)

    def final_weights(name: str, *overrides: str) -> dict[str, torch.Tensor]:
        config = load_config(
            "builtin:demo", [f"output_dir={tmp_path / name}", f"model.path={tiny_model_dir}", *EXACT_TWO_STEPS, *overrides]
        )
        result = train(config, show_progress=False)
        return load_file(result.final_checkpoint / "model.safetensors")

    budgeted = final_weights("budgeted", "train.padding_free=true", "train.micro_batch_tokens=40")
    assert planned and set(planned) == {40}  # every pass, the no-grad ones too, took the budget
    padded = final_weights("padded")
    initial = load_file(tiny_model_dir / "model.safetensors")
    assert max((padded[name] - initial[name]).abs().max().item() for name in initial) > 1e-4
    assert max((budgeted[name] - padded[name]).abs().max().item() for name in budgeted) < 1e-9
