"""One process of the run-folder stress test (`tests/cli/test_run_lock.py`): starts a run in a
folder as `pacs train` does (`pacs.outputs.claim_run_folder`, with `--overwrite` or as a resume),
then writes it as a live run does, looking before every write that its folder is still in place.

    python run_folder_stress.py FOLDER overwrite|resume SEED

Prints one line: "refused" (another run lived there), "wrote N" (its N lines, each "PID I"
appended to FOLDER/log), or "moved" (its folder was moved while it ran: the failure the test
looks for). Imports no torch: hundreds of these start in seconds."""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

from pacs.outputs import RunLocked, RunMoved, check_run_in_place, claim_run_folder

WRITES = 5


def pause(draw: random.Random) -> None:
    time.sleep(draw.uniform(0, 0.004))


def main(folder: Path, how: str, seed: int) -> str:
    draw = random.Random(seed)

    def decide() -> tuple[None, bool]:  # what a start reads of the folder (its checkpoints) takes time
        pause(draw)
        return None, True

    pause(draw)
    try:
        _, lock, _ = claim_run_folder(folder, "pacs train", decide, replace=how == "overwrite")
    except RunLocked:
        return "refused"
    try:
        for write in range(WRITES):
            pause(draw)
            check_run_in_place(folder, lock)
            with open(folder / "log", "a") as log:
                log.write(f"{os.getpid()} {write}\n")
    except RunMoved:
        return "moved"
    finally:
        if lock is not None:
            lock.close()
    return f"wrote {WRITES}"


if __name__ == "__main__":
    print(main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])), flush=True)
