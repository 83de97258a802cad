"""Inputs that made a simulation run away or contradict SGLang: each is refused before work
with one line naming its flag, or bounded. Also the layout a DP-attention simulation
records, which suggest-buckets prices as printed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest
from cli_helpers import HANG_S, assert_one_line_error, cli
from hypothesis import given, settings
from hypothesis import strategies as st

from bcgtune.core.sim import scheduler
from bcgtune.core.sim.workload import ARRIVAL_SPAN_MAX_S, RANDOM_IMAGES_MAX, Workload
from bcgtune.errors import InputError


def _refused(args: list[str], flag: str, words: str) -> None:
    r = cli(["trace", "--simulate", "-q", *args])
    assert r.code == 2, (r.code, r.err)
    assert_one_line_error(r)
    assert f"({flag})" in r.err and words in r.err, r.err


# ---- runaways ----------------------------------------------------------------------------
def test_tiny_request_rate_is_refused_before_work():
    _refused(["--request-rate", "1e-100", "--num-prompts", "5"], "--request-rate", "give at least 5e-08 requests/s")


def test_request_rate_bound_is_the_arrival_span():
    n = 1000
    at_bound = Workload(num_prompts=[n], request_rate=n / ARRIVAL_SPAN_MAX_S)
    assert at_bound.validate() is at_bound
    with pytest.raises(InputError) as exc:
        Workload(num_prompts=[10, n], max_concurrency=[1, 2], request_rate=n / ARRIVAL_SPAN_MAX_S / 1.01).validate()
    assert exc.value.field == "request_rate"


def test_too_many_random_image_sizes_are_refused():
    _refused(
        [
            "--dataset-name",
            "image",
            "--image-resolution",
            "random:256x256-1024x1024",
            "--image-count",
            "1000",
            "--num-prompts",
            str(RANDOM_IMAGES_MAX // 1000 + 1),
        ],
        "--image-count",
        "random image sizes to draw",
    )
    # a fixed resolution draws nothing: the same counts are fine to validate
    Workload(dataset_name="image", image_count=1000, num_prompts=[RANDOM_IMAGES_MAX // 1000 + 1]).validate()


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--num-prompts", "4,,8", "--max-concurrency", "1,2"], "--num-prompts"),
        (["--max-concurrency", "4,,8"], "--max-concurrency"),
        (["--max-concurrency", "4,"], "--max-concurrency"),
        (["--max-concurrency", ""], "--max-concurrency"),
        (["--buckets", ""], "--buckets"),
    ],
)
def test_empty_values_and_items_are_refused(args, flag):
    r = cli(["trace", "--simulate", "-q", *args])
    assert r.code == 2 and flag in r.err, r.err
    assert_one_line_error(r)


@pytest.mark.parametrize("opt", ["--workload", "--calibration"])
def test_empty_file_names_are_refused_not_ignored(opt):
    r = cli(["trace", "--simulate", "-q", opt, ""])
    assert r.code == 2, r.err
    assert_one_line_error(r)


def _stepped(horizon: float, a: float, b: float, cap: int) -> int:
    """The definition: 1 + the steps j >= 1 that start before the horizon, at most cap."""
    if horizon <= 0:
        return 1
    j = 0
    while j < cap and a * (j + 1) + b * (j + 1) * j / 2.0 < horizon:
        j += 1
    return min(cap, j + 1)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    horizon=st.floats(min_value=-1.0, max_value=1e6, allow_nan=False),
    a=st.one_of(st.floats(min_value=1e-300, max_value=1e3), st.sampled_from([1e-300, 5.6e-3])),
    b=st.one_of(st.just(0.0), st.floats(min_value=1e-300, max_value=1e3), st.sampled_from([1e-300, 3e-8])),
    cap=st.integers(min_value=1, max_value=2000),
)
def test_decode_steps_before_is_the_stepped_count(horizon, a, b, cap):
    assert scheduler.decode_steps_before(horizon, a, b, cap) == _stepped(horizon, a, b, cap)


def test_decode_steps_before_is_bounded_for_extreme_step_times():
    # a decode step of 1e-300 s before an event a day away: the count is capped, not stepped
    assert scheduler.decode_steps_before(86_400.0, 1e-300, 0.0, 2**31) == 2**31
    assert scheduler.decode_steps_before(86_400.0, 1e-300, 1e-300, 7) == 7
    assert scheduler.decode_steps_before(1e-299, 1e-300, 0.0, 2**31) == 10


def test_extreme_step_times_simulate_in_bounded_time():
    """A workload whose decode steps take 1e-300 ms once looped forever between arrivals."""
    code = textwrap.dedent(
        """
        from dataclasses import replace
        from bcgtune.adapters.bench_serving.simulator import simulate
        from bcgtune.core.sim.workload import StepTimeModel, Workload
        for kw in (dict(decode_base_ms=1e-300, decode_per_row_ms=0.0, decode_per_ctx_token_ms=0.0),
                   dict(decode_base_ms=1e-300, decode_per_row_ms=0.0, decode_per_ctx_token_ms=1e-300)):
            w = Workload(num_prompts=[50], random_output_len=100000, request_rate=1.0,
                         step=replace(StepTimeModel(), **kw))
            print(simulate(w).n_batches)
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [int(x) for x in r.stdout.split()] == [51, 51]


