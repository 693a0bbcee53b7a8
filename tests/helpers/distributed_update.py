"""One step's updates on a fixed rollout batch, run by 1 process in the test or by N under torchrun.

The trainer's path after generation and scoring: old log-probs, reference log-probs, critic
values, `prepare_step`, the critic's and the policy's updates. Every rank builds the same global
batch of PROMPTS prompts x GROUP_SIZE responses (fixed seed) and keeps its share
(`World.shard_prompts`), exactly as the trainer does with the prompts it draws.

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 tests/helpers/distributed_update.py MODEL_DIR OUT_DIR MODE CASE... [MODE CASE...]...

writes OUT_DIR/MODE/CASE.safetensors (the full policy and critic weights after the step) and
OUT_DIR/MODE/CASE.json (the metrics the updates report) from rank 0, for every MODE and its cases
in turn (one launch: the start-up of torchrun and its processes is paid once).
A MODE is a strategy, "ddp" or "fsdp", or "ddp-local-totals": DDP with each rank's loss normalised
by its own rows and tokens instead of the global mini-batch's (the mistake the exactness tests
must catch).
A case is "algorithm:loss_agg", or "algorithm:loss_agg:lora" to train LoRA adapters (rank 4, on
every linear projection; the reference is the policy with its adapters disabled), ":packed" after
either for padding-free passes (`UpdateSettings.padding_free`, the no-grad passes too), ":tokens"
for micro-batches of at most MICRO_BATCH_TOKENS tokens (`UpdateSettings.micro_batch_tokens`, the
no-grad passes too), ":tools" for responses that
hold a tool's output (`tool_tokens`); "NAME/" before
either takes the model in MODEL_DIR/NAME instead of MODEL_DIR itself (one launch, many models).
`--checks OUT.json` then runs `distributed_checks.observe` on the model in MODEL_DIR, in the same
launch, and writes what it saw to OUT.json; after `World.close`, rank 0 writes beside it
after_close.json: how many wrapped models are still waiting for the garbage collector.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import gc
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from batches import policy_batch
from distributed_checks import observe
from exact_float64 import normalise_float64_in_float64
from safetensors.torch import save_file
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel

from pacs.algos.base import MiniBatchTotals
from pacs.config import ALGORITHM_CONFIGS
from pacs.distributed import collectives
from pacs.distributed.collectives import barrier
from pacs.distributed.state_dict import full_tensors_on_rank0, named_state
from pacs.distributed.world import World
from pacs.distributed.wrapping import unwrap, wrap_model
from pacs.models.loading import load_causal_lm, load_value_model
from pacs.models.lora import add_lora
from pacs.train import update as update_module
from pacs.train.batch import PolicyBatch
from pacs.train.logprobs import response_logprobs_no_grad, response_values_no_grad
from pacs.train.update import UpdateSettings, update_critic, update_policy

PROMPTS = 8
GROUP_SIZE = 4
MINI_BATCH_PROMPTS = 4
MICRO_BATCH_SIZE = 3
"""Sequences per pass: splits groups across micro-batches on purpose."""
MICRO_BATCH_TOKENS = 20
"""Tokens per pass in the ":tokens" cases: rows hold 4-16 tokens, so micro-batches of 1-3 rows,
cut where either rank's would pass it."""


def global_rollouts(vocab_size: int) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    """(prompt, response, reward) for every row: ragged lengths, fractional rewards, and groups that
    are mixed, all-correct and all-wrong."""
    generator = torch.Generator().manual_seed(1234)
    rows = []
    for prompt_index in range(PROMPTS):
        prompt = torch.randint(0, vocab_size, (int(torch.randint(3, 9, (1,), generator=generator)),), generator=generator)
        for response_index in range(GROUP_SIZE):
            length = int(torch.randint(1, 9, (1,), generator=generator))
            response = torch.randint(0, vocab_size, (length,), generator=generator)
            if prompt_index % 4 == 0:
                reward = 1.0
            elif prompt_index % 4 == 1:
                reward = 0.0
            else:
                reward = [1.0, 0.0, 0.5, 0.0][(response_index + prompt_index) % GROUP_SIZE]
            rows.append((prompt, response, reward))
    return rows


