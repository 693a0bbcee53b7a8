"""`pacs compare`: PACS against its baselines under identical conditions.

Every method trains from the same base model with the same config (prompts, sampler, reward,
batch sizes, optimizer, budget) and the same seeds; only `algorithm.*` differs: each method's run
sets `algorithm.name` and takes, of the config's `algorithm` section, the options its algorithm
has (those every algorithm shares, such as `kl_coef`, and its own). Each final model
is evaluated on the held-out split with the paper's sampling (temperature 0.6, top_p 0.95), calling
the tools its run trained with (`rollout.tools`, docs/tools.md; the base model those of the config
without a method's overrides, so `pacs[rollout.tools=null]` is PACS trained and evaluated without
them), and
the results are written in the paper's layout: rows base model, each method, and PACS without
class weighting; columns pass@k; cells mean ± std over seeds.

An algorithm named twice or more is an A/A comparison of a method with itself: its k-th listing is
labelled "NAME (run k)" and trains with seed S + 1000·(k − 1) (`REPEAT_SEED_OFFSET`) where the first
trains with S, from the same base model and evaluated with the same seed S, so that the runs differ
only by the randomness of training (`pacs compare --algorithms pacs,pacs --baseline pacs`).

An algorithm listed with overrides in brackets, `NAME[key=value key=value]`, is a variant of it:
labelled "NAME [key=value key=value]", trained with the same seeds and those overrides on top of
the others, so that it differs from NAME only by them (`pacs compare --algorithms
'pacs,pacs[rollout.max_staleness=1]' --baseline pacs`).

    out/base/seed_S/                 evaluation of the base model
    out/METHOD/seed_S/               the training run (config, metrics, checkpoints) and eval/
    out/comparison.md, comparison.json, reward_curves.png, pass_at_k_<source>.png

What is already on disk is reused only when it was made with the settings asked for now, so an
interrupted comparison continues and a changed one never mixes old and new results: a run is
kept when its `config.yaml` equals this run's config (`output_dir`, `resume` and where it reports
metrics aside), else it is
moved aside to `seed_S.superseded` (`.superseded.2`, ... when taken) and trained again; an
evaluation is kept when the settings stored in its `eval_metrics.json` equal this one's
(`pacs.eval.evaluate.EvalSettings`), else it is moved aside the same way and redone. Nothing is
deleted (`pacs.outputs`), and each replacement is announced with the settings that differ.

`comparison.json` holds, per data source and method, pass@k mean ± std over seeds (null when a
seed generated no problem of that source) and each seed's counts from `eval_metrics.json`:
problems, samples per problem, prompts left out as too long, scoring timeouts and crashes, and
the generation cap. `comparison.md` shows both, one table each.

Each method (and the base model) is also compared with a reference method (`baseline`, GRPO by
default) problem by problem: under "vs_baseline", per pass@k, the difference of pass@k averaged
over problems for each seed ("per_seed"), their mean ("difference"), the 95% t interval over seeds
("ci95", `pacs.eval.significance`: seeds are the units, since each run lands somewhere of its own)
with "significant" true when it excludes 0, the standard deviation of the per-seed differences
("seed_sd"; the within-seed error where the seeds tie, null when nothing varies), the smallest difference these seeds detect with 80% power ("detectable") and the
seeds this difference would need ("seeds_needed"; null when over 1,000). `comparison.md` shows
them in a third table, an interval that excludes 0 marked with *, and warns below 3 seeds.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple

import numpy as np
from rich.console import Console

from pacs import EVAL_SAMPLING
from pacs.config import ALGORITHM_CONFIGS, Config, ConfigError, load_config
from pacs.distributed.world import World
from pacs.eval.evaluate import EvalSettings, evaluate_model
from pacs.eval.passk import pass_at_k, report_ks
from pacs.eval.significance import (
    FEW_SEEDS,
    difference_interval,
    excludes_zero,
    minimum_detectable_difference,
    seed_spread,
    seeds_needed,
)
from pacs.outputs import claim_output_dir, move_aside
from pacs.plots import metric_file_name, plot_pass_at_k, plot_reward_curves
from pacs.rollout.multiturn import tool_settings
from pacs.train.builtin_models import warm_started_tiny, warm_started_tiny_tools
from pacs.train.metrics import read_metrics
from pacs.train.preflight import check_run_inputs, load_run_config
from pacs.train.trainer import train

PAPER_BASELINES = [
    "algorithm.dual_clip=3.0",
    "algorithm.loss_agg=seq-mean-token-sum-norm",
    "algorithm.loss_scale=8",
    "algorithm.critic_loss_agg=seq-mean-token-sum-norm",
    "algorithm.critic_loss_scale=16",
]
"""Overrides (`pacs compare --paper-baselines`) under which GRPO, RLOO and PPO update as the paper's
verl baselines did, as in configs/paper-grpo-* and paper-ppo-* (docs/paper-fidelity.md).
Each method takes those that are its algorithm's options: PACS only `loss_agg` (for its KL and
entropy terms)."""
PAPER_METHODS = ("pacs", "grpo", "rloo", "ppo")
"""The methods of the PACS paper's comparison, the ones `PAPER_BASELINES` is for."""
PACS_WITHOUT_WEIGHTING = "pacs (no weighting)"
REPEAT_SEED_OFFSET = 1000
"""The k-th listing of one algorithm trains with seed S + REPEAT_SEED_OFFSET·(k − 1)."""
EVALUATION_COUNTS = ("problems", "samples_per_problem", "prompts_dropped_too_long", "timeouts", "crashes", "max_new_tokens")
"""Keys of a data source's entry in `eval_metrics.json` carried into the comparison, per seed."""
TRAINING_IRRELEVANT = {
    "output_dir": True,
    "resume": True,
    "train": {"report_to", "run_name", "wandb_project", "wandb_entity", "mlflow_experiment", "mlflow_tracking_uri"},
}
"""Config keys that do not change what a run trains (pydantic's `exclude` form)."""


