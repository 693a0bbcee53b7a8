"""Every registered algorithm is documented where users look, and no list of them is kept by hand
(`pacs.config.ALGORITHM_CONFIGS`): its page docs/algorithms/NAME.md, which the site's nav and the
algorithms' index list because tools/docs_hooks.py finds them; the README and docs/index.md link
the index, not each page; and the page on writing one's own algorithm shows the example the tests
run (docs/examples/my_algorithm.py)."""

from __future__ import annotations

from pathlib import Path

import yaml
from test_readme import file_blocks
from tool_modules import tool_module

from pacs.config import ALGORITHM_CONFIGS

REPOSITORY = Path(__file__).resolve().parents[2]
DOCS = REPOSITORY / "docs"
INDEX_PAGE, OWN_ALGORITHM_PAGE = "index", "custom"


def docs_hooks():
    """tools/docs_hooks.py as a module."""
    return tool_module("docs_hooks")


def nav_pages(entries) -> list[str]:
    """Every page of a nav, depth first."""
    pages = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def built_nav(docs_dir: Path = DOCS) -> list:
    """mkdocs.yml's nav as the hooks leave it."""
    config = yaml.load((REPOSITORY / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)  # !!python tags read as text
    return docs_hooks().on_config({"nav": config["nav"], "docs_dir": str(docs_dir)})["nav"]


def algorithms_section(nav: list) -> list[str]:
    [section] = [entry["Algorithms"] for entry in nav if isinstance(entry, dict) and "Algorithms" in entry]
    return nav_pages(section)


def test_the_nav_lists_the_index_every_registered_algorithm_in_the_registrys_order_and_the_own_algorithm_page():
    expected = [f"algorithms/{name}.md" for name in [INDEX_PAGE, *ALGORITHM_CONFIGS, OWN_ALGORITHM_PAGE]]
    assert algorithms_section(built_nav()) == expected


def test_every_algorithm_page_is_a_registered_algorithms_the_index_or_the_own_algorithm_page():
    pages = {path.stem for path in (DOCS / "algorithms").glob("*.md")}
    assert pages == {INDEX_PAGE, *ALGORITHM_CONFIGS, OWN_ALGORITHM_PAGE}


def test_the_algorithms_index_lists_every_algorithm_page_by_its_title():
    listed = docs_hooks().algorithm_list(DOCS).splitlines()
    assert listed == [
        f"- [{docs_hooks().page_title(DOCS / 'algorithms' / f'{name}.md')}]({name}.md)"
        for name in [*ALGORITHM_CONFIGS, OWN_ALGORITHM_PAGE]
    ]


def test_a_new_algorithm_page_joins_the_nav_and_the_index_with_no_other_file_edited(tmp_path):
    docs = tmp_path / "docs"
    (docs / "algorithms").mkdir(parents=True)
    for page in (DOCS / "algorithms").glob("*.md"):
        (docs / "algorithms" / page.name).write_text(page.read_text())
    (docs / "algorithms" / "aaa_new.md").write_text("# A new one\n\nIts formula.\n")
    assert "algorithms/aaa_new.md" in algorithms_section(built_nav(docs))
    assert "- [A new one](aaa_new.md)" in docs_hooks().algorithm_list(docs).splitlines()


def test_the_readme_and_the_docs_home_link_the_algorithms_index_not_each_algorithm():
    for page, prefix in [(REPOSITORY / "README.md", "docs/algorithms/"), (DOCS / "index.md", "algorithms/")]:
        text = page.read_text()
        assert f"]({prefix}{INDEX_PAGE}.md)" in text
        assert [name for name in ALGORITHM_CONFIGS if f"]({prefix}{name}.md" in text] == []


def test_the_own_algorithm_page_shows_the_example_the_tests_run():
    shown = file_blocks(f"docs/algorithms/{OWN_ALGORITHM_PAGE}.md")["my_algorithm.py"]
    assert shown == (DOCS / "examples" / "my_algorithm.py").read_text()
