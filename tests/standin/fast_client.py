"""A small, fast benchmark client for bcgtune's bench tests (tests only): the subset of
`sglang.benchmark.serving`'s command line that bench uses, the same /generate streaming
protocol, and the same result-line keys. The real client takes ~8 s to import on a CPU
machine (transformers + torch), too slow for the dozens of runs a bench test makes; the
real one is exercised by the trace --live test.

Extra knob: FASTCLIENT_PID_FILE=path appends this process's pid (for the no-orphans test).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
import urllib.request


def one(base, words, max_new, out, lock):
    body = json.dumps(
        {"text": " ".join(words), "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True}, "stream": True}
    ).encode()
    req = urllib.request.Request(base + "/generate", data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft = None
    n = 0
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            for raw in resp:
                raw = raw.strip()
                if not raw.startswith(b"data: ") or raw == b"data: [DONE]":
                    continue
                d = json.loads(raw[6:])
                n = d["meta_info"]["completion_tokens"]
                if ttft is None:
                    ttft = time.perf_counter() - t0
    except Exception as exc:  # noqa: BLE001
        with lock:
            out.append({"ok": False, "error": str(exc)})
        return
    lat = time.perf_counter() - t0
    with lock:
        out.append({"ok": True, "ttft": ttft or lat, "lat": lat, "n": n, "in": len(words)})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url")
    p.add_argument("--backend", default="sglang")
    p.add_argument("--dataset-name", default="random-ids")
    p.add_argument("--random-input-len", type=int, default=64)
    p.add_argument("--random-output-len", type=int, default=8)
    p.add_argument("--random-range-ratio", type=float, default=0.5)
    p.add_argument("--num-prompts", type=int, default=10)
    p.add_argument("--max-concurrency", type=int, default=4)
    p.add_argument("--request-rate", default="inf")
    p.add_argument("--output-file")
    p.add_argument("--seed", type=int, default=1)
    a, _unknown = p.parse_known_args()
    pid_file = os.environ.get("FASTCLIENT_PID_FILE")
    if pid_file:
        with open(pid_file, "a") as fh:
            fh.write(f"{os.getpid()}\n")
    rng = random.Random(a.seed)
    todo = []
    for _ in range(a.num_prompts):
        n_in = rng.randint(max(1, int(a.random_input_len * a.random_range_ratio)), a.random_input_len)
        n_out = rng.randint(max(1, int(a.random_output_len * a.random_range_ratio)), a.random_output_len)
        todo.append(([f"w{rng.randrange(2000)}" for _ in range(n_in)], n_out))
    out, lock = [], threading.Lock()
    sem = threading.Semaphore(a.max_concurrency)
    threads = []
    t0 = time.perf_counter()

    def run(item):
        with sem:
            one(a.base_url, item[0], item[1], out, lock)

    for item in todo:
        t = threading.Thread(target=run, args=(item,))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    dur = time.perf_counter() - t0
    ok = [o for o in out if o["ok"]]
    if not ok:
        print(f"all requests failed: {out[0]['error'] if out else 'none sent'}", file=sys.stderr)
        sys.exit(1)
    tot_out = sum(o["n"] for o in ok)
    tpots = [(o["lat"] - o["ttft"]) / (o["n"] - 1) * 1000 for o in ok if o["n"] > 1]
    res = {
        "backend": a.backend,
        "dataset_name": a.dataset_name,
        "max_concurrency": a.max_concurrency,
        "duration": dur,
        "completed": len(ok),
        "total_input_tokens": sum(o["in"] for o in ok),
        "total_output_tokens": tot_out,
        "request_throughput": len(ok) / dur,
        "output_throughput": tot_out / dur,
        "mean_ttft_ms": statistics.mean(o["ttft"] for o in ok) * 1000,
        "median_ttft_ms": statistics.median(o["ttft"] for o in ok) * 1000,
        "mean_tpot_ms": statistics.mean(tpots) if tpots else 0.0,
        "median_tpot_ms": statistics.median(tpots) if tpots else 0.0,
    }
    print(f"completed {len(ok)}/{len(out)}; output throughput {res['output_throughput']:.1f} tok/s")
    with open(a.output_file, "a") as fh:
        fh.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
