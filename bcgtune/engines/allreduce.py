"""The all-reduce after each block of a tensor-parallel rank, when one process stands for the
rank: its time as a function of the bytes reduced, from a stated curve or a measured one.
No torch here (the engine's model applies it: engines/models.py `Comm`).

SGLang all-reduces a rank's partial hidden states [tokens, hidden] after each attention and
each MLP or MoE block (RowParallelLinear's reduce, srt/layers/linear.py, and the layer's exit,
srt/layers/layer_boundary/ops.py), and after the vocabulary-parallel embedding
(srt/layers/vocab_parallel_embedding.py, VocabParallelEmbedding.forward), all inside the
captured graph.

The stated curve is a ring all-reduce's cost, t = latency + 2 (N - 1) / N x bytes / bus
bandwidth, with a bus bandwidth of 460 GB/s: nccl-tests' all_reduce_perf on 8x H100 SXM5
(NVLink 4) reports 460-480 GB/s at large sizes (the reference table in "NCCL-tests in
practice", docs.alayanew.com, 2026-05), and a latency of 10 microseconds per call, an
assumption for small messages that bcgtune did not measure. A measured curve
(`--all-reduce-curve FILE`: nccl-tests' all_reduce_perf output, or JSON {"bytes": [...],
"us": [...]}) replaces it, interpolated log-log between its points."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from bcgtune.errors import InputError

STATED_BUS_GBPS = 460.0
STATED_LATENCY_US = 10.0
_MAX_CURVE_BYTES = 1 << 20
_MAX_POINTS = 10_000
# nccl-tests all_reduce_perf rows: size count type redop root time algbw busbw #wrong ...
_NCCL_ROW = re.compile(r"^\s*(\d+)\s+\d+\s+\w+\s+\w+\s+-?\d+\s+([0-9.]+)\s")


@dataclass(frozen=True)
class AllReduceCurve:
    """Microseconds of one all-reduce of `nbytes` over `ranks` ranks: the stated ring model,
    or measured points (bytes ascending, microseconds)."""

    ranks: int
    points: tuple[tuple[int, float], ...] = ()  # measured: (bytes, us); empty: the stated model
    source: str = "stated"

    def us(self, nbytes: int) -> float:
        if self.ranks <= 1 or nbytes <= 0:
            return 0.0
        if not self.points:
            return STATED_LATENCY_US + 2 * (self.ranks - 1) / self.ranks * nbytes / (STATED_BUS_GBPS * 1e3)
        xs = [p[0] for p in self.points]
        if nbytes <= xs[0]:
            return self.points[0][1]
        if nbytes >= xs[-1]:  # beyond the last point: its bandwidth
            b, t = self.points[-1]
            return t * nbytes / b
        for (b0, t0), (b1, t1) in zip(self.points, self.points[1:]):
            if b0 <= nbytes <= b1:
                f = (math.log(nbytes) - math.log(b0)) / (math.log(b1) - math.log(b0))
                return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
        return self.points[-1][1]  # not reached

    def describe(self) -> str:
        if not self.points:
            return (
                f"stated: ring all-reduce over {self.ranks} ranks, {STATED_LATENCY_US:g} us + bytes at "
                f"{STATED_BUS_GBPS:g} GB/s bus bandwidth (8x H100 NVLink, nccl-tests)"
            )
        return f"measured: {len(self.points)} points from {self.source}"

    def to_json(self) -> dict:
        return {"ranks": self.ranks, "source": self.source, "points": [list(p) for p in self.points]}


def load_curve(path: str, ranks: int) -> AllReduceCurve:
    """A measured all-reduce curve: nccl-tests' all_reduce_perf output (its out-of-place time
    column), or JSON {"bytes": [...], "us": [...]}."""
    import json

    from bcgtune.fileio import read_input

    text = read_input(path, "all-reduce curve", _MAX_CURVE_BYTES).decode("utf-8", errors="replace")
    points: list[tuple[int, float]] = []
    if text.lstrip().startswith("{"):
        try:
            obj = json.loads(text)
            pairs = list(zip(obj["bytes"], obj["us"], strict=True))
        except (ValueError, KeyError, TypeError, RecursionError):
            raise InputError('not JSON of the form {"bytes": [...], "us": [...]} with lists of equal length', path) from None
        for b, t in pairs:
            ok_b = isinstance(b, int) and not isinstance(b, bool) and 0 < b < 1 << 50
            ok_t = isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < float(t) < 1e9
            if not (ok_b and ok_t):
                raise InputError(
                    f"bytes must be positive integers and us positive numbers, got {str(b)[:20]}, {str(t)[:20]}", path
                )
            points.append((int(b), float(t)))
    else:
        for line in text.splitlines()[:100_000]:
            m = _NCCL_ROW.match(line)
            if m and int(m.group(1)) > 0 and 0 < float(m.group(2)) < 1e9:
                points.append((int(m.group(1)), float(m.group(2))))
    if len(points) < 2:
        raise InputError("an all-reduce curve needs at least two points (nccl-tests output, or bytes/us JSON)", path)
    if len(points) > _MAX_POINTS:
        raise InputError(f"an all-reduce curve holds at most {_MAX_POINTS} points", path)
    merged = dict(sorted(points))
    return AllReduceCurve(ranks, tuple(sorted(merged.items())), path)


def all_reduces_per_forward(layers: int, embedding_inside: bool) -> int:
    """How many all-reduces a rank's forward runs: after each attention and each MLP or MoE
    block, and after the vocabulary-parallel embedding when the graph holds it (text models;
    a VL model's embeddings are merged before the graph)."""
    return 2 * layers + (1 if embedding_inside else 0)
