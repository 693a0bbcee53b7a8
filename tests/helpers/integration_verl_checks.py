"""The verl integration's checks, run in the verl venv (.peer-venvs/verl) by
tests/integrations/test_integration_verl.py, which asserts on the JSON this writes:
`python integration_verl_checks.py OUT_JSON`.

verl's trainer needs Ray workers and a rollout server, which this CPU venv does not start; the
checks run the steps a step of verl's default (v1) trainer and its FSDP actor take, with verl's own
functions, on float64 tensors standing in for one rollout (log-probs instead of a model):

    balance        `get_seqlen_balanced_partitions(calculate_workload(lengths), k_partitions=dp,
                   equal_size=True)` and `DataProto.reorder` (the v1 trainer's `_balance_batch`)
    correction     `compute_rollout_correction_and_add_to_batch` (algorithm.rollout_correction)
    advantages     `core_algos.get_adv_estimator_fn(name)(token_level_rewards=..., response_mask=...,
                   config=..., index=uid)`, as `ray_trainer.compute_advantage` calls a registered
                   estimator (that module imports verl's server stack, not installed here)
    actor          `left_right_2_no_padding`, one contiguous share per data-parallel rank,
                   `tu.make_iterator` (mini-batches, actor.shuffle on), `prepare_micro_batches`
                   (use_dynamic_bsz on: micro-batches packed by token count) and `ppo_loss` per
                   micro-batch, its gradients summed and averaged over ranks as FSDP does

The gradient with respect to the current log-probs, at θ = θ_old, is compared with
`pacs.algos.pacs_loss`'s on the whole batch in group order, each response's part scaled by the
rollout-correction weight verl's settings define (computed here from the log-probs).
Under "baselines", pacs's Dr. GRPO, DAPO, GSPO and CISPO against verl's own loss and advantage
functions (tests/helpers/baselines_verl_checks.py).
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import traceback
from pathlib import Path

import verl  # noqa: F401  (loads the "verl.plugins" entry points: pacs registers itself here)
from verl.trainer.ppo import core_algos

REGISTERED_ON_IMPORT = {
    "policy_loss": "pacs" in core_algos.POLICY_LOSS_REGISTRY,
    "adv_estimator": "pacs" in core_algos.ADV_ESTIMATOR_REGISTRY,
}

import baselines_verl_checks  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.config.algorithm import RolloutCorrectionConfig  # noqa: E402
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions  # noqa: E402
from verl.workers.config import FSDPActorConfig, PolicyLossConfig  # noqa: E402
from verl.workers.engine.utils import prepare_micro_batches  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402
from verl.workers.utils.padding import left_right_2_no_padding  # noqa: E402

import pacs.integrations.verl as integration  # noqa: E402
from pacs.algos import pacs_loss  # noqa: E402
from pacs.algos.pacs import GRPO_SPREAD_FLOOR  # noqa: E402

N, PROMPT_WIDTH, RESPONSE_WIDTH, PROMPTS = 4, 5, 6, 6
REWARDS = [1, 0, 0, 1, 1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 1, 0, 1, 0, 1, 1, 0, 1, 1, 1]
SHIFTS = [0.0, 0.1, -0.25, 0.5, -0.05]
"""Per response (cycled), the sampler's log-prob minus π_old's at every token: the sequence ratio
π_old/μ is exp(−T·shift); 0.5 is rejected by the sequence-level rejection below (mean k3 ≈ 0.107 >
0.05), −0.25 is truncated at 2 when 3 tokens or longer."""
CORRECTION = {"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.05}
MAX_TOKENS_PER_MICRO_BATCH = 24


def rollout(seed: int = 0) -> DataProto:
    """PROMPTS prompts x N responses in group order, as verl's trainer holds them after generation:
    left-padded prompts, right-padded responses, rewards at each response's last token, π_old's and
    the sampler's log-probs, prompt ids (uid), and each row's index (to find it after reordering)."""
    generator = torch.Generator().manual_seed(seed)
    rows = PROMPTS * N
    prompt_lengths = torch.randint(2, PROMPT_WIDTH + 1, (PROMPTS,), generator=generator).repeat_interleave(N)
    response_lengths = torch.randint(1, RESPONSE_WIDTH + 1, (rows,), generator=generator)
    prompt_mask = (torch.arange(PROMPT_WIDTH) >= PROMPT_WIDTH - prompt_lengths.unsqueeze(1)).long()
    response_mask = (torch.arange(RESPONSE_WIDTH) < response_lengths.unsqueeze(1)).long()
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    input_ids = torch.randint(1, 100, (rows, PROMPT_WIDTH + RESPONSE_WIDTH), generator=generator) * attention_mask
    old_log_probs = -torch.rand(rows, RESPONSE_WIDTH, generator=generator, dtype=torch.float64) * response_mask
    shifts = torch.tensor([SHIFTS[row % len(SHIFTS)] for row in range(rows)], dtype=torch.float64)
    scores = torch.zeros(rows, RESPONSE_WIDTH, dtype=torch.float64)
    scores[torch.arange(rows), response_lengths - 1] = torch.tensor(REWARDS[:rows], dtype=torch.float64)
    tensors = {
        "prompts": input_ids[:, :PROMPT_WIDTH], "responses": input_ids[:, PROMPT_WIDTH:], "input_ids": input_ids,
        "attention_mask": attention_mask, "position_ids": (attention_mask.cumsum(dim=1) - 1).clamp(min=0),
        "response_mask": response_mask, "token_level_scores": scores, "old_log_probs": old_log_probs,
        "rollout_log_probs": (old_log_probs + shifts.unsqueeze(1)) * response_mask, "row": torch.arange(rows),
    }  # fmt: skip
    uid = np.array([f"prompt-{row // N}" for row in range(rows)], dtype=object)
    return DataProto.from_dict(tensors=tensors, non_tensors={"uid": uid})


def balanced(batch: DataProto, dp_size: int) -> DataProto:
    """The v1 trainer's `_balance_batch`: rows reordered so that each rank's share has similar workloads."""
    workloads = calculate_workload(batch.batch["attention_mask"].sum(dim=-1))
    partitions = get_seqlen_balanced_partitions(workloads, k_partitions=dp_size, equal_size=True)
    batch.reorder(torch.tensor([row for partition in partitions for row in partition]))
    return batch


def with_advantages(batch: DataProto, name: str, correction: dict | None, index=None) -> DataProto:
    """The trainer's advantage step: the rollout correction (weights, rejected responses' masks
    zeroed), then the registered estimator called as `compute_advantage` calls it."""
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    correction_config = RolloutCorrectionConfig(**correction) if correction else None
    if correction_config is not None:
        batch, _ = compute_rollout_correction_and_add_to_batch(batch, correction_config)
    advantages, returns = core_algos.get_adv_estimator_fn(name)(
        token_level_rewards=batch.batch["token_level_rewards"], response_mask=batch.batch["response_mask"],
        config=AlgoConfig(adv_estimator=name, rollout_correction=correction_config),
        index=batch.non_tensor_batch["uid"] if index is None else index,
    )  # fmt: skip
    batch.batch["advantages"], batch.batch["returns"] = advantages, returns
    return batch


def actor_config(loss_mode: str, mini_batch_prompts: int, **settings) -> FSDPActorConfig:
    options = dict(
        strategy="fsdp", rollout_n=N, ppo_mini_batch_size=mini_batch_prompts, use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu=MAX_TOKENS_PER_MICRO_BATCH, shuffle=True, policy_loss=PolicyLossConfig(loss_mode=loss_mode),
    )  # fmt: skip
    return FSDPActorConfig(**{**options, **settings})


def model_output(log_probs: torch.Tensor, micro) -> torch.Tensor:
    """What the actor's model returns for a micro-batch, in verl's no-padding layout: one jagged row
    per sequence (prompt + response tokens), position p holding the log-prob of token p + 1; taken
    from `log_probs` (rows, RESPONSE_WIDTH) by each row's index, so gradients flow back to it."""
    pieces, lengths = [], []
    prompt_lengths = micro["attention_mask"][:, :PROMPT_WIDTH].sum(dim=-1).tolist()
    response_lengths = micro["attention_mask"][:, PROMPT_WIDTH:].sum(dim=-1).tolist()
    for row, prompt_length, response_length in zip(micro["row"].tolist(), prompt_lengths, response_lengths):
        pieces += [log_probs.new_zeros(prompt_length - 1), log_probs[row, :response_length], log_probs.new_zeros(1)]
        lengths.append(prompt_length + response_length)
    offsets = torch.tensor([0, *np.cumsum(lengths).tolist()])
    return torch.nested.nested_tensor_from_jagged(torch.cat(pieces), offsets=offsets)


