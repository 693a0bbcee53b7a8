"""`pacs compare` trains every method identically and writes the paper-layout table (miniature)."""

from __future__ import annotations

import json

import pytest

from pacs.cli import main
from pacs.compare import run_comparison

pytestmark = pytest.mark.slow

TINY = [
    "train.steps=2",
    "train.batch_size=4",
    "train.mini_batch_size=2",
    "rollout.n=4",
    "data.train=builtin:arithmetic?max_operand=19&size=32",
    "data.val=builtin:arithmetic?max_operand=19&size=8",
]


@pytest.fixture(scope="module")
def comparison(tmp_path_factory, warm_model_dir):
    out = tmp_path_factory.mktemp("compare")
    report = run_comparison(
        "builtin:compare-demo", ["pacs", "grpo", "ppo"], [0], out, eval_n=4, overrides=TINY, show_progress=False
    )
    return out, report


def test_every_method_and_the_unweighted_ablation_is_trained_and_evaluated(comparison):
    out, report = comparison
    rows = report["results"]["arithmetic"]
    assert list(rows) == ["base model", "pacs", "grpo", "ppo", "pacs (no weighting)"]
    assert set(rows["pacs"]) == {"pass@1", "pass@2", "pass@4"}
    assert rows["pacs"]["pass@1"]["std"] == 0.0 and len(rows["pacs"]["pass@1"]["per_seed"]) == 1
    assert json.loads((out / "comparison.json").read_text())["seeds"] == [0]


def test_runs_differ_only_in_the_algorithm(comparison):
    out, _ = comparison
    configs = {name: (out / name / "seed_0" / "config.yaml").read_text() for name in ("pacs", "grpo", "pacs_no_weighting")}
    differing = {line for text in configs.values() for line in text.splitlines()} - set.intersection(
        *(set(text.splitlines()) for text in configs.values())
    )
    assert all(line.strip().startswith(("name:", "weighting:", "output_dir:")) for line in differing), differing


def test_table_and_plots_are_written(comparison):
    out, _ = comparison
    table = (out / "comparison.md").read_text()
    assert "| method | pass@1 | pass@2 | pass@4 |" in table and "| pacs (no weighting) |" in table
    for name in ("reward_curves.png", "pass_at_k_arithmetic.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG")


def test_an_interrupted_comparison_reuses_finished_runs(comparison, monkeypatch):
    out, report = comparison
    monkeypatch.setattr("pacs.compare.train", lambda *a, **k: pytest.fail("a finished run was trained again"))
    again = run_comparison("builtin:compare-demo", ["pacs", "grpo", "ppo"], [0], out, eval_n=4, overrides=TINY, show_progress=False)
    assert again["results"] == report["results"]


def test_unknown_algorithm_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--config", "builtin:compare-demo", "--algorithms", "pacs,dpo", "--out", str(tmp_path)])
    assert "unknown algorithms ['dpo']" in capsys.readouterr().err
