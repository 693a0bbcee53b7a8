"""Figures of training runs and evaluation results, written as PNG files.

- `plot_runs`: what `pacs plot RUN_DIR [RUN_DIR ...]` draws, one PNG per metric of the runs'
  `metrics.jsonl` (training reward, loss, response length, gradient norm, validation pass@1 per
  data source), every run on the same axes against step; `--smooth W` draws the training curves
  as TensorBoard's smoothing slider does (`smoothed`). Where a resumed run went on with other
  settings (`pacs train --allow-changes`), a dotted vertical line before the first step of each
  new set, labelled with the keys that changed (`segment_marks`). The loss figure of PACS runs
  marks ln 2, where PACS's loss stays by design (`PACS_LOSS_LABEL`).
- `plot_reward_curves`: one curve per method, the mean over seeds with a ± one standard deviation
  band (the paper's training-reward figure).
- `plot_pass_at_k`: pass@k against k per method, mean ± std over seeds, k on a log2 axis.

A method has one colour in every figure (`method_colours`: fixed for pacs's methods and the base
model); a run is labelled by its algorithm and seed (`run_labels`); steps are ticked at integers.

Figures are drawn on matplotlib's Agg canvas directly (no pyplot), so plotting needs no display
and leaves the process's matplotlib backend and figure registry alone.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import yaml
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pacs.outputs import MARKER, claim_output_dir
from pacs.train.checkpointing.resume import read_segments
from pacs.train.metrics import read_metrics

TRAINING_METRICS = {
    "reward/mean": "training reward (mean)",
    "loss": "loss",
    "response_length/mean": "response length (tokens, mean)",
    "grad_norm": "gradient norm",
}
"""metrics.jsonl key -> axis label, for the training metrics `plot_runs` draws (in this order)."""
PACS_LOSS_LABEL = "PACS: ln 2 = 0.693, where its loss stays by design; learning shows in the reward and pass@k"
"""Drawn on the loss figure of PACS runs, at ln 2 (`pacs.algos.pacs.LOSS_NOTE` says why)."""
VALIDATION_PASS_AT_1 = re.compile(r"^val/(?P<source>.+)/pass@1$")
"""metrics.jsonl keys of validation pass@1, one per data source."""
MARKER_MAX_POINTS = 60
"""Curves with at most this many points get a marker per point, so that sparse ones (validation
every N steps, a one-step run) stay visible."""
DPI = 120
FIGURE_SIZE = (7.0, 4.5)
METHOD_COLOURS = {
    "base model": "tab:gray",
    "pacs": "tab:blue",
    "pacs (no weighting)": "tab:cyan",
    "grpo": "tab:orange",
    "ppo": "tab:green",
    "rloo": "tab:red",
}
"""The colour of each method `pacs compare` draws, the same in every figure."""
OTHER_COLOURS = ("tab:purple", "tab:brown", "tab:pink", "tab:olive")


def method_colours(methods: list[str]) -> dict[str, str]:
    """method -> its colour: `METHOD_COLOURS`' for pacs's methods (matched without case), then
    `OTHER_COLOURS` in turn for the others, in the order given."""
    others = iter(OTHER_COLOURS * (1 + len(methods) // len(OTHER_COLOURS)))
    return {method: METHOD_COLOURS.get(method.lower()) or next(others) for method in methods}


def _new_axes(title: str, x_label: str, y_label: str) -> tuple[Figure, Axes]:
    """A figure with one titled, labelled, gridded axes on an Agg canvas."""
    figure = Figure(figsize=FIGURE_SIZE, dpi=DPI)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.set_title(title)
    axes.set_xlabel(x_label)
    axes.set_ylabel(y_label)
    axes.grid(True, alpha=0.3)
    if x_label == "step":
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # no step 1.5 on a two-step run
    return figure, axes


def _save(figure: Figure, out_path: Path) -> Path:
    """Lay out, write `out_path` (parents created) and return it."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(out_path, dpi=DPI)
    return out_path


