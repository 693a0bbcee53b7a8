"""The documentation: the site builds with warnings as errors, its configuration reference is
generated from the `Config` classes as it is built (tools/docs_hooks.py), and the README stays a few
screens.

(The pages' examples run in tests/project/test_readme.py.)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from tool_modules import tool_module

REPOSITORY = Path(__file__).resolve().parents[2]


def docs_hooks():
    """tools/docs_hooks.py as a module."""
    return tool_module("docs_hooks")


def config_reference():
    """tools/config_reference.py as a module, as the docs hooks load it."""
    return docs_hooks().config_reference()


@pytest.mark.slow
def test_the_site_builds_with_warnings_as_errors(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, (
        f"mkdocs build --strict failed (the docs extra installs mkdocs: pip install -e '.[docs]'):\n"
        f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    )
    assert (tmp_path / "site" / "reference" / "configuration" / "index.html").is_file()
    assert (tmp_path / "site" / "contributing" / "index.html").is_file()


def test_the_sites_configuration_reference_is_generated_as_it_is_built_and_kept_nowhere_in_docs():
    from mkdocs.config import load_config
    from mkdocs.structure.files import Files

    config = load_config(str(REPOSITORY / "mkdocs.yml"))
    files = config.plugins.on_files(Files([]), config=config)  # every plugin's and hook's, as mkdocs build runs them
    page = files.get_file_from_path("reference/configuration.md")
    assert page is not None and page.content_string == config_reference().reference()
    assert not (REPOSITORY / "docs" / "reference" / "configuration.md").exists()


def test_the_configuration_reference_lists_every_key_of_the_default_config():
    from pacs.config import Config

    def leaves(values: dict, prefix: str = "") -> list[str]:
        keys = []
        for name, value in values.items():
            keys += leaves(value, f"{prefix}{name}.") if isinstance(value, dict) else [f"{prefix}{name}"]
        return keys

    page = config_reference().reference()
    assert [key for key in leaves(Config().model_dump()) if f"| `{key}` |" not in page] == []


def test_every_config_key_has_a_description():
    from pacs.config import Config

    generator = config_reference()
    rows = [row for section in generator.sections(Config, prefix="") for row in section.rows]
    assert [row.key for row in rows if not row.description] == [], "config keys need a docstring where they are declared"


def test_the_readme_is_a_few_screens():
    assert len((REPOSITORY / "README.md").read_text().splitlines()) <= 300


def test_the_readmes_own_data_section_leads_with_pacs_prepare_and_links_the_own_data_page():
    """Issue 54 finding 5: the easy way in (a plain jsonl through `pacs prepare`) comes first, the
    page that goes on from it is linked from the README and the docs' index, and the synopsis
    names every option of `pacs prepare`."""
    from pacs.cli import build_parser

    readme = (REPOSITORY / "README.md").read_text()
    section = readme.split("## Train on your own data", 1)[1].split("\n## ", 1)[0]
    blocks = re.finditer(r"^```(?P<language>\w*)\n(?P<body>.*?)^```$", section, re.MULTILINE | re.DOTALL)
    first_commands = next(block["body"] for block in blocks if not block["language"])
    assert first_commands.startswith("pacs prepare --input")
    assert "(docs/own-data.md)" in readme and "(own-data.md)" in (REPOSITORY / "docs" / "index.md").read_text()
    parser = build_parser()
    (commands,) = [action for action in parser._actions if action.dest == "command"]
    options = {option for action in commands.choices["prepare"]._actions for option in action.option_strings}
    synopsis = [line for line in readme.splitlines() if line.startswith(("pacs prepare", "             ["))]
    assert sorted(option for option in options - {"-h", "--help"} if option not in " ".join(synopsis)) == []
