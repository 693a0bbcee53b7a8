"""Output a person reads: a short evaluation table, no third-party warnings, one line on Ctrl-C,
one colour per method in every figure, runs labelled by algorithm and seed, integer step ticks,
help with real defaults, `--algorithms pacs` alone, a note on PACS's loss near ln 2, checkpoints
readable as the user's umask says, W&B's files where WANDB_DIR says, and a demo that installs
only what it uses."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.image
import pytest
import yaml
from matplotlib.colors import to_rgb
from running import run
from test_plots import training_rows, write_run

import pacs.plots as plots
from pacs.cli import after_interrupt, build_parser
from pacs.config import load_config
from pacs.models.loading import load_causal_lm, load_tokenizer
from pacs.plots import METHOD_COLOURS, plot_pass_at_k, plot_reward_curves, plot_runs, run_labels
from pacs.train import trainer as trainer_module
from pacs.train.checkpointing.state import save_checkpoint
from pacs.train.metrics import read_metrics

REPOSITORY = Path(__file__).resolve().parents[2]
TINY_RUN = [
    "data.train=builtin:arithmetic?size=8",
    "data.val=builtin:arithmetic?size=2",
    "train.batch_size=2",
    "train.mini_batch_size=2",
    "rollout.n=2",
    "eval.n=2",
    "data.max_response_length=4",
    "reward.num_workers=0",
]


def pacs_process(folder: Path, *arguments: str) -> subprocess.Popen:
    """`pacs ARGUMENTS` in a session of its own, with Ctrl-C's signal at its default (as a shell
    starts a foreground job), one thread. A child inherits an ignored or blocked SIGINT across exec,
    and a test process may have had either left by what ran in it before (then Python never raises
    KeyboardInterrupt in the child, and Ctrl-C does nothing)."""
    return subprocess.Popen(
        [sys.executable, "-m", "pacs.cli", *arguments], cwd=folder, env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=_sigint_as_a_shell_leaves_it,
    )  # fmt: skip


def _sigint_as_a_shell_leaves_it() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


# ----- the terminal ------------------------------------------------------------------------------


@pytest.mark.slow
def test_eval_prints_a_short_table_and_leaves_the_details_to_the_file(tmp_path, tiny_model_dir, capsys):
    data = "builtin:arithmetic?size=6"
    assert (
        run(
            [
                "eval",
                "--model",
                str(tiny_model_dir),
                "--data",
                data,
                "--n",
                "4",
                "--max-tokens",
                "4",
                "--out",
                str(tmp_path / "e"),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split() == ["data", "source", "problems", "samples", "pass@1", "pass@2", "pass@4", "timeouts", "crashes"]
    assert printed[1].split()[:3] == ["arithmetic", "6", "4"] and printed[1].split()[-2:] == ["0", "0"]
    assert len(printed) == 3 and "eval_metrics.json" in printed[2]
    assert "correct_counts" in (tmp_path / "e" / "eval_metrics.json").read_text()


@pytest.mark.slow
def test_train_and_eval_print_no_third_party_warnings(tmp_path, tiny_model_dir):
    train = pacs_process(tmp_path, "train", "output_dir=run", f"model.path={tiny_model_dir}", *TINY_RUN, "train.steps=1")
    _, train_errors = train.communicate(timeout=600)
    evaluate = pacs_process(tmp_path, "eval", "--model", "run/checkpoints/final", "--data", "builtin:arithmetic?size=2",
                            "--n", "2", "--max-tokens", "4", "--out", "eval")  # fmt: skip
    _, eval_errors = evaluate.communicate(timeout=600)
    assert train.returncode == 0 and evaluate.returncode == 0, train_errors + eval_errors
    noise = [line for line in (train_errors + eval_errors).splitlines() if re.search(r"warn|deprecat", line, re.IGNORECASE)]
    assert noise == []


@pytest.mark.slow
def test_ctrl_c_ends_training_with_one_line_that_says_how_to_continue(tmp_path, tiny_model_dir):
    arguments = [
        "train",
        "output_dir=run",
        f"model.path={tiny_model_dir}",
        *TINY_RUN,
        "train.steps=100000",
        "train.save_every=1",
    ]  # never ends by itself
    job = pacs_process(tmp_path, *arguments)
    deadline = time.monotonic() + 300
    while not (tmp_path / "run" / "checkpoints" / "step_1").is_dir() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(job.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
    _, errors = job.communicate(timeout=120)
    assert job.returncode == 130, errors
    assert "Traceback" not in errors
    last_line = errors.strip().splitlines()[-1]
    assert last_line == f"pacs train: {after_interrupt('train', arguments)}"
    assert last_line.endswith(" train.save_every=1 resume=auto") and "keeps every checkpoint" in last_line


def test_the_line_after_ctrl_c_drops_overwrite_from_the_command_that_continues():
    line = after_interrupt("train", ["train", "--config", "run.yaml", "--overwrite", "resume=never"])
    assert line.endswith("continue with pacs train --config run.yaml resume=auto")
    assert after_interrupt("eval", ["eval", "--out", "e"]).endswith("start again with pacs eval --out e --overwrite")
    assert after_interrupt("demo", ["demo"]) == "interrupted; start again with pacs demo"


def test_every_option_of_every_command_has_help_and_shows_only_real_defaults():
    parser = build_parser()
    (commands,) = [action for action in parser._actions if isinstance(action, type(parser._subparsers._group_actions[0]))]
    for name, command in commands.choices.items():
        without_help = [action.dest for action in command._actions if not action.help]
        assert without_help == [], f"pacs {name}"
        text = command.format_help()
        assert "(default: None)" not in text and "(default: False)" not in text, f"pacs {name}"
    assert "(default: 0,1,2)" in " ".join(commands.choices["compare"].format_help().split())
    assert "(default: 4096)" in " ".join(commands.choices["eval"].format_help().split())


@pytest.mark.parametrize(("algorithm", "noted"), [("pacs", True), ("grpo", False)])
def test_pacs_runs_say_once_what_a_loss_near_ln_2_means(tmp_path, tiny_model_dir, capsys, monkeypatch, algorithm, noted):
    monkeypatch.setattr(trainer_module, "_said_once", set())  # as in a fresh process: earlier runs here said it
    arguments = ["train", f"output_dir={tmp_path / 'run'}", f"model.path={tiny_model_dir}", *TINY_RUN,
                 "data.val=null", "train.steps=1", f"algorithm.name={algorithm}"]  # fmt: skip
    assert run(arguments) == 0
    errors = " ".join(capsys.readouterr().err.split())
    assert ("stays near ln 2 = 0.693" in errors) is noted
    if noted:
        assert read_metrics(tmp_path / "run")[0]["loss"] == pytest.approx(0.6931, abs=1e-3)


# ----- figures -----------------------------------------------------------------------------------


def pixels_of(path: Path, colour: str) -> int:
    """How many pixels of the PNG at `path` are `colour` (matplotlib's name)."""
    image = matplotlib.image.imread(path)[..., :3]
    return int((abs(image - to_rgb(colour)).max(axis=-1) < 0.02).sum())


def test_a_method_has_the_same_colour_in_the_reward_curves_and_the_pass_at_k_figure(tmp_path):
    curves = {method: [[(step, 0.1 * step + offset) for step in range(1, 6)]] for offset, method in enumerate(["grpo", "pacs"])}
    table = {
        method: {1: (0.1 + 0.1 * offset, 0.0), 2: (0.2 + 0.1 * offset, 0.0)}
        for offset, method in enumerate(["base model", "pacs", "grpo"])
    }
    rewards = plot_reward_curves(curves, tmp_path / "reward_curves.png")
    pass_at_k = plot_pass_at_k(table, tmp_path / "pass_at_k.png")
    for method in ("pacs", "grpo"):
        assert pixels_of(rewards, METHOD_COLOURS[method]) > 50 and pixels_of(pass_at_k, METHOD_COLOURS[method]) > 50, method
    assert pixels_of(pass_at_k, METHOD_COLOURS["base model"]) > 50
    unused = [colour for method, colour in METHOD_COLOURS.items() if method not in table]
    assert [colour for colour in unused if pixels_of(pass_at_k, colour) or pixels_of(rewards, colour)] == []
    assert len(set(METHOD_COLOURS.values())) == len(METHOD_COLOURS)


def trained_run(path: Path, algorithm: str, seed: int, steps: int = 2) -> Path:
    write_run(path, training_rows(steps, validate_on=()))
    (path / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "algorithm": {"name": algorithm}}))
    return path


