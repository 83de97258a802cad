"""docs/formats.md is generated from the schemas bcgtune validates with; it must be current."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_formats_doc_is_generated_from_the_current_schemas():
    spec = importlib.util.spec_from_file_location("formats_doc", REPO / "scripts" / "formats_doc.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert (REPO / "docs" / "formats.md").read_text() == mod.render(), "run: python scripts/formats_doc.py"
