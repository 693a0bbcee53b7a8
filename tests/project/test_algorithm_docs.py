"""Every registered algorithm is documented where users look, so the lists cannot drift from the
registry (`pacs.config.ALGORITHM_CONFIGS`): its page docs/algorithms/NAME.md, in the site's nav,
linked from the README and from docs/index.md; and the page on writing one's own algorithm shows
the example the tests run (docs/examples/my_algorithm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_readme import file_blocks

from pacs.config import ALGORITHM_CONFIGS

REPOSITORY = Path(__file__).resolve().parents[2]
OWN_ALGORITHM_PAGE = "custom"


def nav_pages(entries) -> list[str]:
    """Every page of mkdocs.yml's nav, depth first."""
    pages = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def mkdocs_nav() -> list[str]:
    text = (REPOSITORY / "mkdocs.yml").read_text()
    return nav_pages(yaml.load(text, Loader=yaml.BaseLoader)["nav"])  # the file's !!python tags read as text


@pytest.mark.parametrize("name", [*ALGORITHM_CONFIGS, OWN_ALGORITHM_PAGE])
def test_every_algorithm_has_its_page_in_the_nav_the_readme_and_the_index(name):
    assert (REPOSITORY / "docs" / "algorithms" / f"{name}.md").is_file()
    assert f"algorithms/{name}.md" in mkdocs_nav()
    assert f"](docs/algorithms/{name}.md)" in (REPOSITORY / "README.md").read_text()
    assert f"](algorithms/{name}.md)" in (REPOSITORY / "docs" / "index.md").read_text()


def test_every_algorithm_page_is_a_registered_algorithms_or_the_own_algorithm_page():
    pages = {path.stem for path in (REPOSITORY / "docs" / "algorithms").glob("*.md")}
    assert pages == {*ALGORITHM_CONFIGS, OWN_ALGORITHM_PAGE}


def test_the_own_algorithm_page_shows_the_example_the_tests_run():
    shown = file_blocks(f"docs/algorithms/{OWN_ALGORITHM_PAGE}.md")["my_algorithm.py"]
    assert shown == (REPOSITORY / "docs" / "examples" / "my_algorithm.py").read_text()
