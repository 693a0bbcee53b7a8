"""The trainer's update applies the exact PACS mini-batch gradient at any micro-batch size."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from batches import policy_batch

from pacs.algos import pacs_loss
from pacs.algos.pacs import GRPO_SPREAD_FLOOR, PACS
from pacs.distributed.world import World
from pacs.models.loading import load_causal_lm
from pacs.train import update as update_module
from pacs.train.batch import PolicyBatch
from pacs.train.logprobs import response_logprobs, response_logprobs_no_grad
from pacs.train.update import UpdateSettings, scheduled_learning_rate, update_policy

GROUP_SIZE = 4
PROMPTS = 4


def random_batch(vocab_size: int, generator: torch.Generator) -> PolicyBatch:
    """4 prompts x 4 responses of random tokens, ragged prompt and response lengths, and
    rewards with mixed, all-correct and all-wrong groups."""
    prompts, responses = [], []
    for _ in range(PROMPTS):
        prompt = torch.randint(0, vocab_size, (int(torch.randint(3, 9, (1,), generator=generator)),), generator=generator)
        for _ in range(GROUP_SIZE):
            prompts.append(prompt)
            length = int(torch.randint(1, 7, (1,), generator=generator))
            responses.append(torch.randint(0, vocab_size, (length,), generator=generator))
    return policy_batch(prompts, responses, [1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0])


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir), dtype="float64")
    batch = random_batch(model.config.vocab_size, torch.Generator().manual_seed(0))
    batch.old_logprobs = response_logprobs_no_grad(model, batch, micro_batch_size=5)
    return model, batch


def exactness_optimizer(model) -> torch.optim.Optimizer:
    """Plain SGD: the weights then differ by lr x the gradients' difference. (AdamW divides by
    sqrt(v) + 1e-8 and turns a 1e-13 difference in a gradient entry near 1e-8 into 1e-7.)"""
    return torch.optim.SGD(model.parameters(), lr=0.1)


def run_trainer_update(model, batch, micro_batch_size: int, *, mini_batch_size=2, epochs=2, **pacs_options):
    model = copy.deepcopy(model)
    optimizer = exactness_optimizer(model)
    settings = UpdateSettings(mini_batch_size=mini_batch_size, micro_batch_size=micro_batch_size, epochs=epochs, grad_clip=1.0)
    update_policy(model, optimizer, World.single(), batch, PACS(GROUP_SIZE, **pacs_options), settings)
    return model


def run_reference_update(model, batch, *, mini_batch_size=2, epochs=2, **pacs_options):
    """The definition: pacs_loss on each whole mini-batch, one backward, one optimizer step."""
    model = copy.deepcopy(model)
    optimizer = exactness_optimizer(model)
    rows = mini_batch_size * GROUP_SIZE
    for _ in range(epochs):
        for start in range(0, len(batch), rows):
            minibatch = batch.rows(slice(start, start + rows))
            logprobs = response_logprobs(model, minibatch)
            spread_floor = pacs_options.get("beta", 1.0) * GRPO_SPREAD_FLOOR  # the grpo score's, as the trainer's
            loss = pacs_loss(
                logprobs, minibatch.old_logprobs, minibatch.response_mask, minibatch.rewards, GROUP_SIZE, **pacs_options,
                spread_floor=spread_floor,
            )  # fmt: skip
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
    return model


def max_weight_difference(first, second) -> float:
    return max((a - b).abs().max().item() for a, b in zip(first.parameters(), second.parameters()))


@pytest.mark.slow
@pytest.mark.parametrize("micro_batch_size", [1, 3, 5, 8, 16])
def test_off_policy_updates_match_whole_minibatch_loss_at_any_micro_batch_size(setup, micro_batch_size):
    model, batch = setup
    reference = run_reference_update(model, batch, beta=2.0)
    trained = run_trainer_update(model, batch, micro_batch_size, beta=2.0)
    assert max_weight_difference(trained, model) > 1e-4, "the update must move the weights"
    assert max_weight_difference(trained, reference) < 1e-10


@pytest.mark.parametrize(
    "options",
    [
        {"proxy": "mean_logprob", "estimator": "rloo", "weighting": "question"},
        {"proxy": "logratio", "estimator": "grpo", "weighting": "none"},
        {"proxy": "logratio", "estimator": "naive", "weighting": "only_positive"},
    ],
)
@pytest.mark.slow
def test_every_pacs_option_matches_whole_minibatch_loss_with_split_groups(setup, options):
    model, batch = setup
    reference = run_reference_update(model, batch, **options)
    trained = run_trainer_update(model, batch, 3, **options)
    # grpo's estimator divides by each group's std of r, which is small after one update, so
    # roundoff (1e-16) in r reaches the weights as ~1e-10 there
    assert max_weight_difference(trained, reference) < 1e-9


def test_first_update_after_rollout_skips_the_no_grad_pass(setup, monkeypatch):
    model, batch = setup
    calls = []
    original = update_module.response_logprobs_no_grad
    monkeypatch.setattr(update_module, "response_logprobs_no_grad", lambda *a, **k: calls.append(1) or original(*a, **k))
    run_trainer_update(model, batch, 3, mini_batch_size=PROMPTS, epochs=1)
    assert calls == []
    run_trainer_update(model, batch, 3, mini_batch_size=2, epochs=1)
    assert len(calls) == 1, "the second mini-batch is off-policy and needs one no-grad pass"


def test_a_minibatch_that_is_one_micro_batch_takes_one_forward_per_update(setup, monkeypatch):
    model, batch = setup
    passes = {"with_grad": 0, "no_grad": 0}

    def counted(name, function):
        return lambda *a, **k: passes.__setitem__(name, passes[name] + 1) or function(*a, **k)

    monkeypatch.setattr(update_module, "response_logprobs", counted("with_grad", response_logprobs))
    monkeypatch.setattr(update_module, "response_logprobs_no_grad", counted("no_grad", response_logprobs_no_grad))
    run_trainer_update(model, batch, 2 * GROUP_SIZE, mini_batch_size=2, epochs=2)
    assert passes == {"with_grad": 4, "no_grad": 0}, "4 updates of one micro-batch each"


def test_update_with_non_finite_loss_is_skipped_and_counted(setup):
    model, batch = setup
    broken = copy.deepcopy(batch)
    broken.old_logprobs = broken.old_logprobs.clone()
    broken.old_logprobs[2 * GROUP_SIZE, 0] = float("nan")  # the second update's, off-policy: its loss is nan
    trained = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-2)
    settings = UpdateSettings(mini_batch_size=2, micro_batch_size=4, epochs=1, grad_clip=1.0)
    metrics = update_policy(trained, optimizer, World.single(), broken, PACS(GROUP_SIZE), settings)
    assert metrics["updates/skipped"] == 1.0
    assert all(torch.isfinite(p).all() for p in trained.parameters())


@pytest.mark.slow
def test_pacs_with_kl_and_entropy_gives_the_same_update_at_any_micro_batch_size(setup):
    model, batch = setup
    regularised = copy.deepcopy(batch)
    regularised.row_terms["ref_logprobs"] = regularised.old_logprobs - 0.1
    options = {"kl_coef": 0.5, "entropy_coef": 0.1, "max_response_length": 8}
    whole = run_trainer_update(model, regularised, 16, **options)
    split = run_trainer_update(model, regularised, 3, **options)
    plain = run_trainer_update(model, batch, 16)
    assert max_weight_difference(whole, split) < 1e-10
    assert max_weight_difference(whole, plain) > 1e-6, "the penalty and the bonus must change the update"


@pytest.mark.parametrize(
    "schedule, expected",
    [
        ("constant", [1.0, 1.0, 1.0, 1.0]),
        ("linear", [1.0, 0.75, 0.5, 0.25]),
        ("cosine", [1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4))]),
    ],
)
def test_the_learning_rate_of_each_step_follows_its_schedule(schedule, expected):
    assert [scheduled_learning_rate(2.0, schedule, step, 4) for step in (1, 2, 3, 4)] == pytest.approx([2 * e for e in expected])
