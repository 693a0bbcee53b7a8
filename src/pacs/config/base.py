"""The error a configuration raises, and the base of every configuration section (`Section`, kept
in `pacs.algos.options` beside the algorithms' sections, which sit below this layer)."""

from __future__ import annotations

from pacs.algos.options import Section

__all__ = ["ConfigError", "Section"]


class ConfigError(ValueError):
    """A configuration file or override that cannot be used; the message says how to fix it.

    `settings`: the mapping (file and overrides applied) that failed validation, when there was
    one, so that a command can check the inputs it names in the same refusal; None otherwise."""

    def __init__(self, message: str, settings: dict | None = None) -> None:
        super().__init__(message)
        self.settings = settings