def tool_tokens(response_length: int) -> torch.Tensor:
    """1 where a response's token is the model's, 0 where it is a tool's output: tokens 1 and 2 of
    a response of 4 or more, and the last token of one of 6 or more (a response cut in a tool's output)."""
    model_tokens = torch.ones(response_length)
    if response_length >= 4:
        model_tokens[1:3] = 0
    if response_length >= 6:
        model_tokens[-1] = 0
    return model_tokens


def local_batch(world: World, vocab_size: int, *, with_tools: bool = False) -> PolicyBatch:
    """This rank's share of the global batch: whole groups, in the trainer's order; with tool
    tokens (`tool_tokens`) when `with_tools`."""
    rows = global_rollouts(vocab_size)
    prompts = world.shard_prompts(list(range(PROMPTS)), MINI_BATCH_PROMPTS)
    mine = [rows[p * GROUP_SIZE + j] for p in prompts for j in range(GROUP_SIZE)]
    prompts, responses, rewards = zip(*mine)
    model_tokens = [tool_tokens(len(response)) for response in responses] if with_tools else None
    return policy_batch(prompts, responses, rewards, model_tokens=model_tokens)


def run_case(world: World, model_dir: str, case: str) -> tuple[dict[str, torch.Tensor] | None, dict[str, float]]:
    """The step of `case` ("[NAME/]algorithm:loss_agg[:lora][:tools][:packed][:tokens]", KL and entropy terms on): the full
    weights after it on rank 0 (policy keys as they are, critic keys prefixed "critic."), None
    elsewhere, and the metrics of the critic's and the policy's updates."""
    model_name, _, case = case.rpartition("/")
    model_dir = str(Path(model_dir) / model_name)
    name, loss_agg, *variant = case.split(":")
    lora, padding_free = "lora" in variant, "packed" in variant
    micro_batch_tokens = MICRO_BATCH_TOKENS if "tokens" in variant else None
    options = ALGORITHM_CONFIGS[name](loss_agg=loss_agg, kl_coef=0.05, kl_estimator="k2", entropy_coef=0.01)
    algorithm = options.build(group_size=GROUP_SIZE, max_response_length=8)
    torch.manual_seed(0)
    model = load_causal_lm(model_dir, dtype="float64")
    reference = None if lora else copy.deepcopy(model).eval()
    if lora:
        model = add_lora(model, rank=4, alpha=8.0, dropout=0.0, target_modules="all-linear")
    critic = load_value_model(model_dir, dtype="float64") if "values" in algorithm.needs else None
    batch = local_batch(world, model.config.vocab_size, with_tools="tools" in variant).to(world.device)

    model = wrap_model(world, model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    if critic is not None:
        critic = wrap_model(world, critic)
        critic_optimizer = torch.optim.AdamW(critic.parameters(), lr=1e-2)
    settings = UpdateSettings(
        mini_batch_size=MINI_BATCH_PROMPTS // world.world_size,
        micro_batch_size=MICRO_BATCH_SIZE,
        epochs=2,
        grad_clip=0.5,
        padding_free=padding_free,
        micro_batch_tokens=micro_batch_tokens,
    )
    passes = {
        "micro_batch_size": MICRO_BATCH_SIZE,
        "micro_batch_tokens": micro_batch_tokens,
        "world": world,
        "padding_free": padding_free,
    }
    batch.old_logprobs = response_logprobs_no_grad(model, batch, **passes)
    if lora:
        with unwrap(model).disable_adapter():
            batch.row_terms["ref_logprobs"] = response_logprobs_no_grad(model, batch, **passes)
    else:
        batch.row_terms["ref_logprobs"] = response_logprobs_no_grad(reference, batch, **passes)
    if critic is not None:
        batch.row_terms["values"] = response_values_no_grad(critic, batch, **passes)
    batch.row_terms.update(
        algorithm.prepare_step(batch.tensors(), sum_over_ranks=lambda value: collectives.sum_over_ranks(world, value))
    )
    metrics = update_critic(critic, critic_optimizer, world, batch, algorithm, settings) if critic is not None else {}
    metrics.update(update_policy(model, optimizer, world, batch, algorithm, settings))

    weights = full_weights(world, model)
    if critic is not None:
        critic_weights = full_weights(world, critic)
        if weights is not None:
            weights.update({f"critic.{key}": value for key, value in critic_weights.items()})
    return weights, metrics


def full_weights(world: World, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """The whole model's state on rank 0, gathered as checkpoints gather it (None elsewhere)."""
    gathered = dict(full_tensors_on_rank0(world, named_state(model)))
    return gathered if world.is_writer else None


MODES = {"ddp": ("ddp", False), "fsdp": ("fsdp", False), "ddp-local-totals": ("ddp", True)}
"""MODE -> (strategy, whether each rank normalises by its own totals)."""


@contextlib.contextmanager
def local_totals() -> Iterator[None]:
    """Normalise by each rank's own rows and tokens (and statistics), not the global mini-batch's,
    until the block ends."""
    global_totals, world_sum = update_module.global_totals, collectives.sum_over_ranks
    update_module.global_totals = lambda minibatch, world: MiniBatchTotals.of(minibatch.response_mask)
    collectives.sum_over_ranks = lambda world, value: value.clone()
    try:
        yield
    finally:
        update_module.global_totals, collectives.sum_over_ranks = global_totals, world_sum


def cases_by_mode(arguments: list[str]) -> list[tuple[str, list[str]]]:
    """ "MODE CASE... MODE CASE..." -> [(MODE, [CASE, ...]), ...]; raises on a case before any MODE
    or a MODE without cases."""
    groups: list[tuple[str, list[str]]] = []
    for argument in arguments:
        if argument in MODES:
            groups.append((argument, []))
        elif not groups:
            raise SystemExit(f"case {argument!r} comes before any mode; modes: {', '.join(MODES)}")
        else:
            groups[-1][1].append(argument)
    empty = [mode for mode, cases in groups if not cases]
    if empty or not groups:
        raise SystemExit(f"every mode needs at least one case; none after {empty or 'MODE'}")
    return groups


def save_case(out_dir: Path, case: str, weights: dict[str, torch.Tensor], metrics: dict[str, float]) -> None:
    path = out_dir / f"{case}.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({key: value.clone() for key, value in weights.items()}, str(path))
    path.with_suffix(".json").write_text(json.dumps(metrics))


def main() -> None:
    normalise_float64_in_float64()
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("modes_and_cases", nargs="+", metavar="MODE CASE...")
    parser.add_argument("--checks", type=Path, metavar="OUT.json")
    args = parser.parse_args()
    groups = cases_by_mode(args.modes_and_cases)
    world = World.from_environment(MODES[groups[0][0]][0])
    try:
        for mode, cases in groups:
            strategy, own_totals = MODES[mode]
            mode_world = dataclasses.replace(world, strategy=strategy)
            with local_totals() if own_totals else contextlib.nullcontext():
                for case in cases:
                    weights, metrics = run_case(mode_world, args.model_dir, case)
                    if weights is not None:
                        save_case(args.out_dir / mode, case, weights, metrics)
        if args.checks is not None:
            seen = observe(dataclasses.replace(world, strategy="fsdp"), args.model_dir)
            if seen is not None:
                args.checks.write_text(json.dumps(seen))
        barrier(world)  # no rank tears its process group down while another still uses it (as `train` does)
    finally:
        world.close()
    if args.checks is not None and world.is_writer:
        args.checks.with_name("after_close.json").write_text(json.dumps({"wrapped_models_left": wrapped_models_left()}))


def wrapped_models_left() -> int:
    """FSDP- or DDP-wrapped modules that are unreachable but not yet freed: what interpreter exit
    would free (`World.close`)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.collect()
    left = sum(isinstance(thing, (FSDPModule, DistributedDataParallel)) for thing in gc.garbage)
    gc.set_debug(0)
    gc.garbage.clear()
    return left


if __name__ == "__main__":
    main()
