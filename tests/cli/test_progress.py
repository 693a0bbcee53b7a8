"""progress_bar: tqdm's bar on a terminal, a plain line every ~5 % in a log."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from pacs import progress
from pacs.progress import progress_bar

LOOP_WITH_POSTFIX = """
from pacs.progress import progress_bar
bar = progress_bar(range(1000), desc="training", unit="step")
for step in bar:
    bar.set_postfix(loss=f"{1 / (step + 1):.4f}")
evaluating = progress_bar(total=1000, desc="evaluating", unit="prompt")
for _ in range(250):
    evaluating.update(4)
evaluating.close()
for _ in progress_bar(range(1000), desc="silent", disable=True):
    pass
"""


def test_log_gets_a_line_every_five_percent_without_carriage_returns(tmp_path: Path) -> None:
    log = tmp_path / "stderr.log"
    with log.open("w") as stderr:
        subprocess.run([sys.executable, "-c", LOOP_WITH_POSTFIX], stderr=stderr, check=True, timeout=60)
    text = log.read_text()
    assert "\r" not in text
    assert text.endswith("\n")
    lines = text.splitlines()
    assert not any("silent" in line for line in lines)
    for desc, unit in (("training", "step"), ("evaluating", "prompt")):
        own = [line for line in lines if line.startswith(f"{desc}:")]
        assert 15 <= len(own) <= 25, own
        assert "1000/1000" in own[-1] and f"{unit}/s" in own[-1]
        assert sum("1000/1000" in line for line in own) == 1, own  # close() repeats no line
    training = [line for line in lines if line.startswith("training:")]
    assert training[-1].endswith("loss=0.0010]"), training[-1]  # the postfix of the last step
    assert " 50% 500/1000 [" in "\n".join(training)


def test_resumed_run_logs_from_its_starting_point(monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    for _ in progress_bar(range(601, 1001), initial=600, total=1000, desc="training", unit="step"):
        pass
    lines = stderr.getvalue().splitlines()
    assert lines[0].startswith("training:  60% 600/1000")
    assert lines[-1].startswith("training: 100% 1000/1000")
    assert len(lines) == 9  # 60 %, 65 %, ..., 100 %


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_keeps_the_redrawn_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    bar = progress_bar(range(100), desc="training", unit="step")
    assert not isinstance(bar, progress._LogLines)
    for _ in bar:
        bar.set_postfix(loss="0.5")
    assert "\r" in terminal.getvalue()
    assert "100/100" in terminal.getvalue()
