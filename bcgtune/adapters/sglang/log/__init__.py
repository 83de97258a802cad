"""Streaming parser of SGLang scheduler logs -> PrefillTrace.

SGLang prints one line per prefill batch (attn-TP rank 0 of each DP rank), e.g. (0.5.23,
python/sglang/srt/managers/scheduler_components/metrics_reporter.py, report_prefill_stats):

    [2026-08-27 03:46:54 TP0] Prefill batch, #new-seq: 9, #new-token: 8192, #cached-token: 0,
        token usage: 0.03, #running-req: 1, #queue-req: 0, #pending-token: 6993,
        cuda graph: True, input throughput (token/s): 413282.46

(one physical line in a real log). Over the versions the head changed (`Prefill batch.`,
`Prefill batch,`, `Prefill batch [iter],`, pre-2024 `new fill batch. #seq: n. #new_token: n.`),
fields were added, reordered and renamed, and users' copies carry wrappers (docker compose
`name | `, Docker Desktop timestamps, collector brackets, indentation, tqdm output glued in
front, CRLF, hand-wrapped records). So a record is found by its head and read as a bag of
`key: value` fields, never by position.

Bounded: the input is streamed in chunks of whole lines; a line longer than MAX_LINE_BYTES is
skipped and counted (quoted by its first few dozen characters only); a binary input (NUL
bytes in its first chunk) is refused; a record whose counts fall outside SGLang's int32
token counts is counted as malformed. Only per-batch numbers are kept, in compact columns
(a few dozen bytes per batch), and every list of samples is capped.

Speed: each chunk goes through a fast path (_Scanner._feed_fast) that finds prefill and
decode lines, looks each prefill line up by its layout (the line with its ASCII digits
masked), and reads the numbers of a known layout at fixed offsets, vectorised. A layout's
plan comes from the general per-record parser itself: _prefix_layout on the text before
"Prefill batch" (one plan per masked head) and _plan on the text after it (one plan per
tail shape: masked, each digit run collapsed, since _plan decides by where digits are, not
by how many), so both agree by construction (and tests/test_sglang_log.py compares them on
every log and on generated ones). Every line a plan does not fully cover (non-ASCII text, a
record that may continue on the next line, and other rare lines) goes through the general
per-line parser (_Scanner._line), in line order. Where the compiled line scanner (_lines.c)
is built, one C pass finds the lines, their heads and their rare lines and gives each
layout and each rare line's text an id kept across chunks, so a layout is looked up, and a
capture, startup or launch line's text is parsed, once per distinct text: its events are
handed to the sink in bulk (_Sink.events). Without it the same steps run on numpy, with the
same results. Several files parse in worker processes (parse_logs(..., jobs=N)) into one
merged trace identical to the serial parse.

The package, one file per job:
  grammar.py   the record grammar (prefixes, prefill/capture/startup/disable lines)
  fastpath.py  the fast path (layouts, vectorised reads) and record blocks
  _lines.c     the compiled line scanner (an optional extension; _lines.pyi its types)
  scanner.py   streaming input (files, .gz, stdin; bounded blocks) and the scanner
  columns.py   what one log yields: compact columns or per-launch histograms
  parallel.py  several files serially or in worker processes
  build.py     one log's results -> its trace; several merged (parse_logs)
  remote.py    logs where they live: URLs through fsspec, folders and globs
  options.py   ParseOptions: how the parser reads, passed in per call
"""

from bcgtune.adapters.sglang.log.build import file_trace, parse_logs, rank_overlap
from bcgtune.adapters.sglang.log.grammar import (
    CHUNK_SIZE,
    INT32_MAX,
    MAX_CAPTURES,
    MAX_LINE_BYTES,
    MAX_MALFORMED_SAMPLES,
    MAX_QUOTE_CHARS,
    MAX_SAMPLE_CHARS,
    PrefillRecord,
    PrefillValues,
    forward_tokens,
    parse_capture_text,
    parse_prefill_text,
    parse_prefix,
    parse_server_args_text,
    parse_startup_text,
)
from bcgtune.adapters.sglang.log.options import PARALLEL_MIN_BYTES, ParseOptions
from bcgtune.adapters.sglang.log.scanner import ScanResult, scan_log
from bcgtune.core.trace.groups import FORWARD_TOKENS_RULE, FORWARD_TOKENS_RULE_BY_LAUNCH, FORWARD_TOKENS_RULE_MIXED

__all__ = [
    "CHUNK_SIZE",
    "FORWARD_TOKENS_RULE",
    "FORWARD_TOKENS_RULE_MIXED",
    "FORWARD_TOKENS_RULE_BY_LAUNCH",
    "INT32_MAX",
    "MAX_CAPTURES",
    "MAX_LINE_BYTES",
    "MAX_MALFORMED_SAMPLES",
    "MAX_QUOTE_CHARS",
    "MAX_SAMPLE_CHARS",
    "PARALLEL_MIN_BYTES",
    "ParseOptions",
    "PrefillRecord",
    "PrefillValues",
    "ScanResult",
    "file_trace",
    "forward_tokens",
    "parse_capture_text",
    "parse_logs",
    "parse_prefill_text",
    "parse_prefix",
    "parse_server_args_text",
    "parse_startup_text",
    "rank_overlap",
    "scan_log",
]
