"""Help text: plain and whole at 80 columns (the width of a pipe), every option named in full,
brackets kept, examples attached one way; and light: `bcgtune --help` imports no command
module, `bcgtune COMMAND --help` only its own, neither numpy nor pydantic."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys

import pytest
from cli_helpers import HANG_S

from bcgtune.cli.app import COMMANDS, _build_command, command_function
from bcgtune.cli.help import command_examples

NAMES = [c.name for c in COMMANDS]


def _help(args: list[str], columns: int = 80) -> str:
    env = dict(os.environ, COLUMNS=str(columns), TERM="dumb")
    p = subprocess.run([sys.executable, "-m", "bcgtune", *args], capture_output=True, text=True, env=env, timeout=HANG_S)
    assert p.returncode == 0 and not p.stderr, p.stderr
    return p.stdout


def test_the_command_table_is_in_help_order_with_each_docstring_summary():
    assert NAMES == [
        "trace", "trace merge", "suggest-buckets", "drift", "capture", "validate", "calibrate", "tune", "serve", "doctor", "bench"
    ]  # fmt: skip
    for c in COMMANDS:
        doc = inspect.getdoc(command_function(c.name)) or ""
        assert doc.split("\n\n")[0].replace("\n", " ") == c.summary, c.name
    text = _help(["--help"])
    listed = [  # a name is the line's first words up to the column gap ("trace merge")
        re.split(r"\s{2,}", line.strip())[0]
        for line in text.split("Commands:")[1].splitlines()
        if line.startswith("  ") and line[2] != " "
    ]
    assert listed == NAMES


def test_help_imports_no_command_module_numpy_or_pydantic():
    code = (
        "import sys\n"
        "from bcgtune.cli.app import main\n"
        "def run(args):\n"
        "    try:\n        main(args)\n    except SystemExit:\n        pass\n"
        "run(['--help'])\n"
        "print('ROOT', sorted(m for m in sys.modules if m.startswith('bcgtune.cli.commands.')),"
        " [m for m in ('numpy', 'pydantic', 'rich') if m in sys.modules])\n"
        f"for cmd in {NAMES!r}:\n"
        "    run([cmd, '--help'])\n"
        "print('ALL', [m for m in ('numpy', 'pydantic', 'rich', 'torch', 'sglang', 'sklearn') if m in sys.modules])\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S)
    assert p.returncode == 0, p.stderr
    assert "ROOT [] []" in p.stdout, p.stdout[-800:]
    assert "ALL []" in p.stdout, p.stdout[-800:]


@pytest.mark.parametrize("name", NAMES)
def test_help_at_80_columns_is_whole(name):
    text = _help([name, "--help"])
    assert all(len(line) <= 80 for line in text.splitlines()), [line for line in text.splitlines() if len(line) > 80]
    assert "<bool>" not in text and "\u2502" not in text and "\u2026" not in text  # no type tags, boxes or cut names
    words = set(re.findall(r"(?<![\w-])-{1,2}[\w][\w-]*", text))
    for p in _build_command(name).params:
        for opt in [*getattr(p, "opts", []), *getattr(p, "secondary_opts", [])]:
            if opt.startswith("-"):
                assert opt in words, (name, opt)
    assert "Examples:" in text
    for line in command_examples(command_function(name)):
        assert line in text


@pytest.mark.parametrize(
    "cmd, needle",
    [
        ("suggest-buckets", "profile's [buckets]"),
        ("suggest-buckets", "needs bcgtune[plot]"),
        ("bench", "needs bcgtune[plot]"),
        ("trace", "[max(floor(L*r),1), L]"),
        ("validate", "[buckets].list"),
        ("serve", "[profile].model"),
    ],
)
def test_help_keeps_literal_brackets_at_80_columns(cmd, needle):
    text = " ".join(_help([cmd, "--help"]).split())
    assert needle in text, (cmd, text[-600:])


def test_help_options_follow_their_panels_in_declaration_order():
    text = _help(["suggest-buckets", "--help"])
    heads = [line[:-1] for line in text.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert heads == [
        "Arguments",
        "Options",
        "Optimizer",
        "Comparison rows",
        "Output",
        "Server layout (SGLang's flags)",
        "Examples",
    ]
    order = [text.index(f) for f in ("--max-buckets", "--align", "--max-bucket ", "--padding-factor", "--objective")]
    assert order == sorted(order)
    assert "--objective [padding|time]" in text and "[default: padding]" in text


def test_the_simulation_option_table_is_what_the_workload_schema_generates():
    """trace --simulate reads a generated table (so its help needs no pydantic); it must be
    what the schema generates now: run scripts/gen_option_tables.py after a schema change."""
    from bcgtune.cli.schema_options import specs_from_model
    from bcgtune.cli.simulate_options_table import CLIENT_OPTIONS, SERVER_OPTIONS
    from bcgtune.core.sim.workload import ClientSettings, ServerSettings

    client = CLIENT_OPTIONS[0].panel
    server = SERVER_OPTIONS[0].panel
    assert CLIENT_OPTIONS == tuple(specs_from_model(ClientSettings, client))
    assert SERVER_OPTIONS == tuple(specs_from_model(ServerSettings, server))