class Method(NamedTuple):
    """A method compared: its algorithm, the overrides that set it apart, and what it adds to each
    seed for training (a repeated algorithm's later runs)."""

    algorithm: str
    overrides: list[str]
    seed_offset: int = 0


def _methods(algorithms: list[str], unweighted_pacs: bool = True) -> dict[str, Method]:
    """Each method compared, by label: every algorithm listed (its k-th listing labelled "NAME
    (run k)", trained with seeds offset by REPEAT_SEED_OFFSET·(k − 1); a variant "NAME[overrides]"
    labelled "NAME [overrides]", with the same seeds), and, with `unweighted_pacs`, PACS without
    class weighting beside PACS. NAME is a built-in's (`ALGORITHM_CONFIGS`) or a user's section's
    import path, checked when its config loads."""
    listed = [_variant(entry) for entry in algorithms]
    unknown = [name for name, _ in listed if name not in ALGORITHM_CONFIGS and ":" not in name]
    if unknown or not algorithms:
        raise ValueError(
            f"unknown algorithms {unknown}; valid: {', '.join(ALGORITHM_CONFIGS)}, or the import path "
            "package.module:Class of your own algorithm's section (docs/algorithms/custom.md)"
        )
    methods = {}
    for position, (name, overrides) in enumerate(listed):
        if overrides:
            methods[f"{name} [{' '.join(overrides)}]"] = Method(name, overrides)
            continue
        run = algorithms[:position].count(name) + 1
        label = name if run == 1 else f"{name} (run {run})"
        methods[label] = Method(name, [], REPEAT_SEED_OFFSET * (run - 1))
    if "pacs" in algorithms and unweighted_pacs:
        methods[PACS_WITHOUT_WEIGHTING] = Method("pacs", ["algorithm.weighting=none"])
    return methods


