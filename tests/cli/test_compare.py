"""`pacs compare` trains every method identically and writes the paper-layout table (miniature)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import yaml

from pacs import compare
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
    "reward.num_workers=0",  # scored in-process: a pool of scoring processes costs each run about a core-second
]
ALGORITHMS = ["pacs", "grpo", "ppo", "dr_grpo", "dapo", "gspo", "cispo", "pacs", "pacs[train.lr=5e-6]"]
"""Every algorithm, PACS a second time (an A/A run) and a variant of PACS."""


@pytest.fixture(scope="module")
def comparison(tmp_path_factory, warm_model_dir):
    out = tmp_path_factory.mktemp("compare")
    report = run_comparison("builtin:compare-demo", ALGORITHMS, [0], out, eval_n=4, overrides=TINY, show_progress=False)
    return out, report


def test_every_method_and_the_unweighted_ablation_is_trained_and_evaluated(comparison):
    out, report = comparison
    rows = report["results"]["arithmetic"]
    assert list(rows) == [
        "base model", "pacs", "grpo", "ppo", "dr_grpo", "dapo", "gspo", "cispo", "pacs (run 2)", "pacs [train.lr=5e-6]",
        "pacs (no weighting)",
    ]  # fmt: skip
    assert set(rows["pacs"]["pass@k"]) == {"pass@1", "pass@2", "pass@4"}
    assert rows["pacs"]["pass@k"]["pass@1"]["std"] == 0.0 and len(rows["pacs"]["pass@k"]["pass@1"]["per_seed"]) == 1
    assert json.loads((out / "comparison.json").read_text())["seeds"] == [0]


def test_each_evaluations_counts_are_carried_into_the_json_and_the_table(comparison):
    out, report = comparison
    (counts,) = report["results"]["arithmetic"]["grpo"]["per_seed"]
    assert counts == {
        "problems": 8,
        "samples_per_problem": 4,
        "prompts_dropped_too_long": 0,
        "timeouts": 0,
        "crashes": 0,
        "max_new_tokens": {"requested": 16, "min": 16, "max": 16, "prompts_below_requested": 0},
    }
    table = (out / "comparison.md").read_text()
    assert "| method | problems | samples per problem | prompts too long | timeouts | crashes | max new tokens |" in table
    assert "| grpo | 8 | 4 | 0 | 0 | 0 | 16 |" in table


def test_runs_differ_only_in_the_algorithm(comparison):
    out, _ = comparison
    configs = {
        name: yaml.safe_load((out / name / "seed_0" / "config.yaml").read_text())
        for name in ("pacs", "grpo", "pacs_no_weighting")
    }
    algorithms = {name: config.pop("algorithm") for name, config in configs.items()}
    for config in configs.values():
        config.pop("output_dir")
    assert configs["pacs"] == configs["grpo"] == configs["pacs_no_weighting"]
    assert {**algorithms["pacs_no_weighting"], "weighting": "question"} == algorithms["pacs"]
    shared = ("kl_coef", "kl_estimator", "entropy_coef", "loss_agg", "rollout_is_cap")
    assert {key: algorithms["grpo"][key] for key in shared} == {key: algorithms["pacs"][key] for key in shared}


def test_each_method_trains_with_its_own_papers_aggregation(comparison):
    out, _ = comparison
    loss_agg = {
        name: yaml.safe_load((out / name / "seed_0" / "config.yaml").read_text())["algorithm"]["loss_agg"]
        for name in ("grpo", "dr_grpo", "dapo", "gspo", "cispo")
    }
    assert loss_agg == {
        "grpo": "seq-mean-token-sum-norm", "dr_grpo": "seq-mean-token-sum-norm", "dapo": "token-mean",
        "gspo": "seq-mean-token-mean", "cispo": "token-mean",
    }  # fmt: skip


def test_an_algorithm_listed_again_is_an_a_a_run_with_other_training_seeds(comparison):
    out, report = comparison
    first, again = (yaml.safe_load((out / name / "seed_0" / "config.yaml").read_text()) for name in ("pacs", "pacs_run_2"))
    assert (first["seed"], again["seed"]) == (0, 1000) and first["model"] == again["model"]
    assert {**again, "seed": 0, "output_dir": first["output_dir"]} == first
    assert report["training_seed_offsets"]["pacs (run 2)"] == 1000 and report["training_seed_offsets"]["pacs"] == 0
    assert "pacs (run 2) with seeds + 1000" in (out / "comparison.md").read_text()


def test_an_algorithm_with_overrides_in_brackets_is_a_variant_trained_with_the_same_seeds(comparison):
    out, report = comparison
    plain, variant = (
        yaml.safe_load((out / name / "seed_0" / "config.yaml").read_text()) for name in ("pacs", "pacs_train.lr-5e-6")
    )
    assert variant["train"]["lr"] == 5e-6 and variant["seed"] == plain["seed"] == 0
    assert {**variant, "train": {**variant["train"], "lr": plain["train"]["lr"]}, "output_dir": plain["output_dir"]} == plain
    assert report["training_seed_offsets"]["pacs [train.lr=5e-6]"] == 0


@pytest.mark.parametrize("variant", ["pacs[rollout.max_staleness]", "pacs[]", "pacs[train.lr=1e-6"])
def test_a_variant_without_key_value_overrides_is_refused_saying_how_to_write_one(variant, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(
            [
                "compare",
                "--config",
                "builtin:compare-demo",
                "--algorithms",
                f"pacs,{variant},grpo",
                "--out",
                str(tmp_path / "out"),
            ]
        )
    assert "a variant is NAME[key=value key=value ...]" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_paper_baselines_are_refused_for_methods_the_paper_did_not_compare(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(
            [
                "compare",
                "--config",
                "builtin:compare-demo",
                "--algorithms",
                "pacs,dapo",
                "--paper-baselines",
                "--out",
                str(tmp_path / "out"),
            ]
        )
    assert "which are not the settings of dapo" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "out").exists()


def test_table_and_plots_are_written(comparison):
    out, _ = comparison
    table = (out / "comparison.md").read_text()
    assert "| method | pass@1 | pass@2 | pass@4 |" in table and "| pacs (no weighting) |" in table
    for name in ("reward_curves.png", "pass_at_k_arithmetic.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG")


def test_an_interrupted_comparison_reuses_finished_runs_and_evaluations(comparison, monkeypatch):
    out, report = comparison
    monkeypatch.setattr("pacs.compare.train", lambda *a, **k: pytest.fail("a finished run was trained again"))
    monkeypatch.setattr("pacs.compare.evaluate_model", lambda *a, **k: pytest.fail("a finished evaluation was redone"))
    again = run_comparison("builtin:compare-demo", ALGORITHMS, [0], out, eval_n=4, overrides=TINY, show_progress=False)
    assert again["results"] == report["results"]


def test_evaluations_made_with_other_settings_are_redone_not_reused(comparison, tmp_path, monkeypatch, capsys):
    out = shutil.copytree(comparison[0], tmp_path / "compare")
    monkeypatch.setattr("pacs.compare.train", lambda *a, **k: pytest.fail("a finished run was trained again"))
    again = run_comparison("builtin:compare-demo", ["grpo"], [0], out, eval_n=2, overrides=TINY, show_progress=False)
    rows = again["results"]["arithmetic"]
    assert set(rows["base model"]["pass@k"]) == set(rows["grpo"]["pass@k"]) == {"pass@1", "pass@2"}
    assert rows["grpo"]["per_seed"][0]["samples_per_problem"] == 2
    assert "was evaluated with other settings (n: 4 -> 2): evaluating again" in " ".join(capsys.readouterr().out.split())


def test_a_run_trained_with_other_settings_is_trained_again_and_the_old_one_kept(comparison, tmp_path, capsys):
    out = shutil.copytree(comparison[0], tmp_path / "compare")
    run_comparison(
        "builtin:compare-demo", ["grpo"], [0], out, eval_n=4, overrides=[*TINY, "train.lr=0.0002"], show_progress=False
    )
    assert "train.lr: 0.0001 -> 0.0002" in " ".join(capsys.readouterr().out.split())
    assert "lr: 0.0002" in (out / "grpo" / "seed_0" / "config.yaml").read_text()
    assert "lr: 0.0001" in (out / "grpo" / "seed_0.superseded" / "config.yaml").read_text()


def test_each_method_is_set_against_the_baseline_with_a_paired_interval(comparison):
    out, report = comparison
    rows = report["results"]["arithmetic"]
    assert report["baseline"] == "grpo" and "vs_baseline" not in rows["grpo"]
    for method in ("base model", "pacs", "ppo", "pacs (no weighting)"):
        against = rows[method]["vs_baseline"]["pass@1"]
        # the same problems on both sides: the mean paired difference is the difference of the means
        expected = rows[method]["pass@k"]["pass@1"]["mean"] - rows["grpo"]["pass@k"]["pass@1"]["mean"]
        assert against["difference"] == pytest.approx(expected, abs=1e-12) and against["per_seed"] == [against["difference"]]
        low, high = against["ci95"]
        assert low <= against["difference"] <= high and against["significant"] == (low > 0 or high < 0)
    assert "Against grpo: paired difference in percentage points" in (out / "comparison.md").read_text()


def test_a_baseline_that_is_not_compared_is_refused_before_training(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(
            [
                "compare",
                "--config",
                "builtin:compare-demo",
                "--algorithms",
                "pacs",
                "--baseline",
                "rloo",
                "--out",
                str(tmp_path / "out"),
            ]
        )
    assert (
        "baseline 'rloo' is not among the methods compared; pass --baseline with one of: base model, pacs, pacs (no weighting)"
        in " ".join(capsys.readouterr().err.split())
    )
    assert not (tmp_path / "out").exists()


def test_unknown_algorithm_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--config", "builtin:compare-demo", "--algorithms", "pacs,dpo", "--out", str(tmp_path)])
    assert "unknown algorithms ['dpo']" in capsys.readouterr().err


def test_tables_are_printed_unwrapped_in_a_log(comparison, monkeypatch, capsys):
    out, _ = comparison
    monkeypatch.setattr("pacs.compare.train", lambda *a, **k: pytest.fail("a finished run was trained again"))
    run_comparison("builtin:compare-demo", ALGORITHMS, [0], out, eval_n=4, overrides=TINY, show_progress=False)
    header = "| method | problems | samples per problem | prompts too long | timeouts | crashes | max new tokens |"
    printed = capsys.readouterr().out
    assert header in printed.splitlines()
    assert "| pacs [train.lr=5e-6] | 8 | 4 | 0 | 0 | 0 | 16 |" in printed  # brackets are not console markup


def test_seeds_that_are_not_integers_are_refused_naming_the_option(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--config", "builtin:compare-demo", "--seeds", "0,x", "--out", str(tmp_path)])
    assert "argument --seeds: expected comma-separated integer seeds, got '0,x'" in capsys.readouterr().err


def test_one_seed_is_warned_about_in_the_report(comparison):
    out, report = comparison
    assert "**Warning: 1 seed.** Compare over at least 3 seeds" in (out / "comparison.md").read_text()
    assert report["results"]["arithmetic"]["pacs"]["vs_baseline"]["pass@1"]["detectable"] is None


def evaluation(correct_counts: list[int], samples: int = 4) -> dict:
    """One seed's evaluation entry of a data source, as `eval_metrics.json` holds it."""
    return {"pass@k": {"pass@1": 0.0}, "samples_per_problem": samples, "problem_indices": list(range(len(correct_counts))),
            "correct_counts": correct_counts}  # fmt: skip


