"""Specification of padding-free passes (`train.padding_free`): a micro-batch's rows packed end to
end with restarting position ids give the padded passes' log-probs, entropy, losses and gradients."""

from __future__ import annotations

import copy

import pytest
import torch
from batches import ALGORITHMS, GROUP_SIZE, ragged_batch
from exact_float64 import GradientRecordingAdamW, assert_same_updates, normalise_float64_in_float64
from mixed_rewards import EXACT_TWO_STEPS
from safetensors.torch import load_file

from pacs.config import ALGORITHM_CONFIGS, load_config
from pacs.distributed.world import World
from pacs.models.loading import load_causal_lm
from pacs.train import logprobs as logprobs_module
from pacs.train.logprobs import fill_rollout_logprobs, packed_bins, response_logprobs
from pacs.train.trainer import train
from pacs.train.update import UpdateSettings, update_policy


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    normalise_float64_in_float64()
    return load_causal_lm(str(tiny_model_dir), dtype="float64")


def test_packed_bins_place_rows_first_fit_by_decreasing_length_within_the_capacity():
    lengths = torch.tensor([7, 3, 4, 1, 6, 2, 7, 5])
    bins = packed_bins(lengths, capacity=7)
    assert bins == [[0], [6], [4, 3], [7, 5], [2, 1]]
    assert all(int(lengths[rows].sum()) <= 7 for rows in bins)
    assert packed_bins(torch.tensor([3, 3, 3]), capacity=9) == [[0, 1, 2]]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_rows_give_the_padded_logprobs_entropy_and_gradients(model, temperature):
    batch = ragged_batch(model.config.vocab_size, empty_response=True)
    results = []
    for padding_free in (False, True):
        model.zero_grad()
        logprobs, entropy = response_logprobs(model, batch, temperature=temperature, with_entropy=True, padding_free=padding_free)
        ((logprobs * torch.arange(1.0, 7.0, dtype=torch.float64)).sum() + entropy.sum()).backward()
        results.append((logprobs.detach(), entropy.detach(), [p.grad.clone() for p in model.parameters()]))
    (logprobs, entropy, gradients), (packed_logprobs, packed_entropy, packed_gradients) = results
    torch.testing.assert_close(packed_logprobs, logprobs, rtol=0, atol=1e-12)
    torch.testing.assert_close(packed_entropy, entropy, rtol=0, atol=1e-12)
    assert (packed_logprobs[batch.response_mask == 0] == 0).all()
    assert max((a - b).abs().max().item() for a, b in zip(packed_gradients, gradients)) < 1e-10
    assert max(g.abs().max().item() for g in gradients) > 1e-2


def test_a_packed_pass_is_one_forward_over_fewer_rows_than_the_batch_without_a_mask(model, monkeypatch):
    batch = ragged_batch(model.config.vocab_size)
    calls = []
    original = logprobs_module._forward_terms
    monkeypatch.setattr(
        logprobs_module, "_forward_terms", lambda m, head, **inputs: calls.append(inputs) or original(m, head, **inputs)
    )
    response_logprobs(model, batch, padding_free=True)
    longest = int((batch.prompt_mask.sum(dim=1) + batch.response_mask.sum(dim=1)).max())
    assert len(calls) == 1
    assert calls[0]["input_ids"].shape[1] == longest and calls[0]["input_ids"].shape[0] < len(batch)
    assert "attention_mask" not in calls[0]


@pytest.mark.parametrize("micro_batch_size", [3, 16])
@pytest.mark.parametrize("options", ALGORITHMS.values(), ids=ALGORITHMS.keys())
def test_every_algorithms_updates_are_the_padded_ones(model, options, micro_batch_size):
    algorithm = ALGORITHM_CONFIGS[options["name"]](**options).build(group_size=GROUP_SIZE, max_response_length=6)
    batch = ragged_batch(model.config.vocab_size)
    fill_rollout_logprobs(model, batch, slice(None), micro_batch_size=5, temperature=1.0)
    batch.row_terms.update(algorithm.prepare_step(batch.tensors()))
    runs = []
    for padding_free in (False, True):
        trained = copy.deepcopy(model)
        optimizer = GradientRecordingAdamW(trained.parameters(), lr=1e-2)
        settings = UpdateSettings(
            mini_batch_size=2, micro_batch_size=micro_batch_size, epochs=2, grad_clip=1.0, padding_free=padding_free
        )
        metrics = update_policy(trained, optimizer, World.single(), copy.deepcopy(batch), algorithm, settings)
        runs.append((optimizer.gradients, metrics))
    assert_same_updates(*runs, steps=4)


@pytest.mark.slow
def test_a_run_with_padding_free_passes_trains_the_weights_of_the_padded_run(tmp_path, tiny_model_dir, monkeypatch):
    packings = []
    original = logprobs_module.packed_bins
    monkeypatch.setattr(logprobs_module, "packed_bins", lambda *args: packings.append(args) or original(*args))

    def final_weights(name: str, padding_free: bool) -> dict[str, torch.Tensor]:
        overrides = [
            f"output_dir={tmp_path / name}",
            f"model.path={tiny_model_dir}",
            *EXACT_TWO_STEPS,
            f"train.padding_free={str(padding_free).lower()}",
        ]
        result = train(load_config("builtin:demo", overrides), show_progress=False)
        return load_file(result.final_checkpoint / "model.safetensors")

    packed = final_weights("packed", True)
    packed_passes = len(packings)
    padded = final_weights("padded", False)
    assert packed_passes > 0 and len(packings) == packed_passes  # the switch, and only it, packs the update's passes
    initial = load_file(tiny_model_dir / "model.safetensors")
    assert max((padded[name] - initial[name]).abs().max().item() for name in initial) > 1e-4
    assert max((packed[name] - padded[name]).abs().max().item() for name in packed) < 1e-9
