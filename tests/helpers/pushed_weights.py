"""What a generator process samples after weights were pushed to it through the ring
(`pacs.train.async_generator`), against what the same weights sample in this process: equal bit
for bit exactly when the generator holds the trainer's weights bit for bit (one thread each, the
same seed, the same engine code). Used by one process in the tests, and by 2 under torchrun:

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 tests/helpers/pushed_weights.py MODEL_DIR OUT_DIR

where each FSDP rank pushes its `policy_weights` (gathered one tensor at a time) to a generator of
its own and writes OUT_DIR/rank{r}.json: whether each version it pushed sampled what the whole
weights sample here.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from pacs.models.loading import load_causal_lm, load_tokenizer
from pacs.rollout.base import Rollouts, SamplingParams
from pacs.rollout.hf import TransformersEngine
from pacs.train.async_generator import ROLLOUT_FIELDS, AsyncGenerator, GeneratorSpec, _visible_device

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
PARAMS = SamplingParams(n=2, temperature=1.0, max_new_tokens=12, return_logprobs=True)


def perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """`model` with every floating-point weight moved by noise drawn from `seed` (in place)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.add_(0.05 * torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype))
    return model


def start_generator(model_dir: Path, device: torch.device, slots: int) -> AsyncGenerator:
    """A transformers generator process on `device` (one thread, float32) reading a ring of `slots`."""
    spec = GeneratorSpec(
        model_path=str(model_dir),
        engine="hf",
        dtype="float32",
        device=_visible_device(device),
        threads=1,
        max_sequences_per_call=64,
        max_model_len=64,
        seed=0,
    )
    return AsyncGenerator(spec, timeout_s=120, device=device, slots=slots)


def sampled_by_generator(generator: AsyncGenerator, step: int, seed: int) -> Rollouts:
    generator.request(step, PROMPTS, PARAMS, seed)
    received, rollouts, _ = generator.receive()
    assert received == step
    return rollouts


def sampled_here(model_dir: Path, weights: Iterable[tuple[str, torch.Tensor]], device: torch.device, seed: int) -> Rollouts:
    """What the generator's engine samples with `weights` (whole, by name), built in this process."""
    model = load_causal_lm(str(model_dir), dtype="float32").to(device).eval()
    state = model.state_dict()
    with torch.no_grad():
        for name, tensor in weights:
            state[name].copy_(tensor)
    engine = TransformersEngine(model, load_tokenizer(str(model_dir)), max_sequences_per_call=64)
    torch.manual_seed(seed)
    with torch.inference_mode():
        return engine.generate(PROMPTS, PARAMS)


def sampled_in_a_fresh_process(model_dir: Path, weights: Iterable[tuple[str, torch.Tensor]], seed: int) -> Rollouts:
    """`sampled_here` on the CPU in a new interpreter, as the generator samples in its own: what
    earlier tests left in this process's global state (torch's, transformers') cannot change it."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_sampled_on_one_cpu_thread, str(model_dir), dict(weights), seed).result(timeout=300)


def _sampled_on_one_cpu_thread(model_dir: str, weights: dict[str, torch.Tensor], seed: int) -> Rollouts:
    torch.set_num_threads(1)
    return sampled_here(Path(model_dir), weights.items(), torch.device("cpu"), seed)


def equal(first: Rollouts, second: Rollouts) -> bool:
    return all(torch.equal(getattr(first, name).cpu(), getattr(second, name).cpu()) for name in ROLLOUT_FIELDS)


def whole_weights(model: torch.nn.Module) -> Callable[[], Iterable[tuple[str, torch.Tensor]]]:
    return lambda: ((name, tensor.detach()) for name, tensor in model.state_dict().items())


def main(model_dir: Path, out_dir: Path) -> None:
    """Each FSDP rank: push two versions through its ring (one slot), sample after each."""
    from pacs.distributed.world import World
    from pacs.distributed.wrapping import wrap_model
    from pacs.train.colocated_engine import policy_weights

    torch.set_num_threads(1)
    world = World.from_environment("fsdp", timeout_s=120)
    reference = perturbed(load_causal_lm(str(model_dir), dtype="float32"), seed=1)
    policy = wrap_model(world, perturbed(load_causal_lm(str(model_dir), dtype="float32"), seed=1))
    generator = start_generator(model_dir, world.device, slots=1)
    same = []
    try:
        for version in (0, 1):
            if version:
                with torch.no_grad():
                    for tensor in [*policy.parameters(), *reference.parameters()]:
                        tensor.mul_(0.5)
            generator.push(version, lambda: policy_weights(policy, torch.float32))
            seed = 100 + version + 10 * world.rank
            pushed = sampled_by_generator(generator, version + 1, seed)
            same.append(equal(pushed, sampled_here(model_dir, whole_weights(reference)(), world.device, seed)))
    finally:
        generator.close()
    (out_dir / f"rank{world.rank}.json").write_text(json.dumps({"same": same}))
    world.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
