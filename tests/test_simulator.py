"""Simulator: one test per scheduler rule, conservation, client concurrency, determinism,
replay shares and the typed summary, the default workload, progress, bounds on hostile
workloads, Ctrl-C, and the CLI's error path. (Speed lives in benchmarks/simulate_speed.py.)"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
from dataclasses import replace

import numpy as np
import pytest
from cli_helpers import HANG_S
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bcgtune.adapters.bench_serving import simulator
from bcgtune.adapters.bench_serving.simulator import simulate
from bcgtune.core import schema
from bcgtune.core.sglang.ladder import sglang_default_ladder
from bcgtune.core.sim import scheduler
from bcgtune.core.sim.summary import (
    LevelSummary,
    ReplayShare,
    SimulationSummary,
    replay_shares,
    simulation_summary,
)
from bcgtune.core.sim.workload import StepTimeModel, Workload
from bcgtune.core.trace.prefill_trace import PrefillTrace
from bcgtune.errors import InputError
from bcgtune.files.workload_file import default_workload
from bcgtune.services.suggest import default_trace


def fixed(n=3, L=1000, out=4, conc=1, **kw) -> Workload:
    """Every prompt exactly L tokens (range ratio 1), no warm-up."""
    base = {
        "dataset_name": "random",
        "num_prompts": [n],
        "random_input_len": L,
        "random_output_len": out,
        "random_range_ratio": 1.0,
        "max_concurrency": [conc],
        "warmup_requests": 0,
        "disable_radix_cache": True,
    }
    base.update(kw)
    return Workload(**base)


def cols(tr: PrefillTrace, name: str) -> list:
    return tr.batches[name].tolist()


def test_chunk_cut_and_continuation_one_request():
    tr = simulate(fixed(n=3, L=1000, conc=1, chunked_prefill_size=256))
    assert cols(tr, "forward_tokens") == [256, 256, 256, 232] * 3
    assert set(cols(tr, "new_seq")) == {1}


def test_cut_request_ends_the_batch_and_continues_first():
    tr = simulate(fixed(n=3, L=1000, conc=3, chunked_prefill_size=1500))
    fwd, seqs = cols(tr, "forward_tokens"), cols(tr, "new_seq")
    # A whole + B cut to the remaining 500 (C waits); then B's 500 first, then C whole.
    assert fwd[:2] == [1500, 1500] and seqs[:2] == [2, 2]
    assert sum(cols(tr, "new_token")) == 3000


def test_cut_is_page_floored_with_radix_cache():
    tr = simulate(fixed(n=2, L=1000, conc=2, chunked_prefill_size=1500, page_size=16, disable_radix_cache=False))
    # A is charged 1008 (page-rounded); B gets floor(492 / 16) * 16 = 480.
    assert cols(tr, "forward_tokens")[:2] == [1480, 520]


def test_continuing_chunk_goes_before_fcfs():
    tr = simulate(fixed(n=2, L=3000, conc=2, chunked_prefill_size=2048))
    # A: 2048, then A's 952 + B cut to 1096, then B's 1904.
    assert cols(tr, "forward_tokens")[:3] == [2048, 2048, 1904]
    assert cols(tr, "new_seq")[:3] == [1, 2, 1]


def test_max_prefill_tokens_stops_admission():
    tr = simulate(fixed(n=4, L=600, conc=4, chunked_prefill_size=8192, max_prefill_tokens=1000))
    # budget 1000: A (600) fits, leaves 400 > 0 so B is admitted whole (SGLang checks the
    # budget before a request, then charges it); then the budget is spent.
    assert cols(tr, "forward_tokens")[:2] == [1200, 1200]


def test_running_requests_never_exceed_the_cap():
    tr = simulate(fixed(n=40, L=100, out=50, conc=40, max_running_requests=8, chunked_prefill_size=4096))
    run, new = np.array(cols(tr, "running_req")), np.array(cols(tr, "new_seq"))
    assert (run + new).max() <= 8
    assert new[0] == 8  # the first batch fills the cap


def test_prefill_decode_interval_spaces_prefills():
    base = fixed(n=12, L=100, out=40, conc=12, max_running_requests=4, chunked_prefill_size=4096)
    a = simulate(base)
    b = simulate(replace(base, prefill_decode_interval=5))
    assert b.meta["levels"][0]["duration_s"] >= a.meta["levels"][0]["duration_s"]
    assert sum(cols(b, "new_token")) == sum(cols(a, "new_token")) == 1200


def test_mixed_chunk_adds_decode_rows_and_shrinks_the_budget():
    w = fixed(n=20, L=500, out=30, conc=20, chunked_prefill_size=1024, max_running_requests=64, enable_mixed_chunk=True)
    tr = simulate(w)
    fwd, new, run = (np.array(cols(tr, c)) for c in ("forward_tokens", "new_token", "running_req"))
    assert (fwd == new + run).all()
    assert fwd.max() <= 1024
    assert (run > 0).any()
    assert sum(new) == 20 * 500


def test_kv_room_limits_admission():
    w = fixed(n=10, L=1000, out=100, conc=10, chunked_prefill_size=8192, max_total_tokens=3500)
    tr = simulate(w)
    run, new = np.array(cols(tr, "running_req")), np.array(cols(tr, "new_seq"))
    assert (run + new).max() <= 3  # each request needs 1000 + 100 + 1 page
    assert sum(cols(tr, "new_token")) == 10000


def test_dp_ranks_round_robin():
    w = fixed(n=8, L=300, out=5, conc=8, dp_size=2, chunked_prefill_size=4096)
    tr = simulate(w)
    assert tr.meta["ranks"] == ["DP0", "DP1"]
    ranks = np.array(cols(tr, "rank"))
    assert set(ranks.tolist()) == {0, 1}
    assert sum(np.array(cols(tr, "new_token"))[ranks == 0]) == 4 * 300


workloads = st.builds(
    lambda n, L, out, r, conc, chunk, maxrun, mixed, page, radix, rate, seed, pdi, img: Workload(
        dataset_name="image" if img else "random",
        num_prompts=[n],
        random_input_len=L,
        random_output_len=out,
        random_range_ratio=r,
        max_concurrency=conc,
        chunked_prefill_size=chunk,
        max_running_requests=maxrun,
        enable_mixed_chunk=mixed,
        page_size=page,
        disable_radix_cache=radix,
        request_rate=rate,
        seed=seed,
        prefill_decode_interval=pdi,
        image_resolution="random:64x64-700x900",
        model_family="qwen2-vl",
    ),
    n=st.integers(1, 40),
    L=st.integers(1, 3000),
    out=st.integers(1, 60),
    r=st.floats(0, 1),
    conc=st.lists(st.integers(1, 32), min_size=1, max_size=3),
    chunk=st.integers(64, 4096),
    maxrun=st.integers(1, 48),
    mixed=st.booleans(),
    page=st.sampled_from([1, 16, 64]),
    radix=st.booleans(),
    rate=st.sampled_from([float("inf"), 5.0, 200.0]),
    seed=st.integers(0, 1000),
    pdi=st.integers(0, 3),
    img=st.booleans(),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads)
def test_scheduler_invariants(w):
    tr = simulate(w)
    b = {k: np.asarray(v) for k, v in tr.batches.items()}
    chunk = w.resolved_chunked_prefill_size
    # no batch above the chunk budget (mixed rows come out of the same budget)
    if w.max_running_requests < chunk:
        assert b["forward_tokens"].max() <= chunk
    # running requests (with the batch's new ones) never above the cap
    assert (b["running_req"] + b["new_seq"]).max() <= w.max_running_requests
    # total prefill tokens equal the requests' input tokens, level by level
    for lv in tr.meta["levels"]:
        s, e = lv["batches"]
        assert b["new_token"][s:e].sum() == lv["input_tokens"] + lv["warmup_input_tokens"]
        # closed loop or not: never more than C requests in flight
        assert lv["max_in_flight"] <= lv["max_concurrency"]
        if w.request_rate == float("inf"):
            assert lv["max_in_flight"] == min(lv["max_concurrency"], lv["num_prompts"])
    assert (np.diff(b["time_s"]) >= 0).all() or w.dp_size > 1
    assert set(b["images"].tolist()) <= ({1} if w.dataset_name == "image" else {0})


def test_deterministic_for_a_seed():
    w = replace(default_workload(), max_concurrency=[16], num_prompts=[200])
    a, b = simulate(w), simulate(w)
    for k in a.batches:
        assert np.array_equal(a.batches[k], b.batches[k])
    c = simulate(replace(w, seed=7))
    assert not np.array_equal(a.batches["forward_tokens"], c.batches["forward_tokens"])


def test_poisson_arrivals_are_seeded():
    w = fixed(n=100, L=200, out=20, conc=64, request_rate=50.0, random_range_ratio=0.5, seed=3)
    assert np.array_equal(simulate(w).batches["time_s"], simulate(w).batches["time_s"])


def test_step_time_calibration_callable():
    w = fixed(n=20, L=700, out=20, conc=8, chunked_prefill_size=4096)
    slow = simulate(replace(w, step=replace(w.step, prefill_curve=lambda n: 500.0 + 0.0 * n)))
    fast = simulate(w)
    assert slow.meta["levels"][0]["duration_s"] > fast.meta["levels"][0]["duration_s"]
    assert slow.meta["workload"]["step"]["prefill_curve"] == "<lambda>"


def test_replay_shares_patched_vs_unpatched():
    tr = PrefillTrace.from_batches({"forward_tokens": [100, 300, 3, 1000], "images": [1, 0, 0, 1]})
    s = replay_shares(tr, [128, 256, 512, 1024])
    # 100->128 ok, 300->512 ok, 3->128 eager (pad > 2x), 1000->1024 ok
    assert s.patched_replay_batches == 3 and s.unpatched_replay_batches == 1
    assert s.image_share == 0.5 and s.images_known and s.buckets == 4 and s.list is None


def test_default_workload_trace_is_all_image():
    tr = default_trace()
    assert tr.meta["workload"]["name"] == "mi355x-multimodal-pr"
    assert tr.origin == "simulation" and tr.n_batches > 500
    assert tr.batches["images"].min() == 1
    assert tr.batches["forward_tokens"].max() <= 16384
    assert [lv["max_concurrency"] for lv in tr.meta["levels"]] == [4, 16, 32, 64, 128]
    s = replay_shares(tr, sglang_default_ladder(16384))
    assert s.unpatched_replay_share == 0.0 and s.patched_replay_share > 0.9


def test_hundred_thousand_requests():
    w = replace(default_workload(), max_concurrency=[128], num_prompts=[100_000])
    tr = simulate(w)
    lv = tr.meta["levels"][0]
    assert lv["num_prompts"] == 100_000 and lv["max_in_flight"] == 128
    assert tr.batches["new_token"].sum() == lv["input_tokens"] + lv["warmup_input_tokens"]


def test_cli_bad_range_ratio_is_one_line_exit_2():
    p = subprocess.run(
        [sys.executable, "-m", "bcgtune", "trace", "--simulate", "--random-range-ratio", "1.5"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        check=False,
    )
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    # the library names the field; the CLI may turn it into the flag
    assert len(lines) == 1 and lines[0].startswith("error: ") and re.search(r"random[-_]range[-_]ratio", lines[0])
    assert "Traceback" not in p.stderr


# ---- the typed summary ------------------------------------------------------------------------
def test_simulation_summary_is_typed_and_keeps_the_json_keys():
    w = fixed(n=30, L=700, out=8, conc=4, chunked_prefill_size=2048, max_concurrency=[2, 8])
    s = simulation_summary(simulate(w), [256, 512, 1024])
    assert isinstance(s, SimulationSummary) and s.workload is None
    assert all(isinstance(r, ReplayShare) for r in s.replay) and all(isinstance(lv, LevelSummary) for lv in s.levels)
    assert [r.list for r in s.replay] == ["sglang default ladder (max 2048)", "--buckets"]
    assert s.replay[1].buckets == 3 and [lv.max_concurrency for lv in s.levels] == [2, 8]
    d = s.to_dict()
    assert list(d) == ["workload", "replay", "levels"]
    assert list(d["replay"][0]) == [
        "list",
        "buckets",
        "batches",
        "image_batches",
        "image_share",
        "images_known",
        "patched_replay_batches",
        "unpatched_replay_batches",
        "patched_replay_share",
        "unpatched_replay_share",
    ]
    assert list(d["levels"][0]) == [
        "max_concurrency",
        "num_prompts",
        "batches",
        "image_batches",
        "mean_forward_tokens",
        "max_forward_tokens",
        "decode_steps",
        "duration_s",
    ]
    assert json.loads(json.dumps(d)) == d
    assert sum(lv.batches for lv in s.levels) == s.replay[0].batches


def test_summary_of_a_trace_without_workload_uses_the_default_ladder():
    s = simulation_summary(PrefillTrace.from_sizes([100, 300, 5000]))
    assert s.workload is None and s.levels == []
    assert s.replay[0].list == "sglang default ladder (max 8192)" and s.replay[0].batches == 3


# ---- one rule, one home -------------------------------------------------------------------------
def test_prefill_table_and_per_batch_times_come_from_one_polynomial():
    m = StepTimeModel()
    sizes = np.array([0, 1, 300, 512, 8192, 300_000])
    table = m.prefill_table(8192)
    assert [table[n] for n in sizes[:-1]] == (m.prefill_ms(sizes[:-1]) / 1000.0).tolist()
    assert m.prefill_ms([300]).tolist() == [max(9.5, 0.99 + 0.02623 * 300 + 6.85e-7 * 300 * 300)]
    with pytest.raises(InputError, match="prefill time curve"):
        replace(m, prefill_curve=lambda n: -1.0 + 0 * n).prefill_ms(sizes)


def test_sizes_beyond_the_table_are_timed_by_the_same_rule(monkeypatch):
    w = fixed(n=40, L=900, out=30, conc=8, chunked_prefill_size=4096, enable_mixed_chunk=True, max_running_requests=16)
    whole = simulate(w)
    monkeypatch.setattr(simulator, "PREFILL_TABLE_MAX", 64)
    cut = simulate(w)
    for k in whole.batches:
        assert np.array_equal(whole.batches[k], cut.batches[k])
    assert whole.meta["levels"] == cut.meta["levels"]


# ---- progress, Ctrl-C, bounds -----------------------------------------------------------------
def test_progress_reports_requests_done_and_changes_nothing():
    w = replace(default_workload(), max_concurrency=[16, 64], num_prompts=[150, 600], warmup_requests=2)
    calls = []
    tr = simulate(w, progress=lambda done, total: calls.append((done, total)))
    total = 150 + 600 + 2 * 2
    assert calls[0] == (0, total) and calls[-1] == (total, total)
    done = [d for d, _ in calls]
    assert done == sorted(set(done)) and {t for _, t in calls} == {total}
    assert len(calls) <= scheduler.PROGRESS_STEPS + 2
    plain = simulate(w)
    for k in tr.batches:
        assert np.array_equal(tr.batches[k], plain.batches[k])


def test_request_count_above_the_limit_is_refused_before_allocating():
    w = replace(default_workload(), max_concurrency=[64], num_prompts=[schema.REQUESTS_MAX], warmup_requests=1)
    tracemalloc.start()
    try:
        with pytest.raises(InputError) as e:
            simulate(w)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert e.value.field == "num_prompts" and "10,000,000" in str(e.value)
    assert peak < 5 << 20  # nothing per request was built


def test_workload_needing_too_many_batches_is_refused_before_simulating():
    w = fixed(n=10_000, L=2**31 - 1, out=1, conc=64, chunked_prefill_size=8192, max_prefill_tokens=8192)
    with pytest.raises(InputError, match="prefill batches"):
        simulate(w)


@pytest.mark.parametrize(
    "change,field",
    [
        ({"seed": -1}, "seed"),
        ({"seed": 2**32}, "seed"),
        ({"random_input_len": 2**31}, "random_input_len"),
        ({"num_prompts": [0]}, "num_prompts"),
        ({"dp_size": 10**9}, "dp_size"),
        ({"request_rate": float("nan")}, "request_rate"),
        ({"step": StepTimeModel(decode_base_ms=-5.6)}, "decode_base_ms"),
        ({"step": StepTimeModel(decode_base_ms=0.0)}, "decode_base_ms"),
        ({"step": StepTimeModel(prefill_c1_ms=float("nan"))}, "prefill_c1_ms"),
        ({"step": StepTimeModel(client_rtt_ms=float("inf"))}, "client_rtt_ms"),
        ({"step": StepTimeModel(level_gap_s=-1.0)}, "level_gap_s"),
    ],
)
def test_a_workload_built_in_python_is_checked_too(change, field):
    with pytest.raises(InputError) as e:
        simulate(replace(fixed(n=2, L=100), **change))
    assert e.value.field == field and "\n" not in str(e.value)


_CTRL_C_CHILD = textwrap.dedent(
    """
    import os, sys, time
    from dataclasses import replace
    from bcgtune.adapters.bench_serving.simulator import simulate
    from bcgtune.files.workload_file import default_workload

    w = replace(default_workload(), max_concurrency=[128], num_prompts=[3_000_000])

    started = []

    def progress(done, total):
        if done and not started:
            started.append(done)
            print("running", flush=True)

    try:
        simulate(w, progress=progress)
    except KeyboardInterrupt:
        print(f"interrupted {time.time():.6f}", flush=True)
        os._exit(130)
    print("finished", flush=True)
    """
)


def test_three_million_requests_stop_on_ctrl_c():
    p = subprocess.Popen([sys.executable, "-c", _CTRL_C_CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "running"  # past the sampling, inside the event loop
        time.sleep(0.3)
        sent = time.time()
        p.send_signal(signal.SIGINT)
        line = p.stdout.readline().split()
        assert p.wait(timeout=HANG_S) == 130
    finally:
        if p.poll() is None:
            p.kill()
    assert line[0] == "interrupted" and float(line[1]) >= sent  # stopped by the signal, before finishing
