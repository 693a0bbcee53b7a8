"""The `pacs` command's own options: version, help with defaults, refusals of `pacs sft` and
`pacs eval` arguments before any work, and a `pacs prepare` that starts without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest
from benchmark_data import BENCHMARK_DATA
from running import run

import pacs


def test_prepare_imports_neither_torch_nor_transformers(tmp_path):
    """`pacs prepare` only reads and writes data files: it does not pay seconds of imports."""
    script = (
        "import sys\nfrom pacs.cli import main\nmain(sys.argv[1:])\nprint(sorted({'torch', 'transformers'} & set(sys.modules)))"
    )
    out = tmp_path / "amc23.parquet"
    result = subprocess.run(
        [sys.executable, "-c", script, "prepare", "--input", str(BENCHMARK_DATA / "amc23.jsonl"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert out.is_file() and result.stdout.splitlines()[-1] == "[]"


def test_version_is_printed(capsys):
    assert run(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"pacs {pacs.__version__}"


def test_sft_help_shows_the_defaults(capsys):
    assert run(["sft", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "(default: 300)" in help_text and "(default: 0.003)" in help_text


@pytest.mark.parametrize(
    ("option", "value", "valid"),
    [("--steps", "-3", "an integer >= 1"), ("--batch-size", "0", "an integer >= 1"), ("--lr", "inf", "a finite number > 0")],
)
def test_sft_refuses_a_numeric_argument_out_of_range_and_writes_nothing(tmp_path, capsys, option, value, valid):
    assert run(["sft", "--out", str(tmp_path / "model"), option, value]) == 2
    assert f"argument {option}: expected {valid}, got '{value}'" in capsys.readouterr().err
    assert not (tmp_path / "model").exists()


def test_eval_refuses_an_existing_file_as_out_before_evaluating(tmp_path, tiny_model_dir, capsys, monkeypatch):
    out = tmp_path / "eval"
    out.write_text("a file of mine")
    monkeypatch.setattr("pacs.eval.evaluate.load_causal_lm", lambda *a, **k: pytest.fail("the model was loaded"))
    assert run(["eval", "--model", str(tiny_model_dir), "--data", "builtin:arithmetic", "--n", "1", "--out", str(out)]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert out.read_text() == "a file of mine"


@pytest.mark.parametrize("data", [",", " , "])
def test_eval_refuses_data_that_names_no_dataset(tmp_path, tiny_model_dir, capsys, data):
    assert run(["eval", "--model", str(tiny_model_dir), "--data", data, "--n", "1", "--out", str(tmp_path / "e")]) == 2
    assert "argument --data: expected comma-separated dataset specs" in capsys.readouterr().err
    assert not (tmp_path / "e").exists()


def test_train_print_config_prints_the_resolved_config_that_config_reads_back_and_writes_nothing(tmp_path, capsys):
    from pacs.config import load_config

    out = tmp_path / "run"
    assert run(["train", "--config", "builtin:demo", f"output_dir={out}", "train.steps=7", "--print-config"]) == 0
    printed = tmp_path / "printed.yaml"
    printed.write_text(capsys.readouterr().out)
    assert load_config(str(printed)) == load_config("builtin:demo", [f"output_dir={out}", "train.steps=7"])
    assert not out.exists()
