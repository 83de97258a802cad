"""The attacker's suite covers what it promises: every command, every kind of input, at least
600 rows, and exit codes that are the README's (its exit-code table, read from README.md):
each documented outcome a bad input can have (0 accepted, 1 a check's verdict, 2 bad input,
3 the outside failed, 5 not checked) is reached by some row, and 4 (a bug) by none."""

from __future__ import annotations

import re
from pathlib import Path

import test_hostile_calibrations
import test_hostile_logs
import test_hostile_outputs
import test_hostile_profiles
import test_hostile_traces
from hostile_fixtures import BUILDERS

from bcgtune.cli.app import COMMANDS

README = Path(__file__).resolve().parents[1] / "README.md"
TABLES = (test_hostile_traces, test_hostile_logs, test_hostile_profiles, test_hostile_calibrations, test_hostile_outputs)
ROWS = [row for t in TABLES for row in t.ROWS]


def _readme_exit_codes() -> set[int]:
    text = README.read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    return {int(m) for m in re.findall(r"^\| (\d+) \|", text, flags=re.M)}


def test_at_least_600_rows_each_distinct():
    assert len(ROWS) >= 600
    keys = [(r.command, r.input) for r in ROWS]
    assert len(set(keys)) == len(keys)


def test_every_command_is_attacked():
    used = {r.command for r in ROWS}
    for c in COMMANDS:
        assert any(u.startswith(c.name + " ") for u in used), f"no row attacks `bcgtune {c.name}`"


def test_every_kind_of_input_is_attacked():
    kinds = {r.input.split(":", 1)[0] if ":" in r.input else "file" for r in ROWS}
    # file, folder, glob, URL (file://, http://, zip:// and tar:// archives), stdin, a FIFO with a writer,
    # devices, names no file system takes, and copies of state folders
    assert {"file", "folder", "glob", "fileurl", "httpdead", "zipurl", "zipglob", "tarurl", "stdin", "fifo"} <= kinds
    assert {"devnull", "devzero", "missing", "missingdir", "longname", "copy", "value"} <= kinds
    names = {r.input.split(":", 1)[-1] for r in ROWS}
    for prefix in ("trace.npz", "profile.", "workload.", "cal.", "state.", "log.zip", "log.tar", "runner.", "model."):
        assert any(n.startswith(prefix) for n in names), prefix  # binary traces, TOML, state folders, archives
    hostile = ("nan", "inf", "huge", "bomb", "fullwidth", "rtl", "utf8", "truncated", "deep", "oversize", "many")
    for word in hostile:
        assert any(word in n for n in names), word
    for r in ROWS:
        kind, _, name = r.input.partition(":") if ":" in r.input else ("file", "", r.input)
        assert kind == "value" or not name or name in BUILDERS, r.input


def test_the_exit_codes_are_the_readmes():
    documented = _readme_exit_codes()
    assert documented == {0, 1, 2, 3, 4, 5, 130}
    reached = {r.exit for r in ROWS}
    assert reached <= documented - {4}
    assert {0, 1, 2, 3, 5} <= reached  # 130 (a stop) has its own tests: tests/test_hostile_doors.py
