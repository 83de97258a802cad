"""The layers of docs/architecture.md hold: core imports only core (and the error type);
adapters, files and engines never import the services or the command line; services never
import the command line. Read from every module's import statements (top level and inside
functions)."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "bcgtune"


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "bcgtune":  # the package root: name what
            names.update(f"bcgtune:{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {n for n in names if n.startswith(("bcgtune.", "bcgtune:"))}


def _layer(folder: str) -> dict[str, set[str]]:
    return {str(p.relative_to(PKG)): _imports(p) for p in sorted((PKG / folder).rglob("*.py"))}


def test_core_is_pure():
    allowed = ("bcgtune.core", "bcgtune.errors", "bcgtune:__version__")
    bad = {f: sorted(m for m in mods if not m.startswith(allowed)) for f, mods in _layer("core").items()}
    bad = {f: m for f, m in bad.items() if m}
    assert not bad, f"core imports outside core: {bad}"
    assert len(_layer("core")) > 20  # the walk found the modules


def test_edges_never_import_services_or_the_command_line():
    for folder in ("adapters", "files", "engines"):
        for f, mods in _layer(folder).items():
            wrong = sorted(m for m in mods if m.startswith(("bcgtune.services", "bcgtune.cli", "bcgtune.api")))
            assert not wrong, f"{f} imports {wrong}"


def test_services_never_import_the_command_line():
    for f, mods in _layer("services").items():
        wrong = sorted(m for m in mods if m.startswith("bcgtune.cli"))
        assert not wrong, f"{f} imports {wrong}"
