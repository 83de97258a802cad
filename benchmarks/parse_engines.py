"""Candidate engines for the log parse, measured on the same file before choosing one.

Each engine does a skeleton of the histogram-only parse on one core: find the prefill lines
and read six of their fields (the bracketed prefix, #new-seq, #new-token, #cached-token,
#running-req, #queue-req) in the layout of current SGLang versions, and (where stated) find
the lines that carry launch settings and graph captures. None of them is exact: each misses
the layouts of other SGLang versions that bcgtune's parser reads. They bound what an engine
could give before any of the grammar is ported to it. bcgtune's own parse of the same file
is measured beside them.

    pip install polars google-re2          # not bcgtune's dependencies
    python benchmarks/parse_engines.py benchmarks/_work/real_excerpts_200mb.log

(the file: `python benchmarks/parse_throughput.py --only-real --real-mb 200` writes it.)
CPU time of this process (process_time: every thread counted), best of --repeat runs after one
warm-up, Polars limited to one thread.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("POLARS_MAX_THREADS", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PREFILL = (
    rb"\[([^\]\n]*)\] Prefill batch[^\n]*?#new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+)"
    rb"[^\n]*?#running-req: (\d+), #queue-req: (\d+)"
)
RARE = r"Capture cuda graph|max_total_num_tokens=|server_args=|Capturing "


def engines(path: str) -> dict:
    import numpy as np

    def grep_count():
        with open(path, "rb") as fh:
            return fh.read().count(b"Prefill batch")

    def python_re():
        with open(path, "rb") as fh:
            rows = re.findall(PREFILL, fh.read())
        return len(np.array([r[2] for r in rows], dtype=np.int64))

    def re2():
        import re2 as google_re2

        with open(path, "rb") as fh:
            return len(google_re2.findall(PREFILL, fh.read()))

    def polars(rare: bool):
        def run():
            import polars as pl

            df = pl.scan_csv(
                path,
                has_header=False,
                separator="\x1f",
                quote_char=None,
                new_columns=["l"],
                schema_overrides={"l": pl.String},
                truncate_ragged_lines=True,
            )
            line = pl.col("l")
            pre = df.filter(line.str.contains("Prefill batch", literal=True)).select(
                line.str.extract_groups(PREFILL.decode().replace("[^\\n]", ".").replace("[^\\]\\n]", "[^\\]]"))
            )
            if not rare:
                return pre.collect().height
            out = pl.collect_all([pre, df.filter(line.str.contains(RARE))])
            return tuple(o.height for o in out)

        return run

    def sha256():
        import hashlib

        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()[:12]

    def xxh128():
        from bcgtune.fileio import log_digest

        h = log_digest()
        with open(path, "rb") as fh:
            h.update(fh.read())
        return h.hexdigest()[:12]

    def line_scanner():
        from bcgtune.adapters.sglang.log.fastpath import _RARE_NEEDLES, LineTable
        from bcgtune.adapters.sglang.log.grammar import _B_NEW_SEQ, _MAX_PLAN_KEY

        if LineTable is None:
            raise ImportError("the compiled line scanner", name="bcgtune.adapters.sglang.log._lines")
        from bcgtune.adapters.sglang.log.grammar import CHUNK_SIZE

        table, found, block = LineTable(), 0, CHUNK_SIZE
        with open(path, "rb") as fh:
            data = fh.read()
        start = 0
        while start < len(data):
            stop = data.rfind(b"\n", start, start + block) + 1 or len(data)
            found += len(table.scan(data, start, stop, _RARE_NEEDLES, _B_NEW_SEQ, _MAX_PLAN_KEY, 1 << 16)[1]) // 8
            start = stop
        return found

    def bcgtune(compiled: bool):
        def run():
            from bcgtune.adapters.sglang.log import ParseOptions, parse_logs
            from bcgtune.adapters.sglang.log.fastpath import LineTable

            if compiled and LineTable is None:
                raise ImportError("the compiled line scanner", name="bcgtune.adapters.sglang.log._lines")
            return int(parse_logs([path], histogram_only=True, options=ParseOptions(compiled=compiled)).n_batches)

        return run

    return {
        "bytes.count(b'Prefill batch')": grep_count,
        "hashlib.sha256 (the log's hash before XXH3-128)": sha256,
        "XXH3-128 (each log's hash)": xxh128,
        "bcgtune's compiled line scanner alone": line_scanner,
        "Python re.findall, 6 fields": python_re,
        "google-re2 findall, 6 fields": re2,
        "Polars (1 thread), 6 fields": polars(False),
        "Polars (1 thread), 6 fields + rare lines": polars(True),
        "bcgtune parse_logs(histogram_only=True), compiled": bcgtune(True),
        "bcgtune parse_logs(histogram_only=True), numpy": bcgtune(False),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    size_mb = os.path.getsize(a.log) / 1e6
    print(f"{a.log}: {size_mb:.1f} MB; nproc={os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
    for name, fn in engines(a.log).items():
        try:
            fn()
        except ImportError as exc:
            print(f"  {name:50s} not installed ({exc.name})")
            continue
        best = float("inf")
        for _ in range(a.repeat):
            t0 = time.process_time()
            result = fn()
            best = min(best, time.process_time() - t0)
        print(f"  {name:50s} {best:6.3f} s CPU  {size_mb / best:6.0f} MB/s  -> {result}")


if __name__ == "__main__":
    main()