def _marker(num_points: int) -> str | None:
    return "o" if num_points <= MARKER_MAX_POINTS else None


def metric_file_name(metric: str) -> str:
    """PNG file name for a metrics.jsonl key: `reward/mean` -> `reward_mean.png`,
    `val/math500/pass@1` -> `val_math500_pass_at_1.png`."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", metric.replace("@", "_at_")) + ".png"


def smoothed(values: list[float], weight: float) -> list[float]:
    """The exponential moving average TensorBoard's smoothing slider draws, with its debiasing:

        last_t = weight * last_{t-1} + (1 - weight) * value_t,  last_0 = 0
        smoothed_t = last_t / (1 - weight^t)

    so the first point is the first value and weight 0 leaves the values as they are.

    Raises:
        ValueError: `weight` is outside [0, 1).
    """
    if not 0 <= weight < 1:
        raise ValueError(f"smoothing weight {weight} must lie in [0, 1) (0: raw values)")
    last, result = 0.0, []
    for count, value in enumerate(values, start=1):
        last = weight * last + (1 - weight) * value
        result.append(last / (1 - weight**count))
    return result


def _series(rows: list[dict], metric: str) -> tuple[list[int], list[float]]:
    """Steps and values of `metric` in the rows that hold it."""
    points = [(row["step"], row[metric]) for row in rows if row.get(metric) is not None]
    return [step for step, _ in points], [value for _, value in points]


def segment_marks(run_dir: Path) -> list[tuple[int, str]]:
    """(first step, "changed: KEYS") of each set of settings after the first that a resumed run
    went on with (`pacs.train.checkpointing.resume.read_segments`); [] for a run of one set."""
    marks = []
    for segment in read_segments(run_dir)[1:]:
        keys = list(segment["changes"])
        shown = ", ".join(keys[:3]) + (f" (+{len(keys) - 3})" if len(keys) > 3 else "")
        marks.append((int(segment["from_step"]), f"changed: {shown}"))
    return marks


def _mark_segments(axes: Axes, marks: list[tuple[int, str]], colour: str) -> None:
    """A dotted vertical line half a step before each mark's first step, with its text beside it."""
    for step, text in marks:
        axes.axvline(step - 0.5, color=colour, linestyle=":", linewidth=1.2)
        axes.annotate(text, (step - 0.5, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -12),
                      textcoords="offset points", fontsize=7, color=colour, in_layout=False)  # fmt: skip


def run_labels(run_dirs: list[Path]) -> list[str]:
    """Legend labels: each run's algorithm and seed, from its `config.yaml` ("pacs, seed 0"), with
    its directory's last path parts after it where that alone does not tell the runs apart (and
    in its place for a run without one): as few parts as tell the runs apart (`seed_0` alone, or
    `pacs/seed_0` and `grpo/seed_0`)."""
    paths = _path_labels(run_dirs)
    described = [_algorithm_and_seed(Path(run_dir)) for run_dir in run_dirs]
    return [
        path if description is None else description if described.count(description) == 1 else f"{description} ({path})"
        for path, description in zip(paths, described)
    ]


