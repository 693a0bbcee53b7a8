"""MkDocs hooks (mkdocs.yml `hooks:`): the repository's CONTRIBUTING.md becomes the site's
contributing.md, so the file GitHub shows and the page the site shows are one text.

CONTRIBUTING.md lives at the repository root and links into the docs as `docs/PAGE.md`; on the
site it sits beside those pages, so its links lose the `docs/` prefix.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
DOCS_LINK = re.compile(r"\]\(docs/")


def on_files(files: Files, config) -> Files:
    text = DOCS_LINK.sub("](", (ROOT / "CONTRIBUTING.md").read_text())
    files.append(File.generated(config, "contributing.md", content=text))
    return files