def _variant(entry: str) -> tuple[str, list[str]]:
    """ "NAME[key=value key=value]" -> (NAME, its overrides); "NAME" -> (NAME, [])."""
    name, bracket, rest = entry.partition("[")
    if not bracket:
        return entry, []
    overrides = rest.removesuffix("]").split()
    if not rest.endswith("]") or not overrides or not all("=" in override for override in overrides):
        raise ValueError(f"{entry!r}: a variant is NAME[key=value key=value ...], e.g. pacs[rollout.max_staleness=1]")
    return name, overrides


def method_directory(label: str) -> str:
    """The folder of a method's runs under the comparison's output: "pacs (run 2)" -> "pacs_run_2",
    "pacs [rollout.max_staleness=1]" -> "pacs_rollout.max_staleness-1"."""
    name = label.replace(" ", "_").replace("(", "").replace(")", "")
    return name.replace("[", "").replace("]", "").replace("=", "-").replace("/", "-")


SEEDED_BUILTIN_MODELS = {"builtin:tiny-arithmetic": warm_started_tiny, "builtin:tiny-tools": warm_started_tiny_tools}
"""The built-in warm-started models, whose every seed's comparison starts from the model warm-started
with that seed."""


def _base_model(model_path: str, seed: int) -> str:
    """The warm-started tiny model of this seed for a built-in one, else the configured path."""
    return str(SEEDED_BUILTIN_MODELS[model_path](seed)) if model_path in SEEDED_BUILTIN_MODELS else model_path


def _differences(stored: dict, wanted: dict, prefix: str = "") -> list[str]:
    """ "key: stored -> wanted" for every (dotted) key whose value differs between two settings."""
    lines = []
    for key in dict.fromkeys([*stored, *wanted]):
        old, new = stored.get(key, "absent"), wanted.get(key, "absent")
        if isinstance(old, dict) and isinstance(new, dict):
            lines += _differences(old, new, f"{prefix}{key}.")
        elif old != new:
            lines.append(f"{prefix}{key}: {old!r} -> {new!r}")
    return lines


def _training_changes(run_dir: Path, run_config: Config) -> list[str]:
    """How the config that `run_dir` was trained with differs from `run_config` (nothing to compare: [])."""
    config_file = run_dir / "config.yaml"
    if not config_file.is_file():
        return []
    try:
        stored = load_config(str(config_file)).model_dump(exclude=TRAINING_IRRELEVANT)
    except ConfigError as error:
        return [f"its config.yaml no longer loads: {error}"]
    return _differences(stored, run_config.model_dump(exclude=TRAINING_IRRELEVANT))


def _summarise(per_seed: list[dict]) -> dict:
    """One method's `eval_metrics.json` entries for one data source, one per seed -> {"pass@k": {k:
    {"mean", "std", "per_seed"}} or None if a seed generated no problem, "per_seed": [counts, and
    the samples' tool use ("tools") of an evaluation with tools]}."""
    pass_at_k = None
    if all(report["pass@k"] is not None for report in per_seed):
        pass_at_k = {}
        for key in per_seed[0]["pass@k"]:
            values = [report["pass@k"][key] for report in per_seed]
            std = statistics.stdev(values) if len(values) > 1 else 0.0
            pass_at_k[key] = {"mean": statistics.fmean(values), "std": std, "per_seed": values}
    counts = [
        {key: report[key] for key in EVALUATION_COUNTS} | ({"tools": report["tools"]} if "tools" in report else {})
        for report in per_seed
    ]
    return {"pass@k": pass_at_k, "per_seed": counts}


def _per_problem_pass_at_k(report: dict, k: int) -> dict[int, float]:
    """problem index -> pass@k of one evaluation entry (`eval_metrics.json`, one data source)."""
    samples = report["samples_per_problem"]
    return {index: pass_at_k(samples, correct, k) for index, correct in zip(report["problem_indices"], report["correct_counts"])}


