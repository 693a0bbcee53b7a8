"""Where pacs keeps files it builds once and reuses (built-in models, prepared data)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Return the pacs cache directory: ``$PACS_CACHE_DIR`` if set, else ``~/.cache/pacs``."""
    configured = os.environ.get("PACS_CACHE_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "pacs"
