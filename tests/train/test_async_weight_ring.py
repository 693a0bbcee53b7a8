"""The ring through which the trainer hands the generator process its weights
(`pacs.train.async_generator`: `WeightRing`, `RingReader`): a push takes a slot the generator has
released and never one it may still read, the generator loads the newest version noted when a
batch starts, and what it then samples is what the trainer's weights sample, bit for bit."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.multiprocessing as mp
from pushed_weights import equal as equal_rollouts
from pushed_weights import perturbed, sampled_by_generator, sampled_in_a_fresh_process, start_generator, whole_weights
from torchrun_jobs import TESTS, read_jsonl, torchrun

from pacs.models.loading import load_causal_lm
from pacs.rollout.base import SamplingParams
from pacs.train.async_generator import RingReader, RolloutPipeline, WeightRing, version_of

CPU = torch.device("cpu")


def weights_of(value: float):
    """Two tensors filled with `value`, as a weight source."""
    return lambda: [("a", torch.full((2, 3), value)), ("b", torch.full((4,), value))]


def ring(slots: int) -> WeightRing:
    return WeightRing(slots, CPU, torch.float32, mp.get_context("spawn").Semaphore(slots), lambda: None, timeout_s=60)


def test_pushes_take_the_slots_in_turn_and_the_first_shares_the_layout_and_the_slots():
    weights = ring(2)
    slot, shared = weights.write(weights_of(1.0))
    assert slot == 0 and shared.layout == [("a", (2, 3)), ("b", (4,))] and len(shared.slots) == 2
    assert all(buffer.is_shared() for buffer in shared.slots)
    assert weights.write(weights_of(2.0)) == (1, None)
    assert torch.equal(weights.buffers[0], torch.ones(10)) and torch.equal(weights.buffers[1], torch.full((10,), 2.0))


def test_a_push_waits_for_the_generator_to_release_the_slot_it_overwrites():
    weights = ring(2)
    weights.write(weights_of(1.0))
    weights.write(weights_of(2.0))
    third = threading.Thread(target=weights.write, args=(weights_of(3.0),))
    third.start()
    third.join(timeout=1.5)
    assert third.is_alive(), "a third push overwrote a slot the generator had not released"
    assert torch.equal(weights.buffers[0], torch.ones(10))
    weights.free.release()
    third.join(timeout=30)
    assert not third.is_alive() and torch.equal(weights.buffers[0], torch.full((10,), 3.0))


def test_a_push_of_weights_other_than_the_rings_layout_is_refused_naming_the_weight():
    weights = ring(1)
    weights.write(weights_of(1.0))
    weights.free.release()
    with pytest.raises(ValueError, match=r"weight b \(5,\) where the ring's layout has b \(4,\)"):
        weights.write(lambda: [("a", torch.zeros(2, 3)), ("b", torch.zeros(5))])


def test_the_generator_loads_the_newest_version_noted_and_releases_every_version_once():
    free = mp.get_context("spawn").Semaphore(2)
    writer = WeightRing(2, CPU, torch.float32, free, lambda: None, timeout_s=60)
    reader = RingReader(free)
    reader.note(4, *writer.write(weights_of(4.0)))
    reader.note(5, *writer.write(weights_of(5.0)))
    assert free.get_value() == 1  # version 4 skipped: no batch asked for it
    loaded = []
    reader.load_newest(lambda named: loaded.extend((name, tensor.clone()) for name, tensor in named))
    assert [name for name, _ in loaded] == ["a", "b"] and all(
        torch.equal(tensor, torch.full_like(tensor, 5.0)) for _, tensor in loaded
    )
    assert free.get_value() == 2
    reader.load_newest(loaded.append)
    assert len(loaded) == 2 and free.get_value() == 2  # nothing new: the engine keeps version 5


@pytest.mark.slow
def test_the_generator_samples_with_the_trainers_weights_bit_for_bit(tiny_model_dir):
    model = perturbed(load_causal_lm(str(tiny_model_dir), dtype="float32"), seed=1)
    generator = start_generator(tiny_model_dir, CPU, slots=1)
    try:
        generator.push(0, whole_weights(model))
        pushed = sampled_by_generator(generator, 1, seed=7)
    finally:
        generator.close()
    assert equal_rollouts(pushed, sampled_in_a_fresh_process(tiny_model_dir, whole_weights(model)(), seed=7))
    assert not equal_rollouts(
        pushed, sampled_in_a_fresh_process(tiny_model_dir, [], seed=7)
    )  # the saved weights sample otherwise


@pytest.mark.slow
def test_a_batch_is_sampled_by_the_newest_version_pushed_before_it_was_asked_for(tiny_model_dir):
    older = perturbed(load_causal_lm(str(tiny_model_dir), dtype="float32"), seed=1)
    newer = perturbed(load_causal_lm(str(tiny_model_dir), dtype="float32"), seed=2)
    generator = start_generator(tiny_model_dir, CPU, slots=2)
    try:
        generator.push(0, whole_weights(older))
        generator.push(1, whole_weights(newer))
        pushed = sampled_by_generator(generator, 1, seed=7)
    finally:
        generator.close()
    assert equal_rollouts(pushed, sampled_in_a_fresh_process(tiny_model_dir, whole_weights(newer)(), seed=7))


@pytest.mark.slow
def test_each_fsdp_rank_pushes_its_gathered_weights_to_its_generator_bit_for_bit(tiny_model_dir, tmp_path):
    torchrun(str(TESTS / "pushed_weights.py"), str(tiny_model_dir), str(tmp_path), timeout=300)
    assert [read_jsonl(tmp_path / f"rank{rank}.json")[0]["same"] for rank in (0, 1)] == [[True, True], [True, True]]


class RecordingGenerator:
    """Stands in for `AsyncGenerator`: records what the pipeline sends it, in order."""

    def __init__(self):
        self.sent: list[tuple] = []

    def push(self, version, weights):
        self.sent.append(("weights", version))

    def request(self, step, prompts, params, seed):
        self.sent.append(("generate", step))


@pytest.mark.parametrize("max_staleness", [1, 2])
def test_every_version_pushed_is_followed_by_the_batch_it_samples_and_the_last_ones_are_not_pushed(max_staleness):
    generator = RecordingGenerator()
    pipeline = RolloutPipeline(
        generator,
        max_staleness=max_staleness,
        last_step=6,
        params=SamplingParams(),
        seed=0,
        rank=0,
        next_prompts=lambda: [0],
        token_ids=lambda indices: [[1]] * len(indices),
    )
    pipeline.begin(0, weights_of(0.0))
    for step in range(1, 7):
        pipeline.advance(step, weights_of(float(step)))
    pushed = [version for kind, version in generator.sent if kind == "weights"]
    assert pushed == list(range(0, 6 - max_staleness))
    for index, (kind, version) in enumerate(generator.sent):
        if kind == "weights":
            assert generator.sent[index + 1][0] == "generate"
            assert version_of(generator.sent[index + 1][1], max_staleness) == version
