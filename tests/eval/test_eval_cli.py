"""`pacs eval` and `pacs compare` refuse numeric arguments outside their range before any work."""

from __future__ import annotations

import pytest

from pacs.cli import main


@pytest.mark.parametrize(
    ("option", "value", "valid"),
    [
        ("--n", "0", "an integer >= 1"),
        ("--n", "two", "an integer >= 1"),
        ("--max-tokens", "0", "an integer >= 1"),
        ("--temperature", "-0.5", "a finite number >= 0"),
        ("--top-p", "1.5", "a number in (0, 1]"),
        ("--reward-timeout", "-1", "a finite number > 0"),
        ("--reward-workers", "-1", "an integer >= 0"),
    ],
)
def test_eval_refuses_a_numeric_argument_out_of_range_naming_it(tmp_path, tiny_model_dir, capsys, option, value, valid):
    arguments = {"--model": str(tiny_model_dir), "--data": "builtin:arithmetic?size=2", "--n": "2", "--out": str(tmp_path)}
    arguments[option] = value
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", *[text for pair in arguments.items() for text in pair]])
    assert exit_info.value.code == 2
    shown = "-n/--n" if option == "--n" else option  # -n: what to write under torchrun
    assert f"argument {shown}: expected {valid}, got '{value}'" in capsys.readouterr().err
    assert not (tmp_path / "eval_metrics.json").exists()


def test_compare_refuses_eval_n_below_one(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--config", "builtin:compare-demo", "--eval-n", "0", "--out", str(tmp_path)])
    assert "argument --eval-n: expected an integer >= 1, got '0'" in capsys.readouterr().err
