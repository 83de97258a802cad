"""Checks a command runs before any work: its outputs (bcgtune.fileio.check_outputs) and the
optional packages a flag needs, each failing in well under a second with one line.

Outputs never hurt inputs, and a command cannot forget one of its inputs: every value of the
running command line (each option, argument and passthrough word) that names an existing file
counts as an input of the run, besides the inputs a command names itself (a file a value
stands for, e.g. a built-in profile). The command class records the line when it parses it
(bcgtune/cli/command.py)."""

from __future__ import annotations

import importlib.util
import os
from typing import Iterable, Mapping, Sequence

from bcgtune.errors import InputError
from bcgtune.fileio import check_outputs, input_files, local_paths

# (the option's names, its value) for every value of the command line being run
_line: list[tuple[tuple[str, ...], str]] = []


def record_command_line(values: Sequence[tuple[tuple[str, ...], str]]) -> None:
    _line[:] = list(values)


def line_inputs(outputs: Iterable[str]) -> list[str]:
    """The values of the running command line that name existing files, except those of the
    output options themselves."""
    skip = set(outputs)
    return [p for names, v in _line if not skip & set(names) for p in local_paths(v) if _isfile(p)]


def _isfile(path: str) -> bool:
    try:
        return os.path.isfile(path)
    except (OSError, ValueError):
        return False


def outputs(paths: Mapping[str, str | None], inputs: Iterable[str | None] = (), in_place: Iterable[str] = ()) -> None:
    """Refuse bad output paths (flag -> path) before any work: see check_outputs. The run's
        inputs: the files each of `inputs` expands to (a folder's files, a glob's matches, the
    path of a `file://` or other local URL: fileio.input_files) and every file the command
    line names (line_inputs), except the files in
        `in_place`, which the command rewrites on purpose (atomically, e.g. calibrate --extend)."""
    rewritten = {os.path.realpath(p) for p in in_place}
    named = [p for p in line_inputs(paths) if os.path.realpath(p) not in rewritten]
    given = [f for i in inputs if i for f in (input_files(i) or [i])]
    check_outputs(paths, given + named)


def needs(module: str, extra: str, what: str) -> None:
    """`what` needs `module`, shipped in bcgtune's `extra`: refuse now if it is missing."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise InputError(f"{what} needs {module}: pip install 'bcgtune[{extra}]'")


def workdir(path: str, where: str = "--workdir") -> None:
    """A work folder: absent (it will be created) or a folder, writable."""
    if not path.strip():
        raise InputError("empty folder name", where)
    if os.path.exists(path) and not os.path.isdir(path):
        raise InputError("exists and is not a folder", f"{where} {path}")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(path) and not os.path.isdir(parent):
        raise InputError("its parent folder does not exist", f"{where} {path}")
    target = path if os.path.isdir(path) else parent
    if not os.access(target, os.W_OK):
        raise InputError("cannot write there", f"{where} {path}")
