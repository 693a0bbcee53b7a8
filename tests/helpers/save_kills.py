"""A run killed (SIGKILL) at each file of a checkpoint's save in turn, each time resumed with
`resume=auto`, and its final weights set against an uninterrupted run's (`tests/train/test_train_kill_mid_save.py`).

    python save_kills.py ALGORITHM WORK_DIR

Runs in one fresh interpreter that puts MKL in its reproducible mode before torch computes, as the
`pacs` command does; every run (the uninterrupted one, each killed one, each resume) is a process
of its own forked from it, so each kill is a real SIGKILL of a real process, at a point an audit
hook finds: the first time the save of step 2 touches each of its files and folders (opens,
creates, renames or links it). Prints one JSON line per kill: the file, whether the run died
there, the checkpoints it left, and the largest difference of any final weight (policy and
critic) from the uninterrupted run's (null without a final checkpoint)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from pacs.train.determinism import reproducible_math_environment

reproducible_math_environment()  # before torch is imported

from safetensors.torch import load_file  # noqa: E402

from pacs.config import load_config  # noqa: E402
from pacs.train.trainer import train  # noqa: E402

SAVED_STEP = 2
ALGORITHMS = {"pacs": ["algorithm.name=pacs"], "ppo": ["algorithm.name=ppo", "critic.lr=1e-4"]}
TOUCHES = ("open", "os.rename", "os.mkdir", "os.link", "os.remove", "shutil.rmtree")
"""Audit events of a file or folder being written, read back (the manifest's checksums) or put in place."""


def config(output_dir: Path, algorithm: str, *extra: str):
    return load_config(
        "builtin:demo",
        [
            f"output_dir={output_dir}",
            "model.path=builtin:tiny",
            "data.train=builtin:arithmetic?size=64",
            "data.val=null",
            "train.steps=4",
            "train.batch_size=8",
            "train.mini_batch_size=4",
            "train.micro_batch_size=12",
            "train.save_every=1",
            "train.lr_schedule=constant",
            "train.report_to=[]",
            "rollout.n=4",
            "reward.function=mixed_rewards:alternating_score",
            "reward.num_workers=0",
            *ALGORITHMS[algorithm],
            *extra,
        ],
    )


def in_a_process(run) -> int:
    """Run `run()` in a forked process; its wait status."""
    pid = os.fork()
    if pid == 0:
        try:
            run()
        except BaseException as error:  # reported, then the process ends
            print(f"error: {error!r}", file=sys.stderr, flush=True)
            os._exit(1)
        os._exit(0)
    return os.waitpid(pid, 0)[1]


PUT_IN_PLACE, AFTER_PUT_IN_PLACE = "(the staging folder renamed to step_2)", "(the next file touched after that)"


def _path(value: object) -> str:
    return os.fsdecode(value) if isinstance(value, (str, bytes, os.PathLike)) else ""


def saved_file(event: str, args: tuple) -> str | None:
    """The file of step `SAVED_STEP`'s save (relative to its staging folder: "." for the folder
    itself) that `event` touches, `PUT_IN_PLACE` for its rename into place, else None."""
    if event not in TOUCHES or not args:
        return None
    if event == "os.rename" and _path(args[1]).endswith(f"/checkpoints/step_{SAVED_STEP}"):
        return PUT_IN_PLACE
    path = _path(args[0])
    marker = f"/checkpoints/.tmp-step_{SAVED_STEP}-"
    if marker not in path:
        return None
    rest = path.split(marker, 1)[1]
    return rest.split("/", 1)[1] if "/" in rest else "."


def touched_files(output_dir: Path, algorithm: str) -> list[str]:
    """Every file of the save, in the order it is first touched (one run, not killed)."""
    record = output_dir.with_suffix(".touched")

    def run() -> None:
        touched: list[str] = []
        sys.addaudithook(lambda event, args: (name := saved_file(event, args)) and name not in touched and touched.append(name))
        train(config(output_dir, algorithm), show_progress=False)
        record.write_text(json.dumps([*touched, AFTER_PUT_IN_PLACE]))

    in_a_process(run)
    return json.loads(record.read_text())


def killed_at(file: str, output_dir: Path, algorithm: str) -> bool:
    """Run until the save first touches `file`, and SIGKILL the run there; whether it died so."""

    put_in_place = []

    def hook(event: str, args: tuple) -> None:
        touched = saved_file(event, args)
        if touched == file or (file == AFTER_PUT_IN_PLACE and put_in_place and event in TOUCHES):
            os.kill(os.getpid(), signal.SIGKILL)
        if touched == PUT_IN_PLACE:
            put_in_place.append(True)

    def run() -> None:
        sys.addaudithook(hook)
        train(config(output_dir, algorithm), show_progress=False)

    status = in_a_process(run)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def final_weights(output_dir: Path) -> dict:
    final = output_dir / "checkpoints" / "final"
    weights = {f"policy/{name}": tensor for name, tensor in load_file(final / "model.safetensors").items()}
    for file in sorted((final / "critic").glob("*.safetensors")):
        weights.update({f"critic/{name}": tensor for name, tensor in load_file(file).items()})
    return weights


def main(algorithm: str, work: Path) -> None:
    uninterrupted = work / "uninterrupted"
    in_a_process(lambda: train(config(uninterrupted, algorithm), show_progress=False))
    expected = final_weights(uninterrupted)
    for number, file in enumerate(touched_files(work / "touched", algorithm)):
        run = work / f"killed_{number}"
        died = killed_at(file, run, algorithm)
        left = sorted(path.name for path in (run / "checkpoints").iterdir()) if (run / "checkpoints").is_dir() else []
        in_a_process(lambda run=run: train(config(run, algorithm, "resume=auto"), show_progress=False))
        difference = None
        if (run / "checkpoints" / "final").is_dir():
            weights = final_weights(run)
            assert weights.keys() == expected.keys()
            difference = max(float((weights[name].double() - expected[name].double()).abs().max()) for name in expected)
        print(json.dumps({"file": file, "killed": died, "left": left, "difference": difference}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