def drawn_figures(monkeypatch) -> dict[str, object]:
    """File name -> figure of every figure the plots module saves from now on."""
    figures, save = {}, plots._save
    monkeypatch.setattr(
        plots, "_save", lambda figure, out_path: figures.setdefault(out_path.name, figure) and save(figure, out_path)
    )
    return figures


def test_a_single_run_is_labelled_by_its_algorithm_and_seed_and_steps_are_ticked_at_integers(tmp_path, monkeypatch):
    figures = drawn_figures(monkeypatch)
    plot_runs([trained_run(tmp_path / "demo" / "train", "pacs", 0)], tmp_path / "plots")
    (axes,) = figures["reward_mean.png"].axes
    assert [text.get_text() for text in axes.get_legend().get_texts()] == ["pacs, seed 0"]
    low, high = axes.get_xlim()
    ticks = [tick for tick in axes.get_xticks() if low <= tick <= high]
    assert ticks and all(tick == int(tick) for tick in ticks)


def test_runs_of_one_algorithm_and_seed_add_the_folder_that_tells_them_apart(tmp_path):
    first, second = trained_run(tmp_path / "lr1" / "train", "grpo", 1), trained_run(tmp_path / "lr2" / "train", "grpo", 1)
    third = trained_run(tmp_path / "lr1" / "pacs", "pacs", 1)
    assert run_labels([first, second, third]) == ["grpo, seed 1 (lr1/train)", "grpo, seed 1 (lr2/train)", "pacs, seed 1"]