# ---- DP attention: the layout SGLang accepts -----------------------------------------------
def test_dp_attention_records_the_tensor_parallel_size_sglang_needs(tmp_path):
    """The README's `trace --simulate --dp-size 4 --enable-dp-attention` records tp 4 (SGLang
    refuses tp 1 with 4 attention-DP ranks), and suggest-buckets prices the trace as that
    launch; the layout it prints runs as printed."""
    t = tmp_path / "t.json"
    r = cli(["trace", "--simulate", "--dp-size", "4", "--enable-dp-attention", "--num-prompts", "40", "-q", "-o", t])
    assert r.code == 0, r.err
    wl = json.loads(t.read_text())["meta"]["workload"]
    assert (wl["tp_size"], wl["dp_size"], wl["enable_dp_attention"]) == (4, 4, True)
    r = cli(["suggest-buckets", t])
    assert r.code == 0, r.err
    assert "priced as the launch --tp 4 --dp 4 --dp-attention" in r.err
    hinted = cli(["suggest-buckets", t, "--tp", "4", "--dp", "4", "--dp-attention", "--json"])
    plain = cli(["suggest-buckets", t, "--json"])
    assert hinted.code == 0, hinted.err
    assert json.loads(hinted.out)["recommended"] == json.loads(plain.out)["recommended"]


def test_tensor_parallel_size_is_resolved_and_checked():
    assert Workload().resolved_tp_size == 1
    assert Workload(dp_size=4).resolved_tp_size == 1  # replicas: no attention groups
    assert Workload(dp_size=4, enable_dp_attention=True).resolved_tp_size == 4
    assert Workload(dp_size=4, enable_dp_attention=True, tp_size=8).validate().resolved_tp_size == 8
    with pytest.raises(InputError) as exc:
        Workload(dp_size=4, enable_dp_attention=True, tp_size=2).validate()
    assert exc.value.field == "tp_size" and "use tp_size 4" in exc.value.what
    assert replace(Workload(dp_size=4, enable_dp_attention=True), tp_size=6).to_dict()["tp_size"] == 6


def test_a_wrong_tensor_parallel_size_names_the_flag_and_the_file(tmp_path):
    _refused(["--dp-size", "4", "--enable-dp-attention", "--tp-size", "2"], "--tp-size", "use tp_size 4")
    # the shipped preset runs tp 2: with DP attention over 4 ranks the fix is the flag
    _refused(["--workload", "mi355x-multimodal-pr", "--dp-size", "4", "--enable-dp-attention"], "--tp-size", "use tp_size 4")
    w = tmp_path / "w.toml"
    w.write_text("[server]\ndp_size = 4\nenable_dp_attention = true\ntp_size = 3\n")
    r = cli(["trace", "--simulate", "-q", "--workload", w])
    assert r.code == 2 and "[server].tp_size" in r.err and "use tp_size 4" in r.err, r.err
