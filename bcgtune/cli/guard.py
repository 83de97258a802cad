"""Checks a command runs before any work: its outputs (bcgtune.fileio.check_outputs) and the
optional packages a flag needs, each failing in well under a second with one line."""

from __future__ import annotations

import importlib.util
from typing import Iterable, Mapping

from bcgtune.errors import InputError
from bcgtune.fileio import check_outputs


def outputs(paths: Mapping[str, str | None], inputs: Iterable[str | None] = ()) -> None:
    """Refuse bad output paths (flag -> path) before any work: see check_outputs."""
    check_outputs(paths, [i for i in inputs if i])


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
    import os

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
