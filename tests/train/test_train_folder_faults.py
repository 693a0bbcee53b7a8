"""A run's folder under faults the run did not cause: moved away while it runs."""

from __future__ import annotations

import pytest
from test_train_loop import small_config

from pacs.outputs import RunMoved
from pacs.train import metrics as metrics_module
from pacs.train.trainer import train

pytestmark = pytest.mark.slow

NO_VALIDATION = ["data.val=null", "train.lr_schedule=constant", "train.save_every=0"]


def test_a_run_whose_folder_is_moved_away_stops_saying_where_it_went(tmp_path, tiny_model_dir, monkeypatch):
    run, elsewhere = tmp_path / "run", tmp_path / "run.moved"
    log = metrics_module.MetricsLogger.log

    def log_then_move(self, step, metrics):
        log(self, step, metrics)
        if step == 1:
            run.rename(elsewhere)

    monkeypatch.setattr(metrics_module.MetricsLogger, "log", log_then_move)
    with pytest.raises(RunMoved, match=f"it is now {elsewhere}"):
        train(small_config(run, tiny_model_dir, *NO_VALIDATION, "train.steps=3"), show_progress=False)
    assert not run.exists()
    assert len((elsewhere / "metrics.jsonl").read_text().splitlines()) == 1  # step 2 was not written
