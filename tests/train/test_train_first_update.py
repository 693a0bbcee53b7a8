"""Specification of the first update's shortcut: the step's first mini-batch takes π_old from the
update's own forward pass instead of a separate rollout-policy pass, with the same result."""

from __future__ import annotations

import copy

import pytest
import torch
from batches import policy_batch
from exact_float64 import GradientRecordingAdamW
from mixed_rewards import EXACT_TWO_STEPS
from safetensors.torch import load_file

from pacs.config import ALGORITHM_CONFIGS, load_config
from pacs.distributed.world import World
from pacs.models.loading import load_causal_lm
from pacs.train import trainer as trainer_module
from pacs.train import update as update_module
from pacs.train.batch import not_computed
from pacs.train.logprobs import fill_rollout_logprobs
from pacs.train.trainer import train
from pacs.train.update import FirstUpdateOldLogprobs, UpdateSettings, update_policy

GROUP_SIZE = 4
PROMPTS = 4
FIRST_UPDATE_ROWS = 2 * GROUP_SIZE  # mini-batches of 2 prompts
ALGORITHMS = {
    "pacs": {"name": "pacs", "beta": 2.0},
    "pacs mean_logprob": {"name": "pacs", "proxy": "mean_logprob"},
    "pacs with kl and entropy": {"name": "pacs", "kl_coef": 0.1, "kl_estimator": "k3", "entropy_coef": 0.01},
    "grpo": {"name": "grpo"},
    "grpo with kl": {"name": "grpo", "kl_coef": 0.1, "kl_estimator": "k2"},
    "rloo": {"name": "rloo", "loss_agg": "seq-mean-token-sum"},
    "ppo": {"name": "ppo", "entropy_coef": 0.01},
}


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return load_causal_lm(str(tiny_model_dir), dtype="float64")


def step_batch(model, algorithm):
    """4 prompts x 4 ragged random responses with mixed rewards, the reference log-probs and
    values an algorithm may need, and its step terms."""
    generator = torch.Generator().manual_seed(0)
    prompts, responses = [], []
    for _ in range(PROMPTS):
        prompt = torch.randint(
            0, model.config.vocab_size, (int(torch.randint(3, 9, (1,), generator=generator)),), generator=generator
        )
        for _ in range(GROUP_SIZE):
            prompts.append(prompt)
            length = int(torch.randint(1, 7, (1,), generator=generator))
            responses.append(torch.randint(0, model.config.vocab_size, (length,), generator=generator))
    batch = policy_batch(prompts, responses, [1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0])
    shape = batch.response_mask.shape
    batch.row_terms["ref_logprobs"] = -torch.rand(shape, generator=generator, dtype=torch.float64) * 3
    batch.row_terms["values"] = torch.rand(shape, generator=generator, dtype=torch.float64)
    step_inputs = {name: value for name, value in batch.tensors().items() if name != "old_logprobs"}
    batch.row_terms.update(algorithm.prepare_step(step_inputs))
    return batch


def updated(model, batch, algorithm, rows_without_old_logprobs: int, micro_batch_size: int):
    model = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    settings = UpdateSettings(mini_batch_size=2, micro_batch_size=micro_batch_size, epochs=2, grad_clip=1.0)
    metrics = update_policy(
        model, optimizer, World.single(), batch, algorithm, settings, rows_without_old_logprobs=rows_without_old_logprobs
    )
    return model, metrics


@pytest.mark.parametrize("micro_batch_size", [3, 8])
@pytest.mark.parametrize("options", ALGORITHMS.values(), ids=ALGORITHMS.keys())
def test_the_first_update_without_a_rollout_pass_equals_the_long_way(model, options, micro_batch_size):
    algorithm = ALGORITHM_CONFIGS[options["name"]](**options).build(group_size=GROUP_SIZE, max_response_length=6)
    long_way = step_batch(model, algorithm)
    fill_rollout_logprobs(model, long_way, slice(None), micro_batch_size=5, temperature=1.0)
    shortcut = step_batch(model, algorithm)
    fill_rollout_logprobs(model, shortcut, slice(FIRST_UPDATE_ROWS, None), micro_batch_size=5, temperature=1.0)
    assert shortcut.old_logprobs[:FIRST_UPDATE_ROWS].abs().sum() == 0

    expected, expected_metrics = updated(model, long_way, algorithm, 0, micro_batch_size)
    trained, metrics = updated(model, shortcut, algorithm, FIRST_UPDATE_ROWS, micro_batch_size)

    assert max((a - b).abs().max().item() for a, b in zip(model.parameters(), expected.parameters())) > 1e-4
    # 1e-11: float64 roundoff of passes cut into different length buckets, as AdamW's 1/sqrt(v) scales it
    assert max((a - b).abs().max().item() for a, b in zip(trained.parameters(), expected.parameters())) < 1e-11
    torch.testing.assert_close(shortcut.old_logprobs, long_way.old_logprobs, rtol=0, atol=1e-12)
    torch.testing.assert_close(shortcut.entropy, long_way.entropy, rtol=0, atol=1e-12)
    assert metrics.keys() == expected_metrics.keys()
    for name, value in expected_metrics.items():
        assert metrics[name] == pytest.approx(value, abs=1e-10), name


