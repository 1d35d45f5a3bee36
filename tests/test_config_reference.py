"""docs/config.md is the configuration as the schemas and conf/ define it today: regenerated,
it is the same page (python -m fli.cli.reference writes it)."""

import dataclasses
from pathlib import Path

from fli.cli.reference import default_page
from fli.config.reference import GROUPS

PAGE = Path(__file__).resolve().parents[1] / "docs" / "config.md"


def test_the_configuration_reference_is_the_schemas_of_today():
    assert PAGE.read_text() == default_page(), "docs/config.md drifted: run python -m fli.cli.reference"


def test_every_key_of_every_schema_is_on_the_page_with_words_beside_it():
    text = PAGE.read_text()
    for path, cls in GROUPS:
        section = text.split(f"## `{path}`\n" if path else "## Top-level keys\n")[1].split("\n## ")[0]
        for f in dataclasses.fields(cls):
            rows = [ln for ln in section.splitlines() if ln.startswith(f"| `{f.name}` |")]
            if not rows:
                assert path == "" and dataclasses.is_dataclass(f.default_factory()), (path, f.name)
                continue
            assert rows[0].rstrip("| ").split(" | ")[-1].strip(), f"{path}.{f.name} has no description in its schema"