def _paired_differences(method: list[dict], baseline: list[dict], k: int, where: str) -> np.ndarray:
    """(seeds, problems) array of pass@k(method) - pass@k(baseline), problem by problem, from one
    data source's evaluation entries of each seed; the two must have evaluated the same problems."""
    rows = []
    for seed_index, (ours, theirs) in enumerate(zip(method, baseline)):
        ours_by_problem, theirs_by_problem = _per_problem_pass_at_k(ours, k), _per_problem_pass_at_k(theirs, k)
        if ours_by_problem.keys() != theirs_by_problem.keys():
            raise ValueError(
                f"{where}, seed #{seed_index}: the two evaluations cover different problems "
                f"({len(ours_by_problem)} and {len(theirs_by_problem)}); they cannot be paired"
            )
        rows.append([ours_by_problem[index] - theirs_by_problem[index] for index in sorted(ours_by_problem)])
    if len({len(row) for row in rows}) != 1:
        raise ValueError(f"{where}: seeds evaluated different numbers of problems ({[len(row) for row in rows]})")
    return np.array(rows, dtype=np.float64)


def _against_baseline(method: list[dict], baseline: list[dict], where: str) -> dict | None:
    """For every reported k: each seed's mean paired difference of pass@k, their mean, the 95% t
    interval over seeds (`difference_interval`), and what the seeds' spread lets them detect
    (`_detection`); None when a seed generated no problem."""
    if any(report["pass@k"] is None for report in [*method, *baseline]):
        return None
    result = {}
    for k in report_ks(method[0]["samples_per_problem"]):
        differences = _paired_differences(method, baseline, k, where)
        interval = difference_interval(differences)
        per_seed = differences.mean(axis=1)
        result[f"pass@{k}"] = {
            "difference": float(per_seed.mean()),
            "per_seed": [float(value) for value in per_seed],
            "ci95": list(interval),
            "significant": excludes_zero(interval),
            **_detection(differences),
        }
    return result


def _detection(differences: np.ndarray) -> dict:
    """The per-seed differences' standard deviation (`seed_spread`: the within-seed error where
    the seeds tie), the smallest difference that many seeds detect with 80% power, and how many
    seeds their mean difference would need (None with one seed, or when nothing varies)."""
    per_seed = differences.mean(axis=1)
    seed_sd = seed_spread(differences) if len(per_seed) > 1 else 0.0
    if seed_sd == 0:
        return {"seed_sd": None, "detectable": None, "seeds_needed": None}
    return {
        "seed_sd": seed_sd,
        "detectable": minimum_detectable_difference(seed_sd, len(per_seed)),
        "seeds_needed": seeds_needed(float(per_seed.mean()), seed_sd),
    }


def _seeds_text(values: list) -> str:
    """One value when every seed agrees, else each seed's, e.g. "0 / 2 / 1"."""
    texts = [str(value) for value in values]
    return texts[0] if len(set(texts)) == 1 else " / ".join(texts)


def _cap_text(cap: dict) -> str:
    """The generation cap of one evaluation, e.g. "4096" or "37–4096 (3 below 4096)"."""
    if cap["min"] is None:
        return "—"
    if not cap["prompts_below_requested"]:
        return str(cap["requested"])
    return f"{cap['min']}–{cap['max']} ({cap['prompts_below_requested']} below {cap['requested']})"


def _signed(value: float) -> str:
    """A difference of pass@k in percentage points, signed: "+1.2", "-0.4"."""
    return f"{100 * value:+.1f}"