SAMPLER_CORRECTED = {
    "pacs truncate": {"name": "pacs", "beta": 2.0, "rollout_is_cap": 2.0},
    "pacs mask, mean_logprob": {"name": "pacs", "proxy": "mean_logprob", "rollout_is_cap": 2.0, "rollout_is_mode": "mask"},
    "grpo token truncate, kl": {"name": "grpo", "rollout_is_cap": 2.0, "kl_coef": 0.1, "kl_estimator": "k2"},
    "grpo sequence mask": {"name": "grpo", "rollout_is_cap": 2.0, "rollout_is_level": "sequence", "rollout_is_mode": "mask"},
    "gspo": {"name": "gspo", "rollout_is_cap": 1.5},
    "cispo": {"name": "cispo", "rollout_is_cap": 2.0},
    "ppo": {"name": "ppo", "rollout_is_cap": 1.5, "entropy_coef": 0.01},
}


def sampler_corrected_batch(model, algorithm, *, shortcut: bool):
    """`step_batch` with sampler log-probs μ = the rollout policy's ± up to 0.4 nats per token, so
    that weights are truncated, masked and in between; the step terms as the trainer makes them:
    from every row's old log-probs (the long way), or, with `shortcut`, from none, the rows after
    the first update's having theirs (`Trainer.fill_old_logprobs`)."""
    batch = step_batch(model, algorithm)
    rollout = copy.deepcopy(batch)
    fill_rollout_logprobs(model, rollout, slice(None), micro_batch_size=5, temperature=1.0)
    noise = torch.rand(batch.response_mask.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    batch.row_terms["sampler_logprobs"] = (rollout.old_logprobs + 0.8 * noise - 0.4) * batch.response_mask
    fill_rollout_logprobs(model, batch, slice(FIRST_UPDATE_ROWS if shortcut else 0, None), micro_batch_size=5, temperature=1.0)
    step_inputs = batch.tensors()
    if shortcut:
        del step_inputs["old_logprobs"]
    batch.row_terms.update(algorithm.prepare_step(step_inputs))
    return batch


@pytest.mark.parametrize("micro_batch_size", [3, 8])
@pytest.mark.parametrize("options", SAMPLER_CORRECTED.values(), ids=SAMPLER_CORRECTED.keys())
def test_under_the_sampler_correction_the_first_update_gives_the_same_losses_and_gradients(model, options, micro_batch_size):
    """The first mini-batch's correction weights come from its update's own forward pass
    (π_old = π_θ there): every update's gradient, the metrics and the logged weights equal the
    long way's, where every row's old log-probs and weights came first."""
    algorithm = ALGORITHM_CONFIGS[options["name"]](**options).build(group_size=GROUP_SIZE, max_response_length=6)
    assert algorithm.first_update_may_supply_old_logprobs
    long_way = sampler_corrected_batch(model, algorithm, shortcut=False)
    shortcut = sampler_corrected_batch(model, algorithm, shortcut=True)
    weights = long_way.row_terms["rollout_is_weight"]
    assert "rollout_is_weight" not in shortcut.row_terms
    assert ((weights > 0) & (weights < 1)).any() and ((weights == 0) | (weights >= 1.5)).any(), "the correction bites"

    settings = UpdateSettings(mini_batch_size=2, micro_batch_size=micro_batch_size, epochs=2, grad_clip=1.0)
    runs = []
    for batch, rows in ((long_way, 0), (shortcut, FIRST_UPDATE_ROWS)):
        trained = copy.deepcopy(model)
        optimizer = GradientRecordingAdamW(trained.parameters(), lr=1e-2)
        metrics = update_policy(trained, optimizer, World.single(), batch, algorithm, settings, rows_without_old_logprobs=rows)
        runs.append((optimizer.gradients, metrics))
    (expected_gradients, expected_metrics), (gradients, metrics) = runs

    assert len(gradients) == len(expected_gradients) == 4
    for update, expected_update in zip(gradients, expected_gradients):
        assert max((a - b).abs().max().item() for a, b in zip(update, expected_update)) < 1e-12
    assert max(g.abs().max().item() for g in expected_gradients[0]) > 1e-3
    assert metrics.keys() == expected_metrics.keys()
    for name, value in expected_metrics.items():
        assert metrics[name] == pytest.approx(value, abs=1e-12), name
    torch.testing.assert_close(shortcut.old_logprobs, long_way.old_logprobs, rtol=0, atol=1e-12)
    logged = algorithm.rollout_is_terms(shortcut.tensors())["rollout_is_weight"]
    torch.testing.assert_close(logged, weights, rtol=0, atol=1e-12)


def test_one_update_per_step_needs_no_no_grad_pass_at_all(model, monkeypatch):
    algorithm = ALGORITHM_CONFIGS["pacs"]().build(group_size=GROUP_SIZE, max_response_length=6)
    batch = step_batch(model, algorithm)
    calls = []
    original = update_module.response_logprobs_no_grad
    monkeypatch.setattr(update_module, "response_logprobs_no_grad", lambda *a, **k: calls.append(1) or original(*a, **k))
    optimizer = torch.optim.AdamW(copy.deepcopy(model).parameters(), lr=1e-2)
    settings = UpdateSettings(mini_batch_size=PROMPTS, micro_batch_size=5, epochs=1, grad_clip=1.0)
    update_policy(
        copy.deepcopy(model), optimizer, World.single(), batch, algorithm, settings, rows_without_old_logprobs=len(batch)
    )
    assert calls == []
    assert (batch.old_logprobs.ne(0) == batch.response_mask.bool()).all(), "every response token got its log-prob"


def test_more_rows_than_one_update_are_refused(model):
    algorithm = ALGORITHM_CONFIGS["pacs"]().build(group_size=GROUP_SIZE, max_response_length=6)
    batch = step_batch(model, algorithm)
    settings = UpdateSettings(mini_batch_size=2, micro_batch_size=5, epochs=1, grad_clip=1.0)
    with pytest.raises(ValueError, match="exceeds one update's 8 rows"):
        update_policy(model, None, World.single(), batch, algorithm, settings, rows_without_old_logprobs=9)


def test_the_first_updates_rows_show_the_algorithm_no_old_logprobs_until_its_forward_gives_them(model):
    batch = step_batch(model, ALGORITHM_CONFIGS["pacs"]().build(group_size=GROUP_SIZE, max_response_length=6))
    first_update = FirstUpdateOldLogprobs(batch, FIRST_UPDATE_ROWS, rows_per_update=FIRST_UPDATE_ROWS)
    first, second = slice(0, FIRST_UPDATE_ROWS), slice(FIRST_UPDATE_ROWS, 2 * FIRST_UPDATE_ROWS)
    assert "old_logprobs" not in first_update.algorithm_inputs(batch.rows(first), first)
    assert "old_logprobs" in first_update.algorithm_inputs(batch.rows(second), second)
    micro = batch.rows(first)
    logprobs, entropy = (
        -torch.rand(micro.response_mask.shape, dtype=torch.float64),
        torch.rand(micro.response_mask.shape, dtype=torch.float64),
    )
    first_update.give(micro, first, logprobs * micro.response_mask, entropy)
    assert "old_logprobs" in first_update.algorithm_inputs(batch.rows(first), first)
    assert torch.equal(batch.old_logprobs[first, : micro.response_ids.shape[1]], logprobs * micro.response_mask)


def test_old_logprobs_not_computed_yet_are_nan_on_response_tokens_not_a_plausible_zero():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    placeholder = not_computed(mask)
    assert torch.equal(placeholder.isnan(), mask.bool())
    assert (placeholder[mask == 0] == 0).all()


@pytest.mark.slow
def test_the_switch_back_to_the_plain_path_trains_the_same_weights(tmp_path, tiny_model_dir, monkeypatch):
    first_rows_of_rollout_passes = []
    original = trainer_module.fill_rollout_logprobs

    def recorded(model, batch, rows, **options):
        first_rows_of_rollout_passes.append(rows.start)
        return original(model, batch, rows, **options)

    monkeypatch.setattr(trainer_module, "fill_rollout_logprobs", recorded)

    def final_weights(name: str, *switch: str) -> dict[str, torch.Tensor]:
        overrides = [
            f"output_dir={tmp_path / name}",
            f"model.path={tiny_model_dir}",
            *EXACT_TWO_STEPS,
            *switch,
        ]
        result = train(load_config("builtin:demo", overrides), show_progress=False)
        return load_file(result.final_checkpoint / "model.safetensors")

    shortcut, plain = final_weights("shortcut"), final_weights("plain", "train.old_logprobs_from_first_update=false")
    assert first_rows_of_rollout_passes == [8, 8, 0, 0]  # the first mini-batch's 2 prompts x 4 responses, then none
    initial = load_file(tiny_model_dir / "model.safetensors")
    assert max((shortcut[name] - initial[name]).abs().max().item() for name in initial) > 1e-4
    # float64 roundoff of passes cut into different length buckets, as AdamW's 1/sqrt(v) scales it
    assert max((shortcut[name] - plain[name]).abs().max().item() for name in shortcut) < 1e-9
