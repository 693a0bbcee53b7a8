"""PACS for TRL users: `PACSTrainer` and `PACSConfig` in place of TRL's `GRPOTrainer` and `GRPOConfig`.

    from pacs.integrations.trl import PACSConfig, PACSTrainer

    args = PACSConfig(output_dir="out", num_generations=8, pacs_beta=1.0)   # any GRPOConfig argument
    trainer = PACSTrainer(model=..., reward_funcs=..., args=args, train_dataset=...)
    trainer.train()

The same dataset, reward functions and TRL arguments; the loss is PACS's (`pacs.algos.pacs`) with
the logratio proxy r_i = β · Σ_t m_it (log π_θ(o_it) − log π_old(o_it)), β = ``pacs_beta``, the
score ``pacs_estimator`` ("rloo", "grpo", "naive") and the class weights ``pacs_weighting``
("question", "none", "only_positive", "only_negative"). The verifier reward R_i is the weighted sum
of the reward functions (TRL's ``reward_weights``) and must lie in [0, 1]: it is the BCE target. A
function returning None counts as 0 in that sum, as in TRL; a completion that no function scored
is left out of its prompt's group (TRL's "unscorable": no gradient, not in the baseline) and of
the loss's mean.

Exact under TRL's micro-batching, gradient accumulation and data-parallel processes. TRL generates
one batch of G groups of n completions (over all processes), shuffles it and splits it into
``steps_per_generation`` micro-batches, so a group's completions land in different micro-batches
and processes. ψ_i needs the whole group, but r_i depends on row i alone, and while θ = θ_old (the
batch's one optimizer step) r = 0 in closed form; so the constants c_i = ∂L/∂r_i are computed
once from the whole batch's rewards (`pacs.algos.pacs_advantages`), and each micro-batch
backpropagates Σ_{i ∈ micro} c_i · r_i(θ):

    Σ_micro ∇_θ Σ_{i ∈ micro} c_i · r_i(θ) = Σ_i c_i ∇_θ r_i(θ) = ∇_θ L,
    L = 1/B · Σ_i w_i · BCE(ψ_i, R_i)

over the B (scored) completions of the generation batch. The value returned for each micro-batch
is L / (accumulation steps), so TRL's logged ``loss`` is L; ``pacs/loss`` is logged too.

With vLLM (``use_vllm=True``), TRL's mismatch correction (``vllm_importance_sampling_correction``,
on by default) is kept, in the form pacs's trainer uses (approximate on later updates, see
`pacs.algos.pacs`): completion k's whole coefficient is
scaled by its own sequence-level weight, c'_k = ρ_k · c_k (`pacs.algos.sampler_corrected_coefficients`),
ρ_k = π_old(o_k) / μ(o_k) as TRL computes it in the ``sequence_mask`` (its default: 0 outside
[clip_min, clip_max]) or ``sequence_truncate`` mode; the token-level modes are refused.
``off_policy_mask_threshold`` (DeepSeek-V3.2's off-policy sequence mask, TRL's own
``get_off_policy_mask``) multiplies ρ_k by 0 for a completion of negative advantage (c_k > 0) whose
mean sampler-vs-trainer KL exceeds the threshold.

Checkpoints: `PACSConfig` and `PACSTrainer` are module-level classes of `pacs.integrations.trl_trainer`,
so TRL's checkpoints (``save_steps``, ``save_model``) pickle the config and
``trainer.train(resume_from_checkpoint=...)`` continues the run; PACS keeps no state of its own
across steps (the constants are made from each generation batch).

What that needs, checked by `PACSConfig` (a ValueError lists every setting at fault):
    num_iterations = 1 and steps_per_generation = gradient_accumulation_steps (TRL's defaults): one
        optimizer step per generation batch, so θ = θ_old in every micro-batch;
    beta = 0 (TRL's KL coefficient; PACS's β is ``pacs_beta``), entropy_coef = 0, no adaptive
        entropy, top_entropy_quantile = 1, multi_objective_aggregation = "sum_then_normalize",
        use_liger_kernel = False: terms this loss does not compute;
    with vLLM's correction on, a sequence-level vllm_importance_sampling_mode;
    num_generations_eval >= 2 when set, unless pacs_estimator = "naive" (rloo and grpo compare the
        completions of a prompt).

`model` may also be any model path pacs takes (`trl_model`): ``PACSTrainer(model="builtin:smollm2-135m-instruct", ...)``
trains the real model of docs/real-model.md, converted once into pacs's cache, and a local ``.gguf``
file is converted the same way.

TRL is imported on first use of `PACSConfig` or `PACSTrainer`, never by pacs itself.
"""

from __future__ import annotations

import importlib
from typing import Any

INSTALL = "pip install 'pacs[trl]'"
CLASSES = ("PACSConfig", "PACSTrainer")


def trl_model(model: Any) -> Any:
    """TRL's `model` argument for `model`: a pacs built-in name (``builtin:NAME``) or a local ``.gguf``
    file becomes the folder pacs builds or converts it into (`pacs.models.loading.resolve_model_path`);
    anything else (a hub id, a local folder, a model object) is passed on for TRL to load."""
    from pacs.models.loading import BUILTIN_PREFIX, GGUF_SUFFIX, resolve_model_path

    if isinstance(model, str) and (model.startswith(BUILTIN_PREFIX) or model.endswith(GGUF_SUFFIX)):
        return resolve_model_path(model)
    return model


def __getattr__(name: str) -> Any:
    if name not in CLASSES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        importlib.import_module("trl")
    except ImportError as error:
        raise ImportError(f"pacs.integrations.trl needs TRL, which is not installed: {INSTALL}") from error
    return getattr(importlib.import_module("pacs.integrations.trl_trainer"), name)