def test_each_difference_says_what_its_seeds_can_detect_and_how_many_it_would_need():
    from pacs.compare import _against_baseline
    from pacs.eval.significance import minimum_detectable_difference, seeds_needed

    method = [evaluation([4, 2, 1]), evaluation([3, 3, 0]), evaluation([4, 4, 2])]
    baseline = [evaluation([2, 2, 1]), evaluation([3, 1, 0]), evaluation([2, 2, 2])]
    pass_at_1 = _against_baseline(method, baseline, "test")["pass@1"]
    per_seed = [(2 / 4) / 3, (2 / 4) / 3, (4 / 4) / 3]
    assert pass_at_1["per_seed"] == pytest.approx(per_seed)
    seed_sd = float(np.std(per_seed, ddof=1))
    assert pass_at_1["seed_sd"] == pytest.approx(seed_sd)
    assert pass_at_1["detectable"] == pytest.approx(minimum_detectable_difference(seed_sd, 3))
    assert pass_at_1["seeds_needed"] == seeds_needed(float(np.mean(per_seed)), seed_sd)


def test_a_rerun_says_what_it_reused_and_ends_listing_every_file_it_wrote(comparison, monkeypatch, capsys):
    out, _ = comparison
    monkeypatch.setattr("pacs.compare.train", lambda *a, **k: pytest.fail("a finished run was trained again"))
    monkeypatch.setattr("pacs.compare.evaluate_model", lambda *a, **k: pytest.fail("a finished evaluation was redone"))
    capsys.readouterr()
    run_comparison("builtin:compare-demo", ALGORITHMS, [0], out, eval_n=4, overrides=TINY, show_progress=False)
    said = capsys.readouterr().out
    assert f"{out / 'pacs' / 'seed_0'}: trained before with these settings, reused" in said
    assert f"{out / 'base' / 'seed_0'}: evaluated before with these settings, reused" in said
    written = ["comparison.md", "comparison.json", "reward_curves.png", "pass_at_k_arithmetic.png"]
    assert said.splitlines()[-5].endswith("wrote:")
    assert said.splitlines()[-4:] == [f"  {out / name}" for name in written]