@pytest.mark.slow
def test_compare_with_pacs_alone_sets_it_against_the_base_model(tmp_path, tiny_model_dir):
    overrides = [f"model.path={tiny_model_dir}", *TINY_RUN, "train.steps=1", "data.val=builtin:arithmetic?size=2"]
    assert run(["compare", "--config", "builtin:compare-demo", "--algorithms", "pacs", "--seeds", "0", "--eval-n", "2",
                "--out", str(tmp_path / "out"), *overrides]) == 0  # fmt: skip
    report = yaml.safe_load((tmp_path / "out" / "comparison.json").read_text())
    assert report["baseline"] == "base model" and report["algorithms"] == ["pacs", "pacs (no weighting)"]
    assert "Against base model:" in (tmp_path / "out" / "comparison.md").read_text()


# ----- files -------------------------------------------------------------------------------------


def test_checkpoint_files_get_the_modes_the_users_umask_gives(tmp_path, tiny_model_dir):
    previous = os.umask(0o027)
    try:
        directory = save_checkpoint(
            tmp_path / "checkpoint", load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir)), {"step": 1}
        )
    finally:
        os.umask(previous)
    modes = {path.name: path.stat().st_mode & 0o777 for path in [directory, *directory.rglob("*")]}
    assert modes["model.safetensors"] == 0o640 and modes["checkpoint"] == 0o750
    assert set(modes.values()) == {0o640, 0o750}, modes


@pytest.mark.slow
def test_wandb_files_go_where_wandb_dir_says(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from pacs.train.trackers import WandbTracker

    for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path / "elsewhere")}.items():
        monkeypatch.setenv(name, value)
    # W&B puts its service's address in WANDB_SERVICE; left there, every later `pacs train` this
    # test process starts would join that one service (a killed run's stream then stays "in use")
    monkeypatch.delenv("WANDB_SERVICE", raising=False)
    (tmp_path / "elsewhere").mkdir()
    tracker = WandbTracker(load_config(None, ["train.report_to=[wandb]"]), tmp_path / "run", 0, None)
    tracker.log(1, {"loss": 0.5})
    tracker.close()
    wandb.teardown()  # stop this process's service
    assert list((tmp_path / "elsewhere" / "wandb").glob("offline-run-*")) and not (tmp_path / "run" / "wandb").exists()


def test_make_demo_installs_pacs_without_the_test_and_tracker_extras(tmp_path):
    outside_make = {
        name: value for name, value in os.environ.items() if not name.startswith("MAKE")
    }  # as typed in a shell, also under `make test`
    planned = subprocess.run(["make", "-n", "demo", f"VENV={tmp_path / 'venv'}"], cwd=REPOSITORY, env=outside_make,
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    (install,) = [line for line in planned.splitlines() if "pip install" in line]
    assert install.endswith('-e "."')
    assert "demo" in planned.splitlines()[-1]
