"""`pacs demo`: warm-start -> evaluate the base model -> PACS training -> evaluate the final
model -> a before/after table, `report.json` and the training curves (`plots/`, `pacs.plots.plot_runs`).
Runs on a laptop CPU in a few minutes."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pacs import EVAL_SAMPLING
from pacs.config import Config
from pacs.distributed.world import World
from pacs.eval.evaluate import evaluate_model
from pacs.outputs import claim_output_dir
from pacs.plots import plot_runs
from pacs.train.builtin_models import warm_started_tiny
from pacs.train.preflight import check_run_inputs, load_run_config
from pacs.train.trainer import train

DEMO_EVAL = {"spec": "builtin:arithmetic?max_operand=19", "n": 16, **EVAL_SAMPLING, "max_tokens": 16}


def run_demo(seed: int = 0, out_dir: str = "runs/demo", overrides: list[str] = (), *, show_progress: bool = True) -> dict:
    """Run the whole demo; return (and write to `out_dir/report.json`) both metric sets.

    `overrides` (`key=value`) adjust the training recipe `configs/demo.yaml`. They are checked
    before anything is written; then a previous demo in `out_dir` is moved aside to
    `out_dir.superseded` (`pacs.outputs.claim_output_dir`), never deleted."""
    console = Console(soft_wrap=True)
    start = time.perf_counter()
    out = Path(out_dir)

    def recipe(model_path: str) -> Config:
        return load_run_config(
            "builtin:demo",
            [*overrides, f"seed={seed}", f"output_dir={out / 'train'}", f"model.path={model_path}", "resume=never"],
        )

    check_run_inputs(recipe("builtin:tiny-arithmetic"))
    if aside := claim_output_dir(out, "pacs demo", replace=True):
        console.print(f"the previous demo run in {out} is now {aside}")
    console.rule(f"pacs demo (seed {seed})")
    console.print("1/4 warm-start of the tiny model on builtin:arithmetic (cached after the first run)")
    base_model = warm_started_tiny(seed, show_progress=show_progress)

    def evaluate(model: Path, name: str) -> dict[str, float]:
        result = evaluate_model(
            str(model),
            [DEMO_EVAL["spec"]],
            processes=World.single(),
            n=DEMO_EVAL["n"],
            out_dir=out / name,
            temperature=DEMO_EVAL["temperature"],
            top_p=DEMO_EVAL["top_p"],
            max_tokens=DEMO_EVAL["max_tokens"],
            seed=seed,
            show_progress=show_progress,
        )
        return result.metrics["arithmetic"]

    console.print(f"2/4 evaluating the base model ({DEMO_EVAL['n']} samples per held-out problem)")
    base_metrics = evaluate(base_model, "eval_base")
    console.print("3/4 PACS training")
    result = train(recipe(str(base_model)), show_progress=show_progress)
    console.print("4/4 evaluating the trained model")
    final_metrics = evaluate(result.final_checkpoint, "eval_final")

    table = Table(title=f"builtin:arithmetic held-out split, temperature {DEMO_EVAL['temperature']}")
    table.add_column("model")
    for key in base_metrics:
        table.add_column(key, justify="right")
    table.add_row("base (warm-start)", *(f"{100 * v:.1f}" for v in base_metrics.values()))
    table.add_row("PACS", *(f"{100 * v:.1f}" for v in final_metrics.values()))
    table.add_row("gain", *(f"{100 * (final_metrics[k] - v):+.1f}" for k, v in base_metrics.items()))
    console.print(table)
    elapsed = time.perf_counter() - start
    report = {
        "seed": seed,
        "base": base_metrics,
        "final": final_metrics,
        "base_checkpoint": str(base_model),
        "final_checkpoint": str(result.final_checkpoint),
        "train_dir": str(result.output_dir),
        "seconds": round(elapsed, 1),
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    plots = plot_runs([result.output_dir], out / "plots")
    console.print(
        f"done in {elapsed:.0f} s; report: {out / 'report.json'}; training curves: {len(plots)} PNGs in {out / 'plots'}"
    )
    console.print(f"next: tensorboard --logdir {result.output_dir / 'tensorboard'}   (the training run's every metric)")
    return report
