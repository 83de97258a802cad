"""`bcgtune suggest-buckets`: the optimal bucket list for a trace."""

from __future__ import annotations

from bcgtune.cli.app import app  # noqa: F401
