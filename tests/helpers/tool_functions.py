"""Users' own tools (`rollout.tools="tool_functions:NAME"`) for the tests of tool calls."""

from __future__ import annotations


def reversed_text(text: str) -> str:
    """The call's text backwards."""
    return text[::-1]


def broken(text: str) -> str:
    """A tool with a bug: it raises for every call."""
    raise RuntimeError(f"cannot handle {len(text)} characters")
