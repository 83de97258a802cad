"""An all-reduce curve measured on this host, for `--all-reduce-curve`: one process per rank
(NCCL on GPUs, gloo on the CPU), each size all-reduced in place `--repeats` times after a
warm-up, the median per call in microseconds; rank 0 writes {"bytes": [...], "us": [...]}.

    python benchmarks/allreduce_curve.py --ranks 4 -o ar_tp4.json          # 4 GPUs
    python benchmarks/allreduce_curve.py --ranks 2 --device cpu -o ar.json  # gloo, a dry run

The sizes are a rank's [tokens, hidden] bf16 hidden states from 1 to 16,384 tokens at hidden
2048 (Qwen3-30B-A3B) by default. torch.distributed's all_reduce is NCCL's, not SGLang's own
custom all-reduce for small messages, so small sizes may measure slower than SGLang runs
them: the curve says what it measured."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _rank(rank: int, args: argparse.Namespace, rendezvous: str) -> None:
    import torch
    import torch.distributed as dist

    from bcgtune.services.ranks import die_with_parent

    die_with_parent()
    gpu = args.device == "cuda"
    if gpu:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if gpu else "gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=args.ranks)
    device = torch.device("cuda", rank) if gpu else torch.device("cpu")
    dtype = torch.bfloat16 if gpu else torch.float32
    out = {"bytes": [], "us": []}
    tokens = 1
    while tokens <= args.max_tokens:
        x = torch.ones(tokens, args.hidden, dtype=dtype, device=device)
        times = []
        for i in range(args.warmup + args.repeats):
            if gpu:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            if gpu:
                torch.cuda.synchronize()
            if i >= args.warmup:
                times.append((time.perf_counter() - t0) * 1e6)
        out["bytes"].append(x.numel() * x.element_size())
        out["us"].append(round(statistics.median(times), 3))
        tokens *= 2
    if rank == 0:
        with open(args.out + ".tmp", "w") as fh:
            json.dump(out, fh)
        os.replace(args.out + ".tmp", args.out)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--max-tokens", type=int, default=16384)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args(argv)
    if args.ranks < 2:
        print("error: an all-reduce needs 2 ranks or more (--ranks)", file=sys.stderr)
        return 2
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="bcgtune-ar-") as tmp:
        mp.spawn(_rank, args=(args, os.path.join(tmp, "rendezvous")), nprocs=args.ranks, join=True)
    with open(args.out) as fh:
        curve = json.load(fh)
    for b, us in zip(curve["bytes"], curve["us"]):
        print(f"{b:>12,} bytes  {us:>10.1f} us")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
