"""Plots: one legible PNG per metric of the compared runs; reward curves over seeds; pass@k tables."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib.image
import pytest
from matplotlib.axes import Axes

from pacs.cli import main
from pacs.plots import metric_file_name, plot_pass_at_k, plot_reward_curves, plot_runs, run_labels, smoothed
from pacs.train.checkpointing.resume import SEGMENTS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_run(run_dir: Path, rows: list[dict]) -> Path:
    """A fake training output directory holding `rows` as its metrics.jsonl."""
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return run_dir


def training_rows(steps: int, *, validate_on: tuple[str, ...] = ("math500",), offset: float = 0.0) -> list[dict]:
    """Metrics as the trainer logs them, with validation every 5 steps on `validate_on`."""
    rows = []
    for step in range(1, steps + 1):
        row = {
            "step": step,
            "reward/mean": 0.3 + 0.01 * step + offset,
            "loss": 0.7 - 0.005 * step,
            "grad_norm": 1.0 / step,
            "response_length/mean": 100.0 + step,
        }
        if step % 5 == 0:
            row |= {f"val/{source}/pass@1": 0.2 + 0.02 * step for source in validate_on}
            row["val/reward_timeouts"] = 0.0
        rows.append(row)
    return rows


def assert_valid_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 100 and image.shape[1] > 100


def test_metric_file_names_spell_the_metric():
    assert metric_file_name("reward/mean") == "reward_mean.png"
    assert metric_file_name("val/math500/pass@1") == "val_math500_pass_at_1.png"


def test_plot_runs_writes_one_valid_png_per_metric(tmp_path):
    runs = [
        write_run(tmp_path / "pacs", training_rows(20, validate_on=("math500", "aime2024"))),
        write_run(tmp_path / "grpo", training_rows(20, validate_on=("math500",), offset=-0.1)),
    ]
    written = plot_runs(runs, tmp_path / "plots")
    assert [path.name for path in written] == [
        "reward_mean.png",
        "loss.png",
        "response_length_mean.png",
        "grad_norm.png",
        "val_aime2024_pass_at_1.png",
        "val_math500_pass_at_1.png",
    ]
    assert sorted(path.name for path in (tmp_path / "plots").glob("*.png")) == sorted(path.name for path in written)
    for path in written:
        assert_valid_png(path)


def test_plot_runs_skips_a_metric_no_run_logged(tmp_path):
    rows = [{key: value for key, value in row.items() if key != "grad_norm"} for row in training_rows(10)]
    written = plot_runs([write_run(tmp_path / "run", rows)], tmp_path / "plots")
    assert "grad_norm.png" not in [path.name for path in written]
    assert not (tmp_path / "plots" / "grad_norm.png").exists()


def test_plot_runs_without_validation_writes_no_pass_at_1_plot(tmp_path):
    written = plot_runs([write_run(tmp_path / "run", training_rows(10, validate_on=()))], tmp_path / "plots")
    assert not [path for path in written if "pass_at_1" in path.name]


def test_plot_runs_accepts_a_single_step_run(tmp_path):
    written = plot_runs([write_run(tmp_path / "run", training_rows(1))], tmp_path / "plots")
    assert len(written) == 4


def test_plot_runs_names_the_run_directory_without_metrics(tmp_path):
    present = write_run(tmp_path / "present", training_rows(5))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty has no metrics.jsonl"):
        plot_runs([present, tmp_path / "empty"], tmp_path / "plots")
    assert not (tmp_path / "plots").exists()


def test_plot_runs_needs_one_label_per_run(tmp_path):
    run = write_run(tmp_path / "run", training_rows(5))
    with pytest.raises(ValueError, match="labels has 2 entries for 1 run directories"):
        plot_runs([run], tmp_path / "plots", labels=["a", "b"])


def reward_run(seed: int, steps: int = 30) -> list[tuple[int, float]]:
    return [(step, 0.3 + 0.01 * step + 0.02 * seed) for step in range(1, steps + 1)]


@pytest.mark.parametrize("num_seeds", [1, 3])
def test_reward_curves_are_drawn_for_one_or_several_seeds(tmp_path, num_seeds):
    curves = {
        "PACS": [reward_run(seed) for seed in range(num_seeds)],
        "GRPO": [[(step, value - 0.1) for step, value in reward_run(seed)] for seed in range(num_seeds)],
    }
    out_path = plot_reward_curves(curves, tmp_path / "figures" / "reward.png")
    assert out_path == tmp_path / "figures" / "reward.png"
    assert_valid_png(out_path)


def test_reward_curves_accept_seeds_that_logged_different_steps(tmp_path):
    curves = {"PACS": [reward_run(0, steps=30), reward_run(1, steps=20), reward_run(2, steps=10)]}
    assert_valid_png(plot_reward_curves(curves, tmp_path / "reward.png", metric_label="validation pass@1"))


def test_reward_curves_reject_a_method_without_runs(tmp_path):
    with pytest.raises(ValueError, match="curves\\['PPO'\\] must hold at least one run"):
        plot_reward_curves({"PACS": [reward_run(0)], "PPO": []}, tmp_path / "reward.png")


def pass_at_k_table(num_seeds: int) -> dict[str, dict[int, tuple[float, float]]]:
    spread = 0.02 if num_seeds > 1 else 0.0
    ks = [1, 8, 32, 64, 128, 256]
    return {
        "base": {k: (0.07 + 0.55 * k / 256, spread) for k in ks},
        "PACS": {k: (0.16 + 0.44 * k / 256, spread) for k in ks},
    }


@pytest.mark.parametrize("num_seeds", [1, 3])
def test_pass_at_k_is_drawn_for_one_or_several_seeds(tmp_path, num_seeds):
    out_path = plot_pass_at_k(pass_at_k_table(num_seeds), tmp_path / "aime2024.png", title="AIME 2024")
    assert out_path == tmp_path / "aime2024.png"
    assert_valid_png(out_path)


def test_pass_at_k_rejects_a_k_below_one(tmp_path):
    with pytest.raises(ValueError, match="table\\['PACS'\\] must map integers k >= 1"):
        plot_pass_at_k({"PACS": {0: (0.1, 0.0)}}, tmp_path / "passk.png")


def test_runs_of_the_same_name_get_distinct_labels(tmp_path):
    runs = [tmp_path / "compare" / "pacs" / "seed_0", tmp_path / "compare" / "grpo" / "seed_0"]
    assert run_labels(runs) == ["pacs/seed_0", "grpo/seed_0"]
    assert run_labels([tmp_path / "a"]) == ["a"]


def test_smoothing_is_tensorboards_debiased_moving_average():
    # last_t = w last_{t-1} + (1 - w) x_t from 0, divided by 1 - w^t: with w = 0.5 and (1, 0, 0),
    # 0.5 / 0.5, 0.25 / 0.75, 0.125 / 0.875
    assert smoothed([1.0, 0.0, 0.0], 0.5) == pytest.approx([1.0, 1 / 3, 1 / 7])
    assert smoothed([3.0, 1.0, 2.0], 0.0) == [3.0, 1.0, 2.0]


@pytest.mark.slow
def test_plot_runs_draws_smoothed_curves(tmp_path):
    run = write_run(tmp_path / "pacs", training_rows(20))
    written = plot_runs([run], tmp_path / "plots", smoothing=0.9)
    assert_valid_png(written[0])


@pytest.mark.parametrize("weight", ["1", "-0.1", "x"])
def test_a_smoothing_weight_outside_0_to_1_is_refused_naming_the_option(tmp_path, weight, capsys):
    with pytest.raises(SystemExit):
        main(["plot", str(tmp_path), "--smooth", weight])
    assert f"argument --smooth: expected a smoothing weight in [0, 1), got {weight!r}" in capsys.readouterr().err


def test_plot_runs_marks_where_a_resumed_run_changed_its_settings(tmp_path, monkeypatch):
    run = write_run(tmp_path / "run", training_rows(6))
    segments = [
        {"from_step": 1, "changes": {}, "config": {}},
        {"from_step": 4, "changes": {"train.lr": [1e-4, 1e-3]}, "config": {}},
    ]
    (run / SEGMENTS).write_text("".join(json.dumps(segment) + "\n" for segment in segments))
    marked = []
    monkeypatch.setattr(Axes, "axvline", lambda axes, x, **style: marked.append((axes.get_title(), x)))
    texts = []
    annotate = Axes.annotate
    monkeypatch.setattr(
        Axes, "annotate", lambda axes, text, *args, **kwargs: texts.append(text) or annotate(axes, text, *args, **kwargs)
    )

    written = plot_runs([run], tmp_path / "plots")

    assert {x for _, x in marked} == {3.5} and len(marked) == len(written)  # one mark in each figure
    assert set(texts) == {"changed: train.lr"}


@pytest.mark.parametrize(("algorithm", "marked"), [("pacs", True), ("grpo", False)])
def test_the_loss_figure_of_a_pacs_run_marks_ln_2(tmp_path, monkeypatch, algorithm, marked):
    run = write_run(tmp_path / "run", training_rows(3))
    (run / "config.yaml").write_text(f"seed: 0\nalgorithm:\n  name: {algorithm}\n")
    lines = []
    monkeypatch.setattr(Axes, "axhline", lambda axes, y, **style: lines.append((axes.get_title(), y)))
    plot_runs([run], tmp_path / "plots")
    assert lines == ([("loss", math.log(2))] if marked else [])


def test_the_validation_before_training_starts_the_validation_curve_and_no_training_curve(tmp_path, monkeypatch):
    before_training = {"step": 0, "val/math500/pass@1": 0.1, "val/reward_timeouts": 0.0, "time/validate_s": 1.0}
    run_dir = write_run(tmp_path / "run", [before_training, *training_rows(10)])
    drawn: dict[str, list[int]] = {}
    plot = Axes.plot
    monkeypatch.setattr(
        Axes,
        "plot",
        lambda axes, steps, *args, **kwargs: (
            drawn.setdefault(axes.get_title(), list(steps)) and plot(axes, steps, *args, **kwargs)
        ),
    )
    plot_runs([run_dir], tmp_path / "plots")
    assert drawn["val/math500/pass@1"] == [0, 5, 10]
    assert drawn["reward/mean"][0] == drawn["loss"][0] == 1
