"""`pacs demo` runs warm-start -> base eval -> PACS -> final eval and reports both (shortened here)."""

from __future__ import annotations

import json

import pytest

from pacs.cli import main
from pacs.train.builtin_models import warm_started_tiny

pytestmark = [pytest.mark.slow, pytest.mark.warm_model]


def test_demo_reports_base_and_final_metrics_and_checkpoints(tmp_path, capsys):
    out = tmp_path / "demo"
    main(["demo", "--seed", "0", "--out", str(out), "train.steps=3", "train.eval_every=0", "train.save_every=0"])
    report = json.loads((out / "report.json").read_text())
    assert set(report["base"]) == set(report["final"]) == {"pass@1", "pass@2", "pass@4", "pass@8", "pass@16"}
    assert report["base_checkpoint"] == str(warm_started_tiny(0))
    assert (out / "train" / "checkpoints" / "final" / "model.safetensors").is_file()
    assert report["final_checkpoint"] == str(out / "train" / "checkpoints" / "final")
    printed = capsys.readouterr().out
    assert "base (warm-start)" in printed and "gain" in printed
    assert (out / "plots" / "reward_mean.png").is_file() and (out / "plots" / "loss.png").is_file()
    first = json.loads((out / "train" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 0 and "val/arithmetic/pass@1" in first  # the validation curve starts before training
    assert (out / "plots" / "val_arithmetic_pass_at_1.png").is_file()
    assert f"tensorboard --logdir {out / 'train' / 'tensorboard'}" in " ".join(printed.split())
