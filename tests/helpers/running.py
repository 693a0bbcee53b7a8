"""Running the `pacs` command in the test's own process."""

from __future__ import annotations

from pacs.cli import main


def run(arguments: list[str]) -> int:
    """`pacs ARGUMENTS` in this process; its exit status."""
    try:
        main(arguments)
    except SystemExit as exit_info:
        return exit_info.code
    return 0
