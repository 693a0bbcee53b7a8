"""Progress bars that suit both a terminal and a log file.

On a terminal (or in a notebook) ``progress_bar`` is tqdm's usual bar. When stderr is not a
terminal (a log file, CI, ``nohup``), redrawing a bar with carriage returns would leave thousands
of them in the log, so the same tqdm object instead writes one plain line at every
``LOG_EVERY_FRACTION`` of the total and at the end:

    training:  45% 45/100 [01:02<01:16, 1.38s/step, reward=0.41]

A note that concerns the computing a command does, not its checks (the threads it computes with,
`say_before_first_bar`), waits for the first bar: a command refused for its inputs never says it.

This module imports nothing from pacs, so train and eval can both use it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from typing import IO, Any

from tqdm.auto import tqdm as auto_tqdm
from tqdm.std import tqdm as std_tqdm

LOG_EVERY_FRACTION = 0.05
"""In a log, one line per this fraction of the total (and one at the end)."""
LOG_EVERY_S_WITHOUT_TOTAL = 30.0
"""In a log, one line per this many seconds when the total is unknown."""
_IN_NOTEBOOK = any(cls.__module__ == "tqdm.notebook" for cls in auto_tqdm.__mro__)
"""Whether tqdm.auto chose the notebook widget (stderr is no terminal there, but the widget suits)."""


_waiting_notes: list[str] = []


def say_before_first_bar(note: str) -> None:
    """Print `note` on stderr when this process's next progress bar starts (never, if none does)."""
    _waiting_notes.append(note)


def progress_bar(
    iterable: Iterable[Any] | None = None,
    *,
    total: float | None = None,
    desc: str | None = None,
    unit: str = "it",
    disable: bool = False,
    initial: float = 0,
) -> std_tqdm:
    """A tqdm progress bar over ``iterable`` (or one driven by ``update``), as tqdm takes them.

    The bar when stderr is a terminal or in a notebook; newline-terminated lines without ``\\r``
    otherwise (see the module docstring). Either supports iteration, ``update``,
    ``set_postfix`` and ``close``.
    """
    while _waiting_notes:
        print(_waiting_notes.pop(0), file=sys.stderr)
    options = dict(total=total, desc=desc, unit=unit, disable=disable, initial=initial)
    if sys.stderr.isatty() or _IN_NOTEBOOK:
        return auto_tqdm(iterable, **options)
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)  # as tqdm does
    if total:
        rate_limits = dict(miniters=max(1, math.ceil(total * LOG_EVERY_FRACTION)), mininterval=0)
    else:
        rate_limits = dict(mininterval=LOG_EVERY_S_WITHOUT_TOTAL)
    return _LogLines(
        iterable,
        **{**options, "total": total},
        **rate_limits,
        file=_LineFile(sys.stderr),
        ncols=0,  # the statistics only, no bar
        maxinterval=math.inf,  # never lower miniters after a slow stretch
    )


class _LogLines(std_tqdm):
    """tqdm writing a line only when it has progressed: no monitor thread, no refresh per postfix."""

    monitor_interval = 0

    def set_postfix(self, ordered_dict: Any = None, refresh: bool = True, **kwargs: Any) -> None:
        """Set the postfix; it appears in the next line, not in a line of its own."""
        super().set_postfix(ordered_dict, refresh=False, **kwargs)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if msg is None and self.n == getattr(self, "_displayed_n", None):
            return True  # e.g. close() right after the line at 100 %
        self._displayed_n = self.n
        return super().display(msg, pos)


class _LineFile:
    """The file tqdm writes to in a log: each redraw (``\\r`` + text) becomes a line of its own."""

    def __init__(self, file: IO[str]) -> None:
        self.file = file

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip()
        if line:
            self.file.write(line + "\n")
            self.file.flush()

    def flush(self) -> None:
        self.file.flush()
