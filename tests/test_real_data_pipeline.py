"""`pacs prepare` -> `pacs train` -> `pacs eval` on real benchmark files with the built-in tiny model.

The tiny model's answers are wrong; these runs check the pipeline and its reports.
"""

from __future__ import annotations

import json

import pytest

from conftest import SHARED_DATA
from pacs.cli import main
from pacs.train.metrics import read_metrics

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared")
    main(["prepare", "--input", str(SHARED_DATA / "aime2025.jsonl"), "--out", str(out / "aime2025.parquet"), "--repeat", "2"])
    main(["prepare", "--input", str(SHARED_DATA / "amc23.jsonl"), "--out", str(out / "amc23.parquet")])
    return out


def test_prepare_reports_the_repaired_rows(tmp_path, capsys):
    main(["prepare", "--input", str(SHARED_DATA / "aime2025.jsonl"), "--out", str(tmp_path / "a.parquet")])
    assert "repaired in 3 rows (18, 19, 27)" in capsys.readouterr().out


def test_train_on_a_prepared_math_file_filters_long_prompts_and_logs(tmp_path, prepared, tiny_model_dir, capsys):
    main(
        [
            "train",
            f"output_dir={tmp_path / 'run'}",
            f"model.path={tiny_model_dir}",
            f"data.train={prepared / 'amc23.parquet'}",
            "data.val=null",
            "data.max_prompt_length=300",
            "data.max_response_length=8",
            "train.steps=1",
            "train.batch_size=4",
            "train.mini_batch_size=2",
            "rollout.n=2",
        ]
    )
    assert "longer than data.max_prompt_length=300 tokens and were left out" in capsys.readouterr().err
    (row,) = read_metrics(tmp_path / "run")
    assert row["reward/timeouts"] == 0.0 and 0.0 <= row["reward/mean"] <= 1.0


def test_eval_over_several_files_reports_each_data_source_with_repeats_merged(tmp_path, prepared, tiny_model_dir):
    specs = f"{prepared / 'aime2025.parquet'},{prepared / 'amc23.parquet'}"
    main(["eval", "--model", str(tiny_model_dir), "--data", specs, "--n", "2", "--max-tokens", "8", "--out", str(tmp_path)])
    metrics = json.loads((tmp_path / "eval_metrics.json").read_text())
    assert set(metrics["aime2025"]) == {"pass@1", "pass@2", "pass@4"}
    assert set(metrics["amc23"]) == {"pass@1", "pass@2"}
    samples = [json.loads(line) for line in (tmp_path / "eval_rollout.jsonl").read_text().splitlines()]
    assert sum(s["data_source"] == "aime2025" for s in samples) == 30 * 4
