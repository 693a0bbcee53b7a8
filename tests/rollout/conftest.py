"""Fixtures shared by the rollout tests."""

from __future__ import annotations

import pytest

from pacs.rollout import multiturn


@pytest.fixture
def calls_after_the_first_token(monkeypatch):
    """The built-in tiny model writes no newline, so no python block: with this, every turn but
    the last counts as a call of `print(2 ** 10)` after its first token."""
    monkeypatch.setattr(multiturn, "tool_call_end", lambda ids, tokenizer: (1, "print(2 ** 10)") if ids else None)
