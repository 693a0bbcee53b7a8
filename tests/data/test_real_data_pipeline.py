"""`pacs prepare` -> `pacs train` -> `pacs eval` on real benchmark files with the built-in tiny model.

The tiny model's answers are wrong; these runs check the pipeline and its reports.
"""

from __future__ import annotations

import json

import pytest
from benchmark_data import BENCHMARK_DATA

from pacs.cli import main
from pacs.train.metrics import read_metrics

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared")
    main(["prepare", "--input", str(BENCHMARK_DATA / "aime2025.jsonl"), "--out", str(out / "aime2025.parquet"), "--repeat", "2"])
    main(["prepare", "--input", str(BENCHMARK_DATA / "amc23.jsonl"), "--out", str(out / "amc23.parquet")])
    return out


def test_prepare_reports_the_repaired_rows(tmp_path, capsys):
    main(["prepare", "--input", str(BENCHMARK_DATA / "aime2025.jsonl"), "--out", str(tmp_path / "a.parquet")])
    assert "repaired in 3 rows (lines 19, 20, 28)" in capsys.readouterr().out


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
    sources = json.loads((tmp_path / "eval_metrics.json").read_text())["data_sources"]
    assert (sources["aime2025"]["problems"], sources["aime2025"]["samples_per_problem"]) == (30, 4)
    assert set(sources["aime2025"]["pass@k"]) == {"pass@1", "pass@2", "pass@4"}
    assert (sources["amc23"]["problems"], sources["amc23"]["samples_per_problem"]) == (40, 2)
    assert set(sources["amc23"]["pass@k"]) == {"pass@1", "pass@2"}
    samples = [json.loads(line) for line in (tmp_path / "eval_rollout.jsonl").read_text().splitlines()]
    assert sum(s["data_source"] == "aime2025" for s in samples) == 30 * 4


def test_eval_refuses_two_benchmarks_prepared_under_one_source_naming_their_rows(tmp_path, prepared, tiny_model_dir, capsys):
    mislabelled = tmp_path / "aime2024_as_2025.parquet"
    main(
        [
            "prepare",
            "--input",
            str(BENCHMARK_DATA / "aime2024.jsonl"),
            "--source",
            "aime2025",
            "--out",
            str(mislabelled),
            "--repeat",
            "2",
        ]
    )
    specs = f"{prepared / 'aime2025.parquet'},{mislabelled}"
    with pytest.raises(SystemExit):
        main(
            [
                "eval",
                "--model",
                str(tiny_model_dir),
                "--data",
                specs,
                "--n",
                "2",
                "--max-tokens",
                "8",
                "--out",
                str(tmp_path / "eval"),
            ]
        )
    assert (
        f"{prepared / 'aime2025.parquet'}: row 1 and {mislabelled}: row 1 share data_source 'aime2025', "
        "extra_info.index 0 but their prompts differ"
    ) in capsys.readouterr().err
    assert not (tmp_path / "eval" / "eval_metrics.json").exists()
