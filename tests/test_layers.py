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


# Which domain of core/ and adapters/ may import which (docs/architecture.md draws it). The
# core's shared modules (document, schema, stats) import only errors; SGLang's rules import
# no other domain; planning reads traces and SGLang's rules; the simulation and the bench
# verdicts may read planning too.
CORE_SHARED = ("bcgtune.core.document", "bcgtune.core.schema", "bcgtune.core.stats")
CORE_MAY_IMPORT = {
    "sglang": (),
    "trace": ("sglang",),
    "plan": ("trace", "sglang"),
    "sim": ("trace", "sglang", "plan"),
    "bench": ("trace", "sglang", "plan"),
}
ADAPTERS_MAY_IMPORT = {"machine": (), "bench_serving": (), "sglang": ("machine",)}


def _domain(module: str, top: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == top else None


def test_core_domains_import_only_what_the_architecture_allows():
    domains = {p.name for p in (PKG / "core").iterdir() if (p / "__init__.py").exists()}
    assert domains == set(CORE_MAY_IMPORT), "a new core domain must be placed in the architecture"
    for f, mods in _layer("core").items():
        here = f.split("/")[1] if f.count("/") >= 2 else None  # core/<domain>/x.py
        for m in mods:
            if not m.startswith("bcgtune.core"):
                continue
            target = _domain(m, "core")
            if here is None:  # a shared module
                assert m in CORE_SHARED or target is None, f"core/{f} (shared) imports the domain {m}"
            elif target is not None and target != here:
                assert target in CORE_MAY_IMPORT[here], f"{f} imports {m}: core.{here} may not import core.{target}"


def test_adapter_worlds_import_only_what_the_architecture_allows():
    worlds = {p.name for p in (PKG / "adapters").iterdir() if (p / "__init__.py").exists()}
    assert worlds == set(ADAPTERS_MAY_IMPORT), "a new adapter sub-package must be placed in the architecture"
    for f, mods in _layer("adapters").items():
        if f.count("/") < 2:
            continue
        here = f.split("/")[1]
        for m in mods:
            target = _domain(m, "adapters")
            if target is not None and target != here:
                assert target in ADAPTERS_MAY_IMPORT[here], f"{f} imports {m}: adapters.{here} may not import {target}"


def test_every_sub_package_says_what_it_owns():
    for top in ("core", "adapters"):
        for init in (PKG / top).glob("*/__init__.py"):
            assert len(init.read_text(encoding="utf-8").strip()) > 80, f"{init} needs its one-paragraph docstring"


def _module_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        graph[".".join(parts)] = {m for m in _imports(p) if not m.startswith("bcgtune:")}
    return {m: {t for t in targets if t in graph and t != m} for m, targets in graph.items()}


def test_no_import_circles():
    # every import statement counts (top level, inside functions, under TYPE_CHECKING): a
    # circle makes the reading order of two modules undefined
    graph = _module_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert len(graph) > 100
    assert not circles, f"import circles: {circles}"
