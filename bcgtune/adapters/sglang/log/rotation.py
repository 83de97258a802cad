"""Rotated pieces of one log: `server.log.2`, `server.log.1`, `server.log` (logrotate's
numbering: the higher the number, the older), or `server.log-20260827`, `server.log` (its
dateext: by date, the plain name the newest), each possibly `.gz`.

A piece that opens without a `server_args=` line continues the launch its older piece ended
with (the server went on writing; a restart logs server_args again), so a parse reads it by
that launch's settings (adapters/sglang/log/build.py). Pieces are told apart only by their
names in one folder: `a.log.1` and `b.log` are two logs, as are `a.log.1` in two folders.
"""

from __future__ import annotations

import re

_COMPRESSED = (".gz",)
_NUMBERED = re.compile(r"^(?P<stem>.+?)\.(?P<n>\d{1,4})$")
_DATED = re.compile(r"^(?P<stem>.+?)[-_.](?P<date>\d{8}(?:\d{2}){0,3}|\d{4}-\d{2}-\d{2}(?:[T_-]\d{2}(?:[:-]?\d{2}){0,2})?)$")


def _piece(path: str) -> tuple[str, tuple[int, str]]:
    """(the log a piece belongs to, its place: older pieces first)."""
    folder, _, name = path.rpartition("/")
    for suffix in _COMPRESSED:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    m = _NUMBERED.match(name)
    if m:
        return f"{folder}/{m['stem']}", (0, f"{10**4 - int(m['n']):05d}")
    m = _DATED.match(name)
    if m:
        return f"{folder}/{m['stem']}", (1, re.sub(r"\D", "", m["date"]).ljust(14, "0"))
    return f"{folder}/{name}", (2, "")


LOG_SUFFIXES = (".log", ".txt", ".out")


def is_log_name(path: str) -> bool:
    """Whether a file in a folder of logs is one: a name ending in .log, .txt or .out, or a
    rotated piece of one (`server.log.1`, `server.log-20260827`), each possibly .gz."""
    log, _ = _piece(path.rstrip("/"))
    return log.endswith(LOG_SUFFIXES)


def previous_pieces(paths: list[str]) -> list[int | None]:
    """For each path, the index of the piece of the same log written just before it (None
    when it is the oldest piece given, or not a piece of a rotated log). A log's pieces of
    both kinds (numbered and dated) are not ordered against each other: none is chained."""
    by_log: dict[str, list[tuple[tuple[int, str], int]]] = {}
    for i, p in enumerate(paths):
        if p == "-":
            continue
        log, place = _piece(p.split("?", 1)[0])
        by_log.setdefault(log, []).append((place, i))
    out: list[int | None] = [None] * len(paths)
    for pieces in by_log.values():
        kinds = {place[0] for place, _ in pieces if place[0] != 2}
        if len(pieces) < 2 or len(kinds) != 1 or len({place for place, _ in pieces}) != len(pieces):
            continue
        pieces.sort()
        for (_, before), (_, after) in zip(pieces, pieces[1:]):
            out[after] = before
    return out
