"""Docs as tests: every ```console block of README.md and docs/*.md runs, and its shown
output is checked; every ```python block runs. Parsed with Sybil (a maintained doc-testing
library); the console evaluator is ours.

A console block is a sequence of `$ command` lines, each followed by the output it shows
(stdout and stderr as the user sees them). Output lines must match exactly, except that a
line `...` matches any number of lines; a block that shows no output checks only the exit
status. A command that should fail ends its output with `[exit N]`. The commands of one
document run one after another in one scratch folder that starts with the files in
tests/data/docs/ (profiles) and `server.log`, a public log excerpt from tests/data/sglang-logs/, so a later
command reads what an earlier one wrote. Live-server examples reach the stand-in server
(tests/standin) through BCGTUNE_SERVER_CMD, set by this file, never shown in the docs.
A ```bash block is an install command, marked `<!-- install command ... -->`: CI runs those
as .ci/run itself.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sybil import Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "data" / "docs"
LOGS = Path(__file__).resolve().parent / "data" / "sglang-logs"  # server.log is one of these public excerpts
STANDIN = Path(__file__).resolve().parent / "standin"
DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
_EXIT = re.compile(r"^\[exit (\d+)\]$")


def _tiny_model(folder: Path) -> None:
    """The small model folder live.toml names (a tokenizer and a config the stand-in server
    reads; a Qwen4-Exp architecture, so its runner gate applies)."""
    import json

    sys.path.insert(0, str(STANDIN))
    from tiny_tokenizer import build_tiny_tokenizer

    build_tiny_tokenizer(folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["Qwen4ExpForConditionalGeneration"]
    (folder / "config.json").write_text(json.dumps(cfg))


def _shim(folder: Path) -> Path:
    """A `bcgtune` on PATH that runs this interpreter's bcgtune (installed or not)."""
    bindir = folder / ".bin"
    bindir.mkdir(exist_ok=True)
    exe = bindir / "bcgtune"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m bcgtune "$@"\n')
    exe.chmod(0o755)
    return bindir


def _env(workdir: Path) -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{_shim(workdir)}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["COLUMNS"] = "100"
    env["BCGTUNE_SERVER_CMD"] = f"{sys.executable} {STANDIN / 'server.py'}"
    env["BCGTUNE_BENCH_CLIENT"] = str(STANDIN / "fast_client.py")
    env["STANDIN_TIME_SCALE"] = "0.2"
    env["STANDIN_RUNNER"] = "patched"
    env["HF_HUB_OFFLINE"] = "1"
    env.pop("BCGTUNE_DEBUG", None)
    return env


def _commands(source: str) -> list[tuple[str, list[str], int]]:
    """[(command, expected output lines, expected exit status)] of a console block."""
    out: list[tuple[str, list[str], int]] = []
    for line in source.splitlines():
        if line.startswith("$ "):
            out.append((line[2:], [], 0))
        elif out:
            m = _EXIT.match(line.strip())
            if m:
                cmd, lines, _ = out[-1]
                out[-1] = (cmd, lines, int(m.group(1)))
            else:
                out[-1][1].append(line.rstrip())
    return out


def _matches(expected: list[str], actual: list[str]) -> bool:
    """Line-by-line equality, where an expected line `...` matches any run of lines."""
    if not expected:
        return True
    if expected[0] == "...":
        return any(_matches(expected[1:], actual[i:]) for i in range(len(actual) + 1))
    return bool(actual) and actual[0] == expected[0] and _matches(expected[1:], actual[1:])


def run_console(example) -> None:
    workdir = example.namespace["workdir"]
    for cmd, expected, status in _commands(example.parsed):
        proc = subprocess.run(
            ["bash", "-c", cmd],
            cwd=workdir,
            env=_env(workdir),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=600,
        )
        actual = [ln.rstrip() for ln in proc.stdout.rstrip("\n").splitlines()]
        where = f"{Path(example.path).name}:{example.line}: $ {cmd}"
        assert proc.returncode == status, f"{where}\nexit {proc.returncode}, expected {status}\n{proc.stdout[-3000:]}"
        if expected and expected[-1] == "":
            expected = expected[:-1]
        assert _matches(expected, actual), f"{where}\nexpected:\n" + "\n".join(expected) + "\nactual:\n" + "\n".join(actual)


_SYBIL = Sybil(parsers=[CodeBlockParser("console", run_console), PythonCodeBlockParser(), SkipParser()], path=str(REPO))


@pytest.mark.parametrize("doc", DOCS, ids=[p.name for p in DOCS])
def test_doc_examples(doc, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(FIXTURES, work)
    shutil.copy(LOGS / "24_newest_decode_graph_end_startup_and_load.log", work / "server.log")
    if importlib.util.find_spec("tokenizers") is not None:
        _tiny_model(work / "model")
    elif "live.toml" in doc.read_text():  # its live examples serve the tiny model, whose tokenizer needs tokenizers
        pytest.skip("needs the tokenizers package (the live examples' stand-in model)")
    if importlib.util.find_spec("sglang") is None and "no cached answer from SGLang" in doc.read_text():
        pytest.skip("its examples show what bcgtune says where sglang is installed")
    document = _SYBIL.parse(doc)
    document.namespace["workdir"] = work
    cwd = os.getcwd()
    os.chdir(work)  # python blocks run in the same scratch folder
    try:
        ran = 0
        for example in document:
            example.evaluate()
            ran += 1
    finally:
        os.chdir(cwd)
    assert ran > 0 or doc.name not in ("README.md",), f"{doc.name} has no runnable example"


def test_every_shell_block_is_a_console_block():
    """Command blocks are ```console (run here); a ```bash/```sh block must be an install
    command, marked as such."""
    for doc in DOCS:
        text = doc.read_text()
        for m in re.finditer(r"(<!-- install command[^>]*-->\s*)?```(bash|sh|shell)\n", text):
            assert m.group(1), f"{doc.name}: a ```{m.group(2)} block that is not an install command"
