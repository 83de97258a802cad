"""The simulator's output is pinned: for a set of workloads covering every scheduler path
(chunk cuts exact and page-floored, mixed chunk, DP attention, prefill-decode interval,
KV room, Poisson arrivals, warm-up, one-token outputs, random image sizes, chunked prefill
off, decode time without a context term, a calibration curve), every per-batch column, the per-level metadata and the
histogram equal the reference in tests/data/simulator_reference.json.

The reference was written by this file (`python tests/test_simulator_identity.py`) from
the event-loop simulator as it stood before its scheduler became a class; regenerate it
only when a scheduler rule changes on purpose, and say which in the commit.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(ROOT))

from bcgtune.adapters.bench_serving.simulator import simulate
from bcgtune.core.sim.workload import Workload
from bcgtune.files.workload_file import default_workload, load_workload_file

REFERENCE = Path(__file__).resolve().parent / "data" / "simulator_reference.json"
LEVEL_KEYS = (
    "max_concurrency",
    "num_prompts",
    "batches",
    "warmup_batches",
    "decode_steps",
    "input_tokens",
    "warmup_input_tokens",
    "output_tokens",
    "max_in_flight",
    "start_s",
    "duration_s",
    "output_throughput_tok_s",
)


def _calibrated_ms(n):
    n = np.asarray(n, dtype=np.float64)
    return 4.0 + 0.031 * n + 2e-7 * n * n


def cases() -> dict[str, Workload]:
    base = default_workload()
    return {
        "default": base,
        "chat-text-h200": load_workload_file("chat-text-h200"),
        "image-mixed-dp-attention-pdi": replace(
            base,
            num_prompts=[300, 600],
            max_concurrency=[32, 128],
            enable_mixed_chunk=True,
            dp_size=2,
            enable_dp_attention=True,
            prefill_decode_interval=2,
            chunked_prefill_size=4096,
        ),
        "poisson-kv-page-radix": Workload(
            dataset_name="random",
            num_prompts=[800],
            random_input_len=3000,
            random_output_len=200,
            random_range_ratio=0.3,
            request_rate=60.0,
            max_concurrency=[96],
            max_running_requests=48,
            chunked_prefill_size=2048,
            page_size=16,
            disable_radix_cache=False,
            max_total_tokens=60_000,
            warmup_requests=0,
            seed=11,
        ),
        "random-images-warmup-one-token": Workload(
            dataset_name="image",
            image_resolution="random:64x64-900x1400",
            model_family="qwen2-vl",
            image_count=2,
            num_prompts=[400],
            random_input_len=500,
            random_output_len=1,
            random_range_ratio=0.0,
            max_concurrency=[24],
            warmup_requests=3,
            chunked_prefill_size=1536,
            max_prefill_tokens=3000,
            seed=5,
        ),
        "no-chunking-unbounded": Workload(
            dataset_name="random-ids",
            num_prompts=[300],
            random_input_len=6000,
            random_output_len=40,
            random_range_ratio=0.5,
            chunked_prefill_size=-1,
            max_prefill_tokens=20_000,
            warmup_requests=2,
            seed=3,
            step=replace(Workload().step, decode_per_ctx_token_ms=0.0),
        ),
        "mixed-dp-poisson-calibrated": Workload(
            dataset_name="random",
            num_prompts=[500],
            random_input_len=1200,
            random_output_len=90,
            random_range_ratio=0.6,
            request_rate=120.0,
            max_concurrency=[64],
            enable_mixed_chunk=True,
            dp_size=3,
            max_running_requests=40,
            chunked_prefill_size=1024,
            page_size=4,
            prefill_decode_interval=1,
            step=replace(Workload().step, prefill_curve=_calibrated_ms),
            seed=9,
        ),
    }


def fingerprint(tr) -> dict:
    """What must not change: per-column digests (dtype and bytes), the histogram, the levels."""
    cols = {
        name: hashlib.sha256(str(arr.dtype).encode() + np.ascontiguousarray(arr).tobytes()).hexdigest()
        for name, arr in sorted(tr.batches.items())
    }
    return {
        "batches": tr.n_batches,
        "columns": cols,
        "histogram": {"sizes": tr.sizes.tolist(), "counts": tr.counts.tolist()},
        "levels": [{k: lv[k] for k in LEVEL_KEYS} for lv in tr.meta["levels"]],
        "decode_steps": tr.meta["decode_steps"],
        "ranks": tr.meta.get("ranks"),
    }


def _reference() -> dict:
    return json.loads(REFERENCE.read_text())


@pytest.mark.parametrize("name", list(cases()))
def test_simulation_matches_the_reference(name):
    expected = _reference()["cases"][name]
    got = json.loads(json.dumps(fingerprint(simulate(cases()[name]))))
    assert got["histogram"] == expected["histogram"]
    assert got["levels"] == expected["levels"]
    assert got == expected


def test_reference_covers_every_case():
    assert set(_reference()["cases"]) == set(cases())


if __name__ == "__main__":
    out = {
        "about": "Fingerprints of simulate() per workload in tests/test_simulator_identity.py; written by that file.",
        "cases": {name: fingerprint(simulate(w)) for name, w in cases().items()},
    }
    REFERENCE.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {REFERENCE} ({len(out['cases'])} cases)")
