"""MkDocs hooks (mkdocs.yml `hooks:`):

- the repository's CONTRIBUTING.md becomes the site's contributing.md, so the file GitHub shows and
  the page the site shows are one text. CONTRIBUTING.md lives at the repository root and links into
  the docs as `docs/PAGE.md`; on the site it sits beside those pages, so its links lose the `docs/`
  prefix.
- the configuration reference, reference/configuration.md, is generated from `pacs.config.Config`
  by tools/config_reference.py as the site is built, never written to docs/: it cannot fall behind
  the code, and a new algorithm's section joins it with no file edited.
- the nav's Algorithms section and the list on docs/algorithms/index.md are the pages of
  docs/algorithms/, found, not listed: a new algorithm's page joins both. The index first, the
  default algorithm's page (`pacs.config.DEFAULT_ALGORITHM`), the others by file name, and the page
  on writing one's own last; each titled by its first heading. tests/project/test_algorithm_docs.py
  checks that the pages are the registry's algorithms, in its order.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
DOCS_LINK = re.compile(r"\]\(docs/")
ALGORITHMS = "algorithms"
"""The folder of docs/ that holds the algorithms' pages, and the nav section that lists them."""
INDEX_PAGE, DEFAULT_ALGORITHM_PAGE, OWN_ALGORITHM_PAGE = "index", "pacs", "custom"
CONFIGURATION_REFERENCE = "reference/configuration.md"
"""Where the generated configuration reference sits among the site's pages."""
LIST_MARKER = "<!-- the algorithms' pages: listed here by tools/docs_hooks.py when the site is built -->"


def page_title(page: Path) -> str:
    """The text of the first `# ` heading of `page`; ValueError naming the page without one."""
    for line in page.read_text().splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    raise ValueError(f"{page}: an algorithm's page starts with its title, a `# TITLE` heading")


def algorithm_pages(docs_dir: Path) -> list[Path]:
    """The pages of `docs_dir`/algorithms in the order the site lists them: the index, the default
    algorithm's, the others by name, the page on writing one's own."""

    def place(page: Path) -> tuple:
        return (page.stem != INDEX_PAGE, page.stem != DEFAULT_ALGORITHM_PAGE, page.stem == OWN_ALGORITHM_PAGE, page.stem)

    return sorted((docs_dir / ALGORITHMS).glob("*.md"), key=place)


def algorithm_nav(docs_dir: Path) -> list[dict[str, str]]:
    """The nav's Algorithms section: {title: "algorithms/PAGE.md"} for each of `algorithm_pages`."""
    return [{page_title(page): f"{ALGORITHMS}/{page.name}"} for page in algorithm_pages(docs_dir)]


def algorithm_list(docs_dir: Path) -> str:
    """The index's list of the algorithms' pages, as Markdown links relative to the index."""
    return "\n".join(f"- [{page_title(page)}]({page.name})" for page in algorithm_pages(docs_dir)[1:])


def config_reference():
    """tools/config_reference.py as a module (registered in `sys.modules`, as its dataclasses need)."""
    if "config_reference" not in sys.modules:
        spec = importlib.util.spec_from_file_location("config_reference", ROOT / "tools" / "config_reference.py")
        sys.modules["config_reference"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["config_reference"])
    return sys.modules["config_reference"]


def on_config(config):
    sections = [entry for entry in config["nav"] if isinstance(entry, dict) and ALGORITHMS.capitalize() in entry]
    if len(sections) != 1:
        raise ValueError(f"mkdocs.yml: the nav needs one `{ALGORITHMS.capitalize()}` section for tools/docs_hooks.py to fill")
    sections[0][ALGORITHMS.capitalize()] = algorithm_nav(Path(config["docs_dir"]))
    return config


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri != f"{ALGORITHMS}/{INDEX_PAGE}.md":
        return markdown
    if LIST_MARKER not in markdown:
        raise ValueError(f"docs/{ALGORITHMS}/{INDEX_PAGE}.md: the list of algorithms goes where `{LIST_MARKER}` is")
    return markdown.replace(LIST_MARKER, algorithm_list(Path(config["docs_dir"])))


def on_files(files: Files, config) -> Files:
    text = DOCS_LINK.sub("](", (ROOT / "CONTRIBUTING.md").read_text())
    files.append(File.generated(config, "contributing.md", content=text))
    files.append(File.generated(config, CONFIGURATION_REFERENCE, content=config_reference().reference()))
    return files