def test_the_unweighted_pacs_ablation_can_be_left_out(tmp_path, capsys):
    arguments = ["compare", "--config", "builtin:compare-demo", "--algorithms", "pacs,grpo", "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit):
        main([*arguments, "--without-unweighted-pacs", "--baseline", "pacs (no weighting)"])
    assert "pass --baseline with one of: base model, pacs, grpo" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "out").exists()


def test_each_method_is_evaluated_with_the_tools_its_run_trained_with(tmp_path, warm_model_dir):
    tools = ["rollout.tools=python", "rollout.max_turns=2", "rollout.tool_workers=1"]
    report = run_comparison(
        "builtin:compare-demo",
        ["pacs", "pacs[rollout.tools=null]"],
        [0],
        tmp_path,
        eval_n=2,
        overrides=[*TINY, *tools],
        show_progress=False,
        unweighted_pacs=False,
    )
    settings = {
        name: json.loads((tmp_path / folder / "eval_metrics.json").read_text())["settings"]["tools"]
        for name, folder in [
            ("base model", "base/seed_0"),
            ("pacs", "pacs/seed_0/eval"),
            ("pacs [rollout.tools=null]", "pacs_rollout.tools-null/seed_0/eval"),
        ]
    }
    assert settings["base model"]["tools"] == settings["pacs"]["tools"] == "python"
    assert settings["base model"]["max_turns"] == settings["pacs"]["max_turns"] == 2
    assert settings["pacs [rollout.tools=null]"] is None
    rows = report["results"]["arithmetic"]
    assert "tool_calls_mean" in rows["pacs"]["per_seed"][0]["tools"]
    assert "tools" not in rows["pacs [rollout.tools=null]"]["per_seed"][0]


def test_comparison_md_shows_each_methods_tool_use_seed_by_seed_and_a_dash_without_tools():
    with_tools = {"per_seed": [{"tools": {"tool_calls_mean": 0.5, "tool_errors_fraction": 0.0, "turns_mean": 1.5}},
                               {"tools": {"tool_calls_mean": 0.75, "tool_errors_fraction": 0.0, "turns_mean": 1.75}}]}  # fmt: skip
    without = {"per_seed": [{}, {}]}
    assert compare._tool_use_table({"pacs": with_tools, "pacs [rollout.tools=null]": without})[3:] == [
        "| pacs | 0.50 / 0.75 | 0.00 | 1.50 / 1.75 |",
        "| pacs [rollout.tools=null] | — | — | — |",
    ]


def test_comparison_md_has_no_tool_table_when_no_method_used_tools():
    assert compare._tool_use_table({"pacs": {"per_seed": [{}]}, "grpo": {"per_seed": [{}]}}) == []
