"""A fleet's SGLang logs with their ground truth: what `bcgtune trace --log FOLDER` must find.

Each configuration is a launch (model, tp, dp, DP attention, chunk, mixed chunk) served by
some replicas; each replica writes one log, cut into rotated pieces (`NAME.log.2`, the
oldest, then `NAME.log.1`, then `NAME.log`). A replica's first piece opens with what SGLang
prints at start-up (its `server_args=ServerArgs(...)` line, then each scheduler's
`max_total_num_tokens=..., chunked_prefill_size=...` line); a replica that "lost its
start" has no such lines anywhere (its oldest piece was rotated away). Then prefill lines
(one per DP rank's batch under DP attention, tagged `DPd TPt`), decode lines and HTTP lines.

The lines follow SGLang 0.5's formats (srt/managers/scheduler_metrics_mixin.py,
log_prefill_stats): under DP attention the server_args line and the scheduler state the
chunk of one attention-DP rank (the launch value divided by the ranks); with
--enable-mixed-chunk a chunk-saturated batch holds `#new-token + #running-req == chunk`
(srt/managers/schedule_policy.py, PrefillAdder: the running decode rows come out of the
chunk budget), and its forward pass counts those rows.

`write_fleet` returns the truth: each configuration's files and the histogram of its
forward tokens. Sizes are drawn so that independent replicas print records with the same
second and sizes now and then (chunk-saturated batches), as real replicas do.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Configuration:
    """One launch of the fleet. chunk: --chunked-prefill-size as launched."""

    model: str
    tp: int = 1
    dp: int = 1
    dp_attention: bool = False
    chunk: int = 8192
    mixed_chunk: bool = False
    replicas: int = 2

    @property
    def ranks(self) -> int:
        """Attention-DP ranks: each prints its own prefill lines."""
        return self.dp if self.dp_attention and self.dp > 1 else 1

    @property
    def rank_chunk(self) -> int:
        return self.chunk // self.ranks

    def launch(self) -> list[str]:
        """The launch as `trace --launch KEY=VALUE` takes it."""
        return [
            f"model_path={self.model}",
            f"tp_size={self.tp}",
            f"dp_size={self.dp}",
            f"enable_dp_attention={str(self.dp_attention).lower()}",
            f"chunked_prefill_size={self.chunk}",
            f"enable_mixed_chunk={str(self.mixed_chunk).lower()}",
        ]


@dataclass
class Truth:
    """What the logs hold, per configuration (index into the configurations given)."""

    files: dict[int, list[str]] = field(default_factory=dict)  # file names, in sorted order
    sizes: dict[int, Counter] = field(default_factory=dict)  # forward tokens -> batches
    lost_start: dict[int, list[str]] = field(default_factory=dict)  # files of replicas without start-up lines
    bytes: int = 0

    def histogram(self, c: int) -> tuple[list[int], list[int]]:
        sizes = sorted(self.sizes[c])
        return sizes, [self.sizes[c][s] for s in sizes]


def _stamp(t: float) -> str:
    s = int(t)
    return f"2026-08-27 {s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}"


def _tag(cfg: Configuration, d: int) -> str:
    return f"DP{d} TP{d * (cfg.tp // cfg.ranks)}" if cfg.ranks > 1 else "TP0"


def _start_lines(cfg: Configuration, t: float) -> list[str]:
    args = (
        f"model_path='{cfg.model}', tokenizer_path='{cfg.model}', tokenizer_mode='auto', trust_remote_code=False, "
        f"dtype='auto', kv_cache_dtype='auto', tp_size={cfg.tp}, pp_size=1, dp_size={cfg.dp}, "
        f"chunked_prefill_size={cfg.rank_chunk}, max_prefill_tokens=16384, schedule_policy='fcfs', page_size=1, "
        f"enable_mixed_chunk={cfg.mixed_chunk}, enable_dp_attention={cfg.dp_attention}, disable_radix_cache=False, "
        "cuda_graph_backend_prefill='breakable', disable_cuda_graph=False, enable_two_batch_overlap=False"
    )
    lines = [f"[{_stamp(t)}] server_args=ServerArgs({args})"]
    for d in range(cfg.ranks):
        lines.append(
            f"[{_stamp(t + 20)} {_tag(cfg, d)}] max_total_num_tokens=392920, chunked_prefill_size={cfg.rank_chunk}, "
            "max_prefill_tokens=16384, max_running_requests=4096, context_len=40960, available_gpu_mem=10.54 GB"
        )
    lines.append(f"[{_stamp(t + 21)}] The server is fired up and ready to roll!")
    return lines


def _batches(cfg: Configuration, rng: np.random.Generator, n: int, t0: float, sizes: Counter) -> list[str]:
    """n prefill batches over the replica's DP ranks, with decode and HTTP lines between,
    their forward tokens counted into `sizes`."""
    lines = []
    t = t0
    for i in range(n):
        d = i % cfg.ranks
        running = int(rng.integers(0, 48))
        saturated = rng.random() < 0.3
        budget = cfg.rank_chunk - (running if cfg.mixed_chunk else 0)
        if budget < 1:
            running, budget = 0, cfg.rank_chunk
        if saturated:
            new, cached, seqs = budget, 0, 1
        else:
            new = int(min(budget, max(1, rng.lognormal(6.3, 1.1))))
            cached = int(rng.integers(0, 4000)) if rng.random() < 0.5 else 0
            seqs = int(min(new, 1 + new // 700 + rng.integers(0, 3)))
        sizes[new + (running if cfg.mixed_chunk else 0)] += 1
        tag = _tag(cfg, d)
        lines.append(
            f"[{_stamp(t)} {tag}] Prefill batch, #new-seq: {seqs}, #new-token: {new}, #cached-token: {cached}, "
            f"token usage: 0.{i % 89:02d}, #running-req: {running}, #queue-req: {int(rng.integers(0, 6))}, "
            f"#pending-token: 0, cuda graph: True, input throughput (token/s): {new * 11.37:.2f}"
        )
        if i % 3 == 0:
            lines.append(
                f"[{_stamp(t)} {tag}] Decode batch, #running-req: {running + 1}, #token: {i * 37 % 390000}, "
                f"token usage: 0.{i % 83:02d}, cuda graph: True, gen throughput (token/s): {i % 4000 + 0.5:.2f}, #queue-req: 0"
            )
        if i % 4 == 0:
            lines.append(f'[{_stamp(t)}] INFO:     127.0.0.1:{40000 + i % 20000} - "POST /v1/completions HTTP/1.1" 200 OK')
        t += float(rng.uniform(0.2, 0.9))
    return lines


def write_fleet(
    folder: str | os.PathLike,
    configs: list[Configuration],
    *,
    batches: int = 300,
    pieces: int = 3,
    lost_start: set[tuple[int, int]] | None = None,
    seed: int = 0,
    repeat: int = 1,
) -> Truth:
    """Write the fleet's logs into `folder` (replica k of configuration c: `c{c}-r{k}.log`,
    cut into `pieces` rotated files) and return their truth. lost_start: (c, k) of
    replicas whose start-up lines are gone. repeat: each replica's batches written this many
    times over (a large fleet from a few drawn batches; the truth counts every copy)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    truth = Truth()
    for c, cfg in enumerate(configs):
        truth.sizes[c] = Counter()
        truth.files[c] = []
        truth.lost_start[c] = []
        for k in range(cfg.replicas):
            t0 = float(rng.uniform(0, 600))
            lost = (c, k) in (lost_start or set())
            start = [] if lost else _start_lines(cfg, t0)
            drawn = Counter()
            body = _batches(cfg, rng, batches, t0 + 30, drawn)
            for s, n in drawn.items():
                truth.sizes[c][s] += n * repeat
            # rotated pieces: the oldest (.N-1) opens with the start-up lines, the newest is NAME.log
            names = [f"c{c}-r{k}.log" + (f".{p}" if p else "") for p in range(pieces - 1, -1, -1)]
            cuts = np.linspace(0, len(body), pieces + 1).astype(int)
            for p, name in enumerate(names):
                text = "\n".join((start if p == 0 else []) + body[cuts[p] : cuts[p + 1]]) + "\n"
                with open(folder / name, "w") as fh:
                    for _ in range(repeat):
                        fh.write(text)
                        if p == 0 and start:  # the start-up lines once, the batches `repeat` times
                            text = "\n".join(body[cuts[p] : cuts[p + 1]]) + "\n"
                truth.bytes += (folder / name).stat().st_size
                truth.files[c].append(name)
                if lost or p > 0:
                    truth.lost_start[c].append(name)
        truth.files[c].sort()
        truth.lost_start[c].sort()
    return truth


def demo_fleet(folder: str | os.PathLike, **kw) -> tuple[list[Configuration], Truth]:
    """The fleet of the tests and benchmarks: two configurations, mixed chunk on one, DP
    attention on the other, rotated logs, one replica of each that lost its start."""
    configs = [
        Configuration("org/Model-8B", tp=1, chunk=4096, mixed_chunk=True, replicas=3),
        Configuration("org/Model-70B", tp=8, dp=8, dp_attention=True, chunk=16384, replicas=2),
    ]
    return configs, write_fleet(folder, configs, lost_start={(0, 2)}, **kw)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Write the demo fleet's logs into a folder and print its truth.")
    ap.add_argument("folder")
    ap.add_argument("--batches", type=int, default=300, help="prefill batches per replica")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1, help="each replica's batches written this many times")
    a = ap.parse_args()
    configs, truth = demo_fleet(a.folder, batches=a.batches, seed=a.seed, repeat=a.repeat)
    for c, cfg in enumerate(configs):
        print(f"configuration {c}: {cfg}; {sum(truth.sizes[c].values())} batches in {', '.join(truth.files[c])}")
    print(f"{truth.bytes:,} bytes")