def _baseline_table(rows: dict, baseline: str) -> list[str]:
    """comparison.md's rows of every method's paired difference from `baseline`, per pass@k."""
    compared = {method: summary["vs_baseline"] for method, summary in rows.items() if summary.get("vs_baseline")}
    if not compared:
        return []
    ks = list(next(iter(compared.values())))
    seeds = len(next(iter(compared.values()))[ks[0]]["per_seed"])
    lines = [
        "",
        f"Against {baseline}: paired difference in percentage points (mean over seeds) [95% t interval over "
        "seeds]; * marks an interval that excludes 0. Per seed: each seed's difference. Detectable: the "
        f"smallest true difference {seeds} seeds find with 80% power at this spread; seeds needed: for the "
        "difference measured (pass@1).",
        *_few_seeds_warning(seeds),
        "",
        "| method | " + " | ".join(ks) + " | per seed (pass@1) | detectable | seeds needed |",
        "|---" * (len(ks) + 4) + "|",
    ]
    for method, by_k in compared.items():
        cells = [
            f"{_signed(by_k[k]['difference'])} [{_signed(by_k[k]['ci95'][0])}, {_signed(by_k[k]['ci95'][1])}]"
            + ("*" if by_k[k]["significant"] else "")
            for k in ks
        ]
        first = by_k[ks[0]]
        per_seed = " / ".join(_signed(value) for value in first["per_seed"])
        detectable = "—" if first["detectable"] is None else f"{100 * first['detectable']:.1f}"
        needed = "—" if first["detectable"] is None else str(first["seeds_needed"] or "> 1000")
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {per_seed} | {detectable} | {needed} |")
    return lines


def _few_seeds_warning(seeds: int) -> list[str]:
    """comparison.md's warning under FEW_SEEDS seeds: what the interval can and cannot say."""
    if seeds >= FEW_SEEDS:
        return []
    if seeds == 1:
        reason = ("with one seed the run-to-run spread cannot be seen, so the interval covers only which problems "
                  "were drawn and sampled and is too narrow")  # fmt: skip
    else:
        reason = "with 2 seeds the t interval has 1 degree of freedom and is very wide"
    return ["", f"**Warning: {seeds} seed{'s' if seeds > 1 else ''}.** Compare over at least {FEW_SEEDS} seeds: {reason}."]


def _markdown(results: dict, seeds: list[int], config_source: str, eval_n: int, baseline: str, offsets: dict[str, int]) -> str:
    repeats = [f"{label} with seeds + {offset}" for label, offset in offsets.items() if offset]
    lines = [
        "# PACS vs baselines",
        "",
        f"Config `{config_source}`, seeds {', '.join(map(str, seeds))}; every method trained with the same "
        f"data, sampler, reward, batch sizes, optimizer and steps. Held-out pass@k in %, {eval_n} samples per "
        f"prompt (per copy of a repeated problem) at temperature {EVAL_SAMPLING['temperature']}, top_p "
        f"{EVAL_SAMPLING['top_p']}; mean ± std over seeds. Under each table, what every evaluation covered "
        "(one value when all seeds agree, else seed by seed): prompts left out as too long for the model's "
        "context are not in pass@k; answers whose scoring timed out or crashed scored 0.",
    ]
    if repeats:
        lines[-1] += (
            f" A method listed again trains from the same base model with other seeds ({'; '.join(repeats)}), "
            "evaluated with the same seeds: an A/A comparison, whose differences are those of training's randomness."
        )
    for source, rows in results.items():
        ks = next((list(summary["pass@k"]) for summary in rows.values() if summary["pass@k"]), [])
        lines += ["", f"## {source}", ""]
        if ks:
            lines += ["| method | " + " | ".join(ks) + " |", "|---" * (len(ks) + 1) + "|"]
            for method, summary in rows.items():
                by_k = summary["pass@k"]
                cells = [f"{100 * by_k[k]['mean']:.1f} ± {100 * by_k[k]['std']:.1f}" if by_k else "—" for k in ks]
                lines.append(f"| {method} | " + " | ".join(cells) + " |")
            lines += _baseline_table(rows, baseline)
        else:
            lines.append("No prompt of this data source fits the model's context: no pass@k.")
        lines += [
            "",
            "| method | problems | samples per problem | prompts too long | timeouts | crashes | max new tokens |",
            "|---" * 7 + "|",
        ]
        for method, summary in rows.items():
            per_seed = summary["per_seed"]
            cells = [_seeds_text([counts[key] for counts in per_seed]) for key in EVALUATION_COUNTS[:-1]]
            cells.append(_seeds_text([_cap_text(counts["max_new_tokens"]) for counts in per_seed]))
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        lines += _tool_use_table(rows)
    return "\n".join(lines) + "\n"


