"""`pacs train` with an algorithm defined outside pacs (docs/examples/my_algorithm.py, the example
of docs/algorithms/custom.md), named by its import path: nothing in pacs changes."""

from __future__ import annotations

import pytest
import torch
from mixed_rewards import MIXED_GROUPS
from plugin_algorithms import EXAMPLES
from safetensors.torch import load_file

from pacs.cli import main
from pacs.train.metrics import read_metrics

pytestmark = pytest.mark.slow


def test_an_algorithm_from_a_users_file_trains_two_steps_on_the_demo(tmp_path, warm_model_dir, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    overrides = [
        f"output_dir={tmp_path / 'run'}",
        f"model.path={warm_model_dir}",
        "algorithm.name=my_algorithm:ReinforceConfig",
        "algorithm.baseline=group_mean",
        "data.train=builtin:arithmetic?size=32",
        "data.val=null",
        "train.steps=2",
        "train.batch_size=4",
        "train.mini_batch_size=2",
        "rollout.n=4",
        *MIXED_GROUPS,
    ]
    main(["train", "--config", "builtin:demo", *overrides])
    rows = read_metrics(tmp_path / "run")
    assert [row["step"] for row in rows] == [1, 2]
    assert all(row["reinforce/advantage_abs"] == 0.5 and row["updates/skipped"] == 0 for row in rows)
    assert " ".join(capsys.readouterr().err.split()).count("note: REINFORCE with a group baseline") == 1
    before, after = (
        load_file(warm_model_dir / "model.safetensors"),
        load_file(tmp_path / "run" / "checkpoints" / "final" / "model.safetensors"),
    )
    assert any(not torch.equal(before[name], after[name]) for name in before)
