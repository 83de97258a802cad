"""The header every bcgtune artifact carries (traces, calibrations, bucket plans, capture and
validation reports, bench results), and the check a reader applies to it.

    {"format_version": 1, "kind": "bcgtune.<what>", "tool": "bcgtune",
     "tool_version": "...", "created": "<ISO-8601 UTC>", ...}

A reader accepts a document whose `kind` is its own (or absent, for hand-written files) and
whose `format_version` it knows."""

from __future__ import annotations

import datetime as _dt
from typing import Any

from bcgtune.errors import InputError


def document_header(kind: str, format_version: int = 1) -> dict[str, Any]:
    """The self-description fields, in the order they are written."""
    from bcgtune import __version__

    return {
        "format_version": format_version,
        "kind": kind,
        "tool": "bcgtune",
        "tool_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def check_header(obj: Any, kind: str, format_version: int, what: str, where: str) -> dict:
    """`obj` as a document of this kind and version, or a one-line InputError naming `where`."""
    if not isinstance(obj, dict):
        raise InputError(f"{what} JSON must be an object", where)
    got_kind = obj.get("kind")
    if got_kind not in (None, kind):
        raise InputError(f"not a {what} (kind {str(got_kind)[:60]!r})", where)
    got = obj.get("format_version")
    if got != format_version or isinstance(got, bool):
        raise InputError(f"unsupported format_version {str(got)[:20]!r} (this bcgtune reads {format_version})", where)
    return obj
