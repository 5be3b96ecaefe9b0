"""docs/reference.md's tables of the sync object are the ones generated from the models, and
its keyword-form table lists every keyword the factory still takes (as test_import_graph keeps
docs/architecture.md honest)."""

from __future__ import annotations

from pathlib import Path

from airflow_provider_vitess.capture.sync_docs import BEGIN, END, markdown, replace_block
from airflow_provider_vitess.capture.sync_keywords import KEYWORDS

REFERENCE = Path(__file__).resolve().parents[3] / "docs" / "reference.md"
REMEDY = "refresh it: python -m airflow_provider_vitess.capture.sync_docs --write docs/reference.md"


def test_the_reference_holds_the_generated_tables() -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    start, end = text.find(BEGIN), text.find(END)
    assert 0 <= start < end, f"docs/reference.md has lost the generated block's markers; {REMEDY}"
    assert text[start : end + len(END)] == markdown(), f"docs/reference.md drifted from the models; {REMEDY}"


def test_the_generated_tables_name_every_field_with_its_description() -> None:
    generated = markdown()
    assert "| `hash_columns` | list[str] \\| None | `None` | staged, and merged, as `sha256" in generated
    assert "| `merge` | `SparkSubmit` \\| `SparkConnect` | `SparkSubmit()` |" in generated
    assert "| `copy_stall_timeout` | float | `3900.0` |" in generated
    assert replace_block(f"a\n{BEGIN}\nold\n{END}\nb", "new") == "a\nnew\nb"


def test_the_keyword_table_lists_every_keyword() -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    section = text[text.index("### The keyword form (deprecated)") :].split("\n## ")[0]
    missing = sorted(k for k in KEYWORDS if f"`{k}`" not in section)
    assert missing == [], f"docs/reference.md's keyword-form table does not say where {missing} went"
