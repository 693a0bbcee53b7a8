"""`pacs compare`: PACS against its baselines under identical conditions.

Every method trains from the same base model with the same config (prompts, sampler, reward,
batch sizes, optimizer, budget) and the same seeds; only `algorithm.*` differs. Each final model
is evaluated on the held-out split with the paper's sampling (temperature 0.6, top_p 0.95), and
the results are written in the paper's layout: rows base model, each method, and PACS without
class weighting; columns pass@k; cells mean ± std over seeds.

    out/base/seed_S/                 evaluation of the base model
    out/METHOD/seed_S/               the training run (config, metrics, checkpoints) and eval/
    out/comparison.md, comparison.json, reward_curves.png, pass_at_k_<source>.png

A run whose evaluation is already on disk is reused, so an interrupted comparison continues.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from rich.console import Console

from pacs.config import ConfigError, load_config
from pacs.eval.evaluate import evaluate_model
from pacs.eval.plots import plot_pass_at_k, plot_reward_curves
from pacs.train.builtin_models import warm_started_tiny
from pacs.train.metrics import read_metrics
from pacs.train.trainer import train

METHODS: dict[str, list[str]] = {
    "pacs": ["algorithm.name=pacs"],
    "grpo": ["algorithm.name=grpo"],
    "ppo": ["algorithm.name=ppo"],
    "rloo": ["algorithm.name=rloo"],
}
PACS_WITHOUT_WEIGHTING = "pacs (no weighting)"
EVAL_SAMPLING = {"temperature": 0.6, "top_p": 0.95}


def _methods(algorithms: list[str]) -> dict[str, list[str]]:
    unknown = [name for name in algorithms if name not in METHODS]
    if unknown or not algorithms:
        raise ValueError(f"unknown algorithms {unknown}; valid: {', '.join(METHODS)}")
    methods = {name: METHODS[name] for name in algorithms}
    if "pacs" in algorithms:
        methods[PACS_WITHOUT_WEIGHTING] = [*METHODS["pacs"], "algorithm.weighting=none"]
    return methods


def _base_model(model_path: str, seed: int) -> str:
    """The warm-started tiny model of this seed for the built-in recipe, else the configured path."""
    return str(warm_started_tiny(seed)) if model_path == "builtin:tiny-arithmetic" else model_path


def _summarise(per_seed: list[dict[str, float]]) -> dict[str, dict[str, float | list[float]]]:
    summary = {}
    for key in per_seed[0]:
        values = [metrics[key] for metrics in per_seed]
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        summary[key] = {"mean": statistics.fmean(values), "std": std, "per_seed": values}
    return summary


def _markdown(results: dict, seeds: list[int], config_source: str, eval_n: int) -> str:
    lines = [
        "# PACS vs baselines",
        "",
        f"Config `{config_source}`, seeds {', '.join(map(str, seeds))}; every method trained with the same "
        f"data, sampler, reward, batch sizes, optimizer and steps. Held-out pass@k in %, {eval_n} samples per "
        f"problem at temperature {EVAL_SAMPLING['temperature']}, top_p {EVAL_SAMPLING['top_p']}; "
        "mean ± std over seeds.",
    ]
    for source, rows in results.items():
        ks = list(next(iter(rows.values())))
        lines += ["", f"## {source}", "", "| method | " + " | ".join(ks) + " |", "|---" * (len(ks) + 1) + "|"]
        for method, summary in rows.items():
            cells = [f"{100 * summary[k]['mean']:.1f} ± {100 * summary[k]['std']:.1f}" for k in ks]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run_comparison(
    config_source: str,
    algorithms: list[str],
    seeds: list[int],
    out_dir: str | Path,
    *,
    eval_n: int = 16,
    overrides: list[str] = (),
    show_progress: bool = True,
) -> dict:
    """Train every method of `algorithms` (plus PACS without weighting when PACS is among them)
    for every seed, evaluate, and write the comparison; return what `comparison.json` holds."""
    methods = _methods(algorithms)
    config = load_config(config_source, list(overrides))
    if not config.data.val:
        raise ConfigError(f"{config_source}: pacs compare evaluates on data.val, which is not set")
    val_specs = [config.data.val] if isinstance(config.data.val, str) else list(config.data.val)
    out = Path(out_dir)
    console = Console()
    start = time.perf_counter()
    total = len(seeds) * len(methods)

    def evaluate(model: str, directory: Path, seed: int) -> dict[str, dict[str, float]]:
        metrics_file = directory / "eval_metrics.json"
        if not metrics_file.is_file():
            evaluate_model(
                model,
                val_specs,
                n=eval_n,
                out_dir=directory,
                max_tokens=config.data.max_response_length,
                seed=seed,
                dtype=config.model.dtype,
                reward_function=config.reward.function,
                reward_timeout_s=config.reward.timeout_s,
                reward_workers=config.reward.num_workers,
                show_progress=show_progress,
                **EVAL_SAMPLING,
            )
        return json.loads(metrics_file.read_text())

    evaluations: dict[str, list[dict]] = {"base model": [], **{method: [] for method in methods}}
    reward_curves: dict[str, list[list[tuple[int, float]]]] = {method: [] for method in methods}
    run = 0
    for seed in seeds:
        base = _base_model(config.model.path, seed)
        console.rule(f"seed {seed}: base model")
        evaluations["base model"].append(evaluate(base, out / "base" / f"seed_{seed}", seed))
        for method, method_overrides in methods.items():
            run += 1
            run_dir = out / method.replace(" ", "_").replace("(", "").replace(")", "") / f"seed_{seed}"
            console.rule(f"run {run}/{total}: {method}, seed {seed} ({time.perf_counter() - start:.0f} s so far)")
            final = run_dir / "checkpoints" / "final"
            if not (final / "model.safetensors").is_file():
                run_config = load_config(
                    config_source,
                    [*overrides, *method_overrides, f"seed={seed}", f"output_dir={run_dir}", f"model.path={base}", "resume=auto"],
                )
                train(run_config, show_progress=show_progress)
            evaluations[method].append(evaluate(str(final), run_dir / "eval", seed))
            reward_curves[method].append([(row["step"], row["reward/mean"]) for row in read_metrics(run_dir)])

    sources = list(evaluations["base model"][0])
    results = {
        source: {method: _summarise([e[source] for e in per_seed]) for method, per_seed in evaluations.items()}
        for source in sources
    }
    report = {
        "config": config_source,
        "overrides": list(overrides),
        "algorithms": list(methods),
        "seeds": seeds,
        "eval": {"n": eval_n, **EVAL_SAMPLING, "data": val_specs},
        "seconds": round(time.perf_counter() - start, 1),
        "results": results,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "comparison.md").write_text(_markdown(results, seeds, config_source, eval_n))
    plot_reward_curves(reward_curves, out / "reward_curves.png")
    for source, rows in results.items():
        table = {
            method: {int(k.split("@")[1]): (summary[k]["mean"], summary[k]["std"]) for k in summary}
            for method, summary in rows.items()
        }
        plot_pass_at_k(table, out / f"pass_at_k_{source}.png", title=f"{source}: pass@k, mean ± std over seeds")
    console.print((out / "comparison.md").read_text())
    console.print(f"done in {report['seconds']:.0f} s; {out / 'comparison.md'}, {out / 'comparison.json'}")
    return report