TOOL_USE = ("tool_calls_mean", "tool_errors_fraction", "turns_mean")
"""An evaluation's tool use (`eval_metrics.json`'s "tools"), as comparison.md's tool table shows it."""


def _tool_use_table(rows: dict) -> list[str]:
    """comparison.md's rows of every method's tool use in one data source's evaluations (one value
    when all seeds agree, else seed by seed; "—" for a method evaluated without tools); none when
    no method was evaluated with tools."""
    if not any("tools" in counts for summary in rows.values() for counts in summary["per_seed"]):
        return []
    lines = ["", "| method | tool calls per sample | failed calls (of all calls) | turns per sample |", "|---" * 4 + "|"]
    for method, summary in rows.items():
        per_seed = summary["per_seed"]
        if not all("tools" in counts for counts in per_seed):
            lines.append(f"| {method} | — | — | — |")
            continue
        cells = [_seeds_text([f"{counts['tools'][key]:.2f}" for counts in per_seed]) for key in TOOL_USE]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def run_comparison(
    config_source: str,
    algorithms: list[str],
    seeds: list[int],
    out_dir: str | Path,
    *,
    eval_n: int = 16,
    overrides: list[str] = (),
    baseline: str | None = None,
    show_progress: bool = True,
    unweighted_pacs: bool = True,
) -> dict:
    """Train every method of `algorithms` (plus PACS without weighting when PACS is among them,
    unless not `unweighted_pacs`) for every seed, evaluate, and write the comparison, each method's pass@k set against
    `baseline`'s (one of the methods, or "base model"; None: GRPO when it is compared, else the
    base model, so that `--algorithms pacs` alone is PACS against the model it started from);
    return what `comparison.json` holds."""
    methods = _methods(algorithms, unweighted_pacs)
    if baseline is None:
        baseline = "grpo" if "grpo" in methods else "base model"
    if baseline not in ["base model", *methods]:
        raise ValueError(
            f"baseline {baseline!r} is not among the methods compared; pass --baseline with one of: "
            + ", ".join(["base model", *methods])
        )
    if not seeds:
        raise ValueError("pacs compare needs at least one seed")
    config = load_run_config(config_source, list(overrides), algorithm=algorithms[0])
    if not config.data.val:
        raise ConfigError(f"{config_source}: pacs compare evaluates on data.val, which is not set")
    for algorithm, method_overrides, _ in methods.values():
        check_run_inputs(load_run_config(config_source, [*overrides, *method_overrides], algorithm=algorithm))
    val_specs = [config.data.val] if isinstance(config.data.val, str) else list(config.data.val)
    out = Path(out_dir)
    claim_output_dir(out, "pacs compare", reuse=True)
    console = Console(soft_wrap=True, markup=False)  # labels, paths and settings hold [brackets]
    start = time.perf_counter()
    total = len(seeds) * len(methods)

    def evaluate(model: str, directory: Path, seed: int, tools: dict | None) -> dict[str, dict]:
        """`eval_metrics.json`'s data sources for `model`, generating with `tools` (`tool_settings`),
        evaluated into `directory` unless there already."""
        settings = EvalSettings(
            model_path=model,
            specs=val_specs,
            n=eval_n,
            **EVAL_SAMPLING,
            max_tokens=config.data.max_response_length,
            seed=seed,
            dtype=config.model.dtype,
            reward_function=config.reward.function,
            reward_timeout_s=config.reward.timeout_s,
            reward_workers=config.reward.num_workers,
            tools=tools,
        )
        metrics_file = directory / "eval_metrics.json"
        if metrics_file.is_file():
            stored = json.loads(metrics_file.read_text())
            if "settings" not in stored:
                console.print(f"{metrics_file} records no settings to compare with this run's: evaluating again")
            elif any("correct_counts" not in entry for entry in stored["data_sources"].values()):
                console.print(
                    f"{metrics_file} records no per-problem results, which the paired comparison needs: evaluating again"
                )
            elif changes := _differences(stored["settings"], asdict(settings)):
                console.print(f"{metrics_file} was evaluated with other settings ({'; '.join(changes)}): evaluating again")
            else:
                console.print(f"{directory}: evaluated before with these settings, reused")
                return stored["data_sources"]
        evaluate_model(
            **asdict(settings), processes=World.single(), out_dir=directory, overwrite=True, show_progress=show_progress
        )
        return json.loads(metrics_file.read_text())["data_sources"]

    evaluations: dict[str, list[dict]] = {"base model": [], **{method: [] for method in methods}}
    reward_curves: dict[str, list[list[tuple[int, float]]]] = {method: [] for method in methods}
    run = 0
    for seed in seeds:
        base = _base_model(config.model.path, seed)
        console.rule(f"seed {seed}: base model")
        evaluations["base model"].append(evaluate(base, out / "base" / f"seed_{seed}", seed, tool_settings(config.rollout)))
        for method, (algorithm, method_overrides, seed_offset) in methods.items():
            run += 1
            run_dir = out / method_directory(method) / f"seed_{seed}"
            console.rule(f"run {run}/{total}: {method}, seed {seed} ({time.perf_counter() - start:.0f} s so far)")
            run_config = load_config(
                config_source,
                [
                    *overrides,
                    *method_overrides,
                    f"seed={seed + seed_offset}",
                    f"output_dir={run_dir}",
                    f"model.path={base}",
                    "resume=auto",
                ],
                algorithm=algorithm,
            )
            if changes := _training_changes(run_dir, run_config):
                superseded = move_aside(run_dir)
                console.print(
                    f"{run_dir} was trained with other settings ({'; '.join(changes)}): training again; "
                    f"the old run is now {superseded}"
                )
            final = run_dir / "checkpoints" / "final"
            if (final / "model.safetensors").is_file():
                console.print(f"{run_dir}: trained before with these settings, reused")
            else:
                train(run_config, show_progress=show_progress)
            evaluations[method].append(evaluate(str(final), run_dir / "eval", seed, tool_settings(run_config.rollout)))
            rewards = [(row["step"], row["reward/mean"]) for row in read_metrics(run_dir) if "reward/mean" in row]
            reward_curves[method].append(rewards)  # step 0, the validation before training, has no reward

    sources = list(evaluations["base model"][0])
    results = {
        source: {method: _summarise([e[source] for e in per_seed]) for method, per_seed in evaluations.items()}
        for source in sources
    }
    for source, rows in results.items():
        reference = [e[source] for e in evaluations[baseline]]
        for method, per_seed in evaluations.items():
            if method != baseline:
                where = f"{source}: {method} against {baseline}"
                rows[method]["vs_baseline"] = _against_baseline([e[source] for e in per_seed], reference, where)
    report = {
        "config": config_source,
        "overrides": list(overrides),
        "algorithms": list(methods),
        "training_seed_offsets": {label: method.seed_offset for label, method in methods.items()},
        "seeds": seeds,
        "baseline": baseline,
        "eval": {"n": eval_n, **EVAL_SAMPLING, "max_tokens": config.data.max_response_length, "data": val_specs},
        "seconds": round(time.perf_counter() - start, 1),
        "results": results,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "comparison.md").write_text(
        _markdown(results, seeds, config_source, eval_n, baseline, report["training_seed_offsets"])
    )
    written = [out / "comparison.md", out / "comparison.json", plot_reward_curves(reward_curves, out / "reward_curves.png")]
    for source, rows in results.items():
        table = {
            method: {int(k.split("@")[1]): (by_k["mean"], by_k["std"]) for k, by_k in summary["pass@k"].items()}
            for method, summary in rows.items()
            if summary["pass@k"]
        }
        if table:
            figure = out / metric_file_name(f"pass_at_k_{source}")  # a data_source math/NAME makes no folder
            written.append(plot_pass_at_k(table, figure, title=f"{source}: pass@k, mean ± std over seeds"))
    console.print((out / "comparison.md").read_text())
    console.print(f"done in {report['seconds']:.0f} s; wrote:")
    for path in written:
        console.print(f"  {path}")
    return report