def actor_gradients(batch: DataProto, config: FSDPActorConfig, log_probs: torch.Tensor, dp_size: int) -> dict:
    """The actor's update as verl's workers run it (`_update_actor` -> `train_mini_batch` ->
    `forward_backward_batch` -> `ppo_loss`): per mini-batch, the gradient of the micro-batches'
    losses with respect to `log_probs`, summed and averaged over ranks; and how the rows were spread."""
    data = left_right_2_no_padding(batch.to_tensordict())
    mini_batch_rows = config.ppo_mini_batch_size * N
    tu.assign_non_tensor(data, global_batch_size=mini_batch_rows)
    shares = tu.chunk_tensordict(data, dp_size)  # the dispatch: one contiguous share per rank
    mini_batches = [
        list(tu.make_iterator(share, mini_batch_rows // dp_size, epochs=1, seed=42 + rank, dataloader_kwargs={"shuffle": config.shuffle}))
        for rank, share in enumerate(shares)
    ]  # fmt: skip
    gradients, micro_batch_rows = [], []
    for step in range(len(mini_batches[0])):
        batch_num_tokens = sum(int(ranks[step]["loss_mask"].sum()) for ranks in mini_batches)
        gradient = torch.zeros_like(log_probs)
        for rank in range(dp_size):
            mini_batch = mini_batches[rank][step]
            tu.assign_non_tensor(
                mini_batch, use_dynamic_bsz=config.use_dynamic_bsz, max_token_len_per_gpu=config.ppo_max_token_len_per_gpu,
                micro_batch_size_per_gpu=config.ppo_micro_batch_size_per_gpu, batch_num_tokens=batch_num_tokens,
                dp_size=dp_size, sp_size=1,
            )  # fmt: skip
            micro_batches, _ = prepare_micro_batches(mini_batch, dp_group=None, same_micro_num_in_dp=True)
            for micro in micro_batches:
                loss, _ = ppo_loss(config, {"log_probs": model_output(log_probs, micro)}, micro)
                gradient += torch.autograd.grad(loss, log_probs)[0] / dp_size  # FSDP averages the ranks
                micro_batch_rows.append(micro["row"].tolist())
        gradients.append(gradient)
    return {
        "gradients": gradients,
        "micro_batch_rows": micro_batch_rows,
        "rank_rows": [share["row"].tolist() for share in shares],
    }


def correction_weights(batch: DataProto, correction: dict | None) -> torch.Tensor:
    """(B,) ρ as verl's settings in CORRECTION define it, from the log-probs: the sequence ratio
    truncated at its threshold, 0 for a response whose mean k3 exceeds the rejection threshold."""
    if correction is None:
        return torch.ones(len(batch), dtype=torch.float64)
    mask = batch.batch["response_mask"].double()
    log_ratio = (batch.batch["old_log_probs"] - batch.batch["rollout_log_probs"]) * mask
    ratio = log_ratio.sum(dim=-1).exp().clamp(max=correction["rollout_is_threshold"])
    mean_k3 = ((log_ratio.exp() - 1 - log_ratio) * mask).sum(dim=-1) / mask.sum(dim=-1)
    return ratio * (mean_k3 <= correction["rollout_rs_threshold"])


def exact(name: str, settings: dict, *, dp_size: int = 2, mini_batch_prompts: int = PROMPTS, correction=None) -> dict:
    """verl's pipeline on a rollout vs ρ ⊙ ∇ pacs_loss on it in group order, at θ = θ_old."""
    original = rollout()
    batch = with_advantages(balanced(rollout(), dp_size), name, correction)
    log_probs = original.batch["old_log_probs"].clone().requires_grad_(True)  # θ = θ_old, rows in group order
    update = actor_gradients(batch, actor_config(name, mini_batch_prompts), log_probs, dp_size)
    reference_log_probs = original.batch["old_log_probs"].clone().requires_grad_(True)
    rewards = original.batch["token_level_scores"].sum(dim=-1)
    spread_floor = settings.get("beta", 1.0) * GRPO_SPREAD_FLOOR  # the grpo score's floor, as the integration's
    reference = pacs_loss(
        reference_log_probs, original.batch["old_log_probs"], original.batch["response_mask"], rewards, N, **settings,
        spread_floor=spread_floor,
    )  # fmt: skip
    (reference_gradient,) = torch.autograd.grad(reference, reference_log_probs)
    weights = correction_weights(original, correction)
    mini_batches = len(update["gradients"])
    expected = mini_batches * weights.unsqueeze(-1) * reference_gradient  # each mini-batch normalised by its own size
    total = sum(update["gradients"])
    prompts_of_rank = [{row // N for row in rows} for rows in update["rank_rows"]]
    return {
        "mini_batches": mini_batches,
        "micro_batches": len(update["micro_batch_rows"]),
        "micro_batch_sizes": sorted({len(rows) for rows in update["micro_batch_rows"]}),
        "prompts_split_across_ranks": len(set.intersection(*prompts_of_rank)),
        "groups_whole_in_a_micro_batch": sum(
            any({*range(g * N, (g + 1) * N)} <= set(rows) for rows in update["micro_batch_rows"]) for g in range(PROMPTS)
        ),
        "weights": weights.tolist(),
        "max_abs_grad_diff": (total - expected).abs().max().item(),
        "max_abs_grad": expected.abs().max().item(),
    }


def refusal(call) -> str | None:
    try:
        call()
    except ValueError as error:
        return str(error)
    return None


def loss_on(batch: DataProto, config: FSDPActorConfig) -> None:
    log_probs = batch.batch["old_log_probs"].clone().requires_grad_(True)
    actor_gradients(batch, config, log_probs, dp_size=1)


def refusals() -> dict:
    def advantages_with(correction=None, index=None, scale=1.0):
        batch = rollout()
        batch.batch["token_level_scores"] = batch.batch["token_level_scores"] * scale
        return lambda: with_advantages(batch, "pacs", correction, index)

    def loss_with(correction=None, per_token_advantages=False, **settings):
        batch = with_advantages(rollout(), "pacs", correction)
        if per_token_advantages:
            batch.batch["advantages"] = batch.batch["advantages"] * torch.linspace(0.5, 1.5, RESPONSE_WIDTH)
        return lambda: loss_on(batch, actor_config("pacs", PROMPTS, **settings))

    def token_level_weights():  # the weights a token-level correction hands the actor, past the estimator's check
        batch = with_advantages(rollout(), "pacs", {**CORRECTION, "rollout_is": "sequence"})
        batch.batch["rollout_is_weights"] = batch.batch["rollout_is_weights"] * torch.linspace(0.5, 1.5, RESPONSE_WIDTH)
        return loss_on(batch, actor_config("pacs", PROMPTS))

    return {
        "rewards_outside_0_1": refusal(advantages_with(scale=2.0)),
        "no_prompt_ids": refusal(
            lambda: core_algos.get_adv_estimator_fn("pacs")(
                token_level_rewards=torch.zeros(2, 3),
                response_mask=torch.ones(2, 3),
                config=AlgoConfig(adv_estimator="pacs"),
            )
        ),  # fmt: skip
        "token_level_is": refusal(advantages_with({**CORRECTION, "rollout_is": "token"})),
        "token_level_rejection": refusal(
            advantages_with({**CORRECTION, "rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_2.0"})
        ),
        "bypass_mode": refusal(advantages_with({**CORRECTION, "bypass_mode": True})),
        "token_level_weights": refusal(token_level_weights),
        "per_token_advantages": refusal(loss_with(per_token_advantages=True)),
        "one_response_per_prompt": refusal(loss_with(rollout_n=1)),
    }


def failed_registration() -> dict:
    """pacs's module run again (as verl's plugin loader runs it) while "pacs" names another
    estimator: what it logs and raises. The registries are restored after."""
    saved = dict(core_algos.ADV_ESTIMATOR_REGISTRY), dict(core_algos.POLICY_LOSS_REGISTRY)
    core_algos.ADV_ESTIMATOR_REGISTRY["pacs"] = core_algos.ADV_ESTIMATOR_REGISTRY["grpo"]
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("pacs.integrations.verl").addHandler(handler)
    try:
        importlib.reload(integration)
        raised = None
    except ValueError as error:
        raised = str(error)
    finally:
        logging.getLogger("pacs.integrations.verl").removeHandler(handler)
        core_algos.ADV_ESTIMATOR_REGISTRY.clear()
        core_algos.ADV_ESTIMATOR_REGISTRY.update(saved[0])
        core_algos.POLICY_LOSS_REGISTRY.clear()
        core_algos.POLICY_LOSS_REGISTRY.update(saved[1])
    return {"raised": raised, "logged": [(record.levelname, record.getMessage()) for record in records]}


def main() -> None:
    out_path = Path(sys.argv[1])
    torch.set_num_threads(1)
    integration.register("pacs_grpo_beta2", beta=2.0, estimator="grpo", weighting="none")
    grpo_beta2 = {"beta": 2.0, "estimator": "grpo", "weighting": "none"}
    checks = {
        "defaults": lambda: exact("pacs", {}),
        "sampler_correction": lambda: exact("pacs", {}, correction=CORRECTION),
        "two_mini_batches": lambda: exact("pacs", {}, mini_batch_prompts=PROMPTS // 2),
        "one_rank_grpo_beta2": lambda: exact("pacs_grpo_beta2", grpo_beta2, dp_size=1),
        "refusals": refusals,
        "baselines": baselines_verl_checks.results,
        "failed_registration": failed_registration,  # last: it runs pacs's module again
    }
    results = {"registered_on_import": REGISTERED_ON_IMPORT}
    for name, check in checks.items():
        try:
            results[name] = check()
        except Exception:
            results[name] = {"error": traceback.format_exc()}
    out_path.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