def _algorithm(run_dir: Path) -> str | None:
    """The run's `algorithm.name` from its config.yaml, or None if it has no readable one."""
    try:
        return yaml.safe_load((run_dir / "config.yaml").read_text())["algorithm"]["name"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None


def _algorithm_and_seed(run_dir: Path) -> str | None:
    """ "ALGORITHM, seed S" from the run's config.yaml, or None if it has no readable one."""
    try:
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        return f"{config['algorithm']['name']}, seed {config['seed']}"
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None


def _path_labels(run_dirs: list[Path]) -> list[str]:
    """Each run directory's last path parts, as few as tell the runs apart."""
    parts = [Path(run_dir).resolve().parts for run_dir in run_dirs]
    for depth in range(1, max(len(p) for p in parts) + 1):
        labels = ["/".join(p[-depth:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [str(run_dir) for run_dir in run_dirs]


def plot_runs(
    run_dirs: list[Path],
    out_dir: Path,
    *,
    labels: list[str] | None = None,
    smoothing: float = 0.0,
    overwrite: bool = False,
) -> list[Path]:
    """Draw every run's training metrics and validation pass@1 against step, one PNG per metric.

    run_dirs: training output directories, each with a `metrics.jsonl`.
    labels: legend entry per run (default: `run_labels`).
    out_dir: claimed after every run is read (`pacs.outputs.claim_output_dir`): plots that `pacs
    plot` drew there before (`holds_only_plots`) are drawn again in place; another previous output
    is refused, or moved aside with `overwrite`.
    Metrics: `TRAINING_METRICS`, then `val/<source>/pass@1` for every source any run validated on
    (in percent). A metric that no run logged is skipped. Returns the written paths, in that order.
    smoothing: the training metrics' curves are `smoothed` with this weight (0: raw), with the raw
    values drawn faintly behind them; validation curves (sparse) are always raw.
    """
    if not 0 <= smoothing < 1:
        raise ValueError(f"smoothing={smoothing} must lie in [0, 1) (0: raw curves)")
    if not run_dirs:
        raise ValueError("plot_runs needs at least one run directory")
    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"labels has {len(labels)} entries for {len(run_dirs)} run directories; give one per run")
    runs: list[tuple[str, list[dict], list[tuple[int, str]]]] = []
    for label, run_dir in zip(labels if labels is not None else run_labels(run_dirs), map(Path, run_dirs)):
        if not (run_dir / "metrics.jsonl").is_file():
            raise FileNotFoundError(f"{run_dir} has no metrics.jsonl; pass directories that `pacs train` wrote")
        runs.append((label, read_metrics(run_dir), segment_marks(run_dir)))
    claim_output_dir(Path(out_dir), "pacs plot", reuse=holds_only_plots(Path(out_dir)), replace=overwrite)

    logged = {key for _, rows, _ in runs for row in rows for key in row}
    validation_sources = sorted(match["source"] for key in logged if (match := VALIDATION_PASS_AT_1.match(key)))
    metrics = {metric: (label, 1.0) for metric, label in TRAINING_METRICS.items() if metric in logged}
    metrics |= {f"val/{source}/pass@1": (f"{source} pass@1 (%)", 100.0) for source in validation_sources}

    written = []
    for metric, (y_label, scale) in metrics.items():
        figure, axes = _new_axes(metric, "step", y_label)
        for label, rows, marks in runs:
            steps, values = _series(rows, metric)
            if not steps:
                continue
            if smoothing and metric in TRAINING_METRICS:
                (raw,) = axes.plot(steps, np.asarray(values) * scale, alpha=0.25, linewidth=1)
                (line,) = axes.plot(steps, np.asarray(smoothed(values, smoothing)) * scale, label=label, color=raw.get_color())
            else:
                (line,) = axes.plot(steps, np.asarray(values) * scale, label=label, marker=_marker(len(steps)), markersize=3)
            _mark_segments(axes, marks, line.get_color())
        if metric == "loss" and any(_algorithm(Path(run_dir)) == "pacs" for run_dir in run_dirs):
            axes.axhline(math.log(2), color="gray", linestyle=":", linewidth=1)
            axes.annotate(PACS_LOSS_LABEL, (0.01, math.log(2)), xycoords=("axes fraction", "data"), xytext=(0, 3),
                          textcoords="offset points", fontsize=7, color="gray", in_layout=False)  # fmt: skip
        axes.legend()
        written.append(_save(figure, Path(out_dir) / metric_file_name(metric)))
    return written


def holds_only_plots(directory: Path) -> bool:
    """Whether `directory` is a folder `pacs plot` made that holds nothing but its PNG files."""
    try:
        made_by_plot = (directory / MARKER).read_text().strip() == "pacs plot"
        return made_by_plot and all(entry.name == MARKER or entry.suffix == ".png" for entry in directory.iterdir())
    except OSError:
        return False


def _mean_and_std_over_seeds(runs: list[list[tuple[int, float]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps any seed logged, the mean over the seeds that logged each, and their sample standard
    deviation (NaN where fewer than 2 seeds logged the step)."""
    values_by_step: dict[int, list[float]] = {}
    for run in runs:
        for step, value in run:
            values_by_step.setdefault(step, []).append(value)
    steps = np.array(sorted(values_by_step))
    means = np.array([np.mean(values_by_step[step]) for step in steps])
    stds = np.array([np.std(values_by_step[step], ddof=1) if len(values_by_step[step]) > 1 else np.nan for step in steps])
    return steps, means, stds


def plot_reward_curves(
    curves: dict[str, list[list[tuple[int, float]]]],
    out_path: Path,
    *,
    metric_label: str = "training reward",
) -> Path:
    """Draw per method the mean over seeds against step, shaded ± one standard deviation.

    curves: method -> runs (one per seed) -> (step, value) points. Seeds may log different steps;
    each step averages the seeds that logged it, and the band (sample std) is drawn where at least
    two did. Returns `out_path`.
    """
    if not curves:
        raise ValueError("plot_reward_curves needs at least one method in curves")
    for method, runs in curves.items():
        if not runs or not all(runs):
            raise ValueError(f"curves[{method!r}] must hold at least one run, each with at least one (step, value) point")
    figure, axes = _new_axes(f"{metric_label} (mean ± std over seeds)", "step", metric_label)
    colours = method_colours(list(curves))
    for method, runs in curves.items():
        steps, means, stds = _mean_and_std_over_seeds(runs)
        seeds = f"{len(runs)} seed" + ("s" if len(runs) > 1 else "")
        colour = colours[method]
        axes.plot(steps, means, label=f"{method} ({seeds})", color=colour, marker=_marker(len(steps)), markersize=3)
        has_band = ~np.isnan(stds)
        if has_band.any():
            axes.fill_between(steps, means - stds, means + stds, where=has_band, color=colour, alpha=0.2, linewidth=0)
    axes.legend()
    return _save(figure, Path(out_path))


def plot_pass_at_k(table: dict[str, dict[int, tuple[float, float]]], out_path: Path, *, title: str = "") -> Path:
    """Draw per method pass@k against k with error bars, k on a log2 axis ticked at each k.

    table: method -> k -> (mean, std over seeds) of pass@k as a fraction in [0, 1] (as
    `pacs.eval.evaluate` reports it); drawn in percent. Returns `out_path`.
    """
    if not table:
        raise ValueError("plot_pass_at_k needs at least one method in table")
    for method, by_k in table.items():
        if not by_k or any(not isinstance(k, int) or k < 1 for k in by_k):
            raise ValueError(f"table[{method!r}] must map integers k >= 1 to (mean, std); got ks {sorted(by_k, key=str)}")
    figure, axes = _new_axes(title or "pass@k", "k", "pass@k (%)")
    colours = method_colours(list(table))
    for method, by_k in table.items():
        ks = sorted(by_k)
        means = np.array([by_k[k][0] for k in ks]) * 100.0
        stds = np.array([by_k[k][1] for k in ks]) * 100.0
        axes.errorbar(ks, means, yerr=stds, label=method, color=colours[method], marker="o", markersize=4, capsize=3)
    all_ks = sorted({k for by_k in table.values() for k in by_k})
    axes.set_xscale("log", base=2)
    axes.set_xticks(all_ks, [str(k) for k in all_ks])
    axes.minorticks_off()
    axes.legend()
    return _save(figure, Path(out_path))
