"""The shipped recipes: every `configs/*.yaml` validates, and the paper's runs hold the paper's numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from pacs.config import load_config

CONFIGS_DIR = Path(__file__).resolve().parents[2] / "configs"
ALL_CONFIGS = sorted(CONFIGS_DIR.glob("*.yaml"))
PAPER_CONFIGS = sorted(CONFIGS_DIR.glob("paper-*-qwen2.5-*.yaml"))
"""The runs of the paper's v1 (Qwen2.5)."""
PAPER_V2_CONFIGS = sorted(CONFIGS_DIR.glob("paper-v2-*.yaml"))
"""The runs of the paper's v2 (arXiv 2509.02522v2: Qwen3, docs/paper-v2.md)."""
PAPER_VALIDATION_SETS = [
    "data/math500.parquet",
    "data/amc23.parquet",
    "data/aime2024.parquet",
    "data/aime2025.parquet",
]


def test_the_paper_runs_are_shipped_for_both_models_and_all_methods():
    methods = ["grpo", "pacs-beta1", "pacs-beta2", "ppo"]
    assert [path.name for path in PAPER_CONFIGS] == [
        f"paper-{method}-qwen2.5-{size}.yaml" for method in methods for size in ("3b", "7b")
    ]


@pytest.mark.parametrize("path", ALL_CONFIGS, ids=lambda path: path.name)
def test_config_loads_and_validates(path):
    load_config(str(path))


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda path: path.name)
def test_paper_config_holds_the_paper_training_setup(path):
    config = load_config(str(path))
    assert (config.train.batch_size, config.rollout.n, config.train.mini_batch_size) == (1024, 8, 256)
    assert config.train.epochs == 1
    assert config.train.lr == pytest.approx(1e-6)
    assert (config.train.weight_decay, config.train.grad_clip) == (0.01, 1.0)
    assert (config.data.max_prompt_length, config.data.max_response_length) == (512, 4096)
    assert config.train.steps == 300
    assert (config.rollout.temperature, config.rollout.top_p) == (1.0, 1.0)
    assert (config.algorithm.kl_coef, config.algorithm.entropy_coef) == (0.0, 0.0)
    assert config.model.dtype == "bfloat16"


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda path: path.name)
def test_paper_config_states_its_sharding_and_gpu_count(path):
    config = load_config(str(path))
    assert config.train.strategy == "fsdp" and config.train.gradient_checkpointing
    assert "64 GPUs" in path.read_text() and "torchrun --nnodes 8 --nproc_per_node 8" in path.read_text()


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda path: path.name)
def test_paper_config_trains_on_deepscaler_and_validates_on_the_four_benchmarks(path):
    config = load_config(str(path))
    assert config.data.train == "data/deepscaler.parquet"
    assert config.data.val == PAPER_VALIDATION_SETS
    assert (config.eval.temperature, config.eval.top_p) == (0.6, 0.95)


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda path: path.name)
def test_paper_config_names_its_model_algorithm_and_output_dir(path):
    config = load_config(str(path))
    name = path.stem.removeprefix("paper-")
    method, _, size = name.rpartition("-qwen2.5-")
    assert config.model.path == f"Qwen/Qwen2.5-{size.upper()}"
    assert config.algorithm.name == method.split("-")[0]
    assert config.output_dir == f"runs/paper/{name}"


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda path: path.name)
def test_paper_config_header_gives_the_train_and_prepare_commands(path):
    header = path.read_text()
    assert f"pacs train --config configs/{path.name}" in header
    assert "pacs prepare --input deepscaler.json --out data/deepscaler.parquet" in header
    assert "8 nodes x 8 GPUs" in header


@pytest.mark.parametrize(("size", "beta"), [(size, beta) for size in ("3b", "7b") for beta in (1, 2)])
def test_paper_pacs_config_uses_the_beta_it_is_named_for(size, beta):
    config = load_config(str(CONFIGS_DIR / f"paper-pacs-beta{beta}-qwen2.5-{size}.yaml"))
    assert config.algorithm.beta == float(beta)
    assert (config.algorithm.proxy, config.algorithm.estimator, config.algorithm.weighting) == (
        "logratio",
        "rloo",
        "question",
    )


