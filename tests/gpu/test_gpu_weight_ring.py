"""The weight ring on a GPU (`pacs.train.async_generator.WeightRing` on CUDA): the trainer's slots
and events shared with the generator process by CUDA IPC handles, each push one copy on the device
and an event the generator waits for before it loads. Skips without CUDA; the CPU ring's tests
(tests/train/test_async_weight_ring.py) run the same code with the device a CPU."""

from __future__ import annotations

import pytest
import torch
from pushed_weights import equal, perturbed, sampled_by_generator, sampled_here, start_generator, whole_weights

from pacs.models.loading import load_causal_lm

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_a_generator_on_the_trainers_gpu_samples_each_pushed_version_with_its_weights_bit_for_bit(tiny_model_dir):
    device = torch.device("cuda", torch.cuda.current_device())
    model = perturbed(load_causal_lm(str(tiny_model_dir), dtype="float32"), seed=1).to(device)
    generator = start_generator(tiny_model_dir, device, slots=2)
    same = []
    try:
        for version in range(3):  # the third push takes the first slot again
            if version:
                with torch.no_grad():
                    for tensor in model.parameters():
                        tensor.mul_(0.5)
            generator.push(version, whole_weights(model))
            pushed = sampled_by_generator(generator, version + 1, seed=7 + version)
            same.append(equal(pushed, sampled_here(tiny_model_dir, whole_weights(model)(), device, seed=7 + version)))
        assert all(buffer.is_cuda for buffer in generator.ring.buffers)
    finally:
        generator.close()
    assert same == [True, True, True]
