"""How the log parser reads: passed in (ParseOptions), never read from module globals, so a
caller (or a test) sets them per call and worker processes receive the same ones."""

from __future__ import annotations

from dataclasses import dataclass

from bcgtune.adapters.sglang.log.grammar import CHUNK_SIZE, MAX_LINE_BYTES

PARALLEL_MIN_BYTES = 32 << 20  # less input than this parses serially (workers cost more)
SMALL_PIECE = 16 << 10  # a piece this small with one line costs less through the per-line parser


@dataclass(frozen=True)
class ParseOptions:
    """chunk_size: bytes read at a time (the parse holds a few times that); max_line_bytes: a
    longer physical line is skipped and counted, never held whole; fast_path: False sends every
    line through the per-line parser (the reference the fast path equals); compiled: False
    keeps the fast path on numpy where the compiled line scanner is built; small_piece: a
    piece of one line up to this size goes through the per-line parser; parallel_min_bytes:
    less input than this in all parses serially whatever `jobs` says."""

    chunk_size: int = CHUNK_SIZE
    max_line_bytes: int = MAX_LINE_BYTES
    fast_path: bool = True
    compiled: bool = True
    small_piece: int = SMALL_PIECE
    parallel_min_bytes: int = PARALLEL_MIN_BYTES


DEFAULT_OPTIONS = ParseOptions()