@pytest.mark.parametrize("size", ["3b", "7b"])
def test_paper_grpo_config_uses_the_paper_clip_and_loss_aggregation(size):
    algorithm = load_config(str(CONFIGS_DIR / f"paper-grpo-qwen2.5-{size}.yaml")).algorithm
    assert (algorithm.clip_low, algorithm.clip_high) == (0.2, 0.2)
    assert algorithm.loss_agg == "seq-mean-token-sum-norm"


@pytest.mark.parametrize("size", ["3b", "7b"])
def test_paper_ppo_config_uses_gae_with_the_paper_critic_lr(size):
    config = load_config(str(CONFIGS_DIR / f"paper-ppo-qwen2.5-{size}.yaml"))
    assert (config.algorithm.gamma, config.algorithm.lam, config.algorithm.value_clip) == (1.0, 1.0, 0.5)
    assert config.critic.lr == pytest.approx(1e-5)


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda path: path.name)
def test_paper_config_generates_with_vllm_as_the_paper_did(path):
    assert load_config(str(path)).rollout.engine == "vllm"


# --- the paper's v2 (Qwen3-4B and Qwen3-8B; docs/paper-v2.md) ---------------------------------------


def test_the_v2_runs_are_shipped_for_both_models_and_its_three_methods():
    assert [path.name for path in PAPER_V2_CONFIGS] == [
        f"paper-v2-{method}-qwen3-{size}.yaml" for method in ("grpo", "pacs", "ppo") for size in ("4b", "8b")
    ]


@pytest.mark.parametrize("path", PAPER_V2_CONFIGS, ids=lambda path: path.name)
def test_v2_config_holds_v2s_training_setup(path):
    config = load_config(str(path))
    size = path.stem.rpartition("-qwen3-")[2]
    assert config.model.path == f"Qwen/Qwen3-{size.upper()}" and config.model.dtype == "bfloat16"
    assert config.algorithm.name == path.stem.split("-")[2]
    assert (config.train.batch_size, config.rollout.n, config.train.mini_batch_size, config.train.micro_batch_size) == (
        1024,
        8,
        256,
        8,
    )
    assert config.train.lr == pytest.approx(1e-6) and config.train.epochs == 1
    assert (config.data.max_prompt_length, config.data.max_response_length) == (1024, 8192)
    assert config.train.steps == {"4b": 120, "8b": 320}[size]
    assert (config.algorithm.kl_coef, config.algorithm.entropy_coef) == (0.0, 0.0)
    assert config.output_dir == f"runs/paper-v2/{path.stem.removeprefix('paper-v2-')}"


@pytest.mark.parametrize("path", PAPER_V2_CONFIGS, ids=lambda path: path.name)
def test_v2_config_validates_on_the_five_benchmarks_and_states_v2s_evaluation(path):
    config = load_config(str(path))
    assert config.data.train == "data/deepscaler.parquet"
    assert config.data.val == [*PAPER_VALIDATION_SETS, "data/beyondaime.parquet"]
    assert (config.eval.temperature, config.eval.top_p) == (0.6, 0.95)
    header = path.read_text()
    assert "-n 128 --max-tokens 8192" in header and "k up to 64" in header
    assert "pacs prepare --input BeyondAIME.parquet --out data/beyondaime.parquet" in header
    assert f"pacs train --config configs/{path.name}" in header


def test_v2_pacs_uses_beta_1_and_the_authors_rollout_reference():
    for size in ("4b", "8b"):
        algorithm = load_config(str(CONFIGS_DIR / f"paper-v2-pacs-qwen3-{size}.yaml")).algorithm
        assert (algorithm.beta, algorithm.estimator, algorithm.weighting, algorithm.pacs_reference) == (
            1.0,
            "rloo",
            "question",
            "rollout",
        )


def test_v2_ppo_uses_the_critic_learning_rate_v2_states():
    for size in ("4b", "8b"):
        assert load_config(str(CONFIGS_DIR / f"paper-v2-ppo-qwen3-{size}.yaml")).critic.lr == pytest.approx(1e-5)
