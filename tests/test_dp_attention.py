"""DP attention end to end: records grouped into steps (logs and simulations), the lockstep
simulator, and suggest-buckets / trace --simulate / the Python API pricing steps."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import assert_one_line_error, cli
from hypothesis import given, settings
from hypothesis import strategies as st

import bcgtune
from bcgtune.adapters.bench_serving.simulator import simulate
from bcgtune.adapters.sglang.log import parse_logs
from bcgtune.core.plan.dp_steps import evaluate_steps
from bcgtune.core.plan.step_grouping import RULE_ITERATION, RULE_MS, RULE_SECONDS, RULE_SIMULATED, dp_index, group_steps
from bcgtune.core.sim.scheduler_lockstep import lockstep_decode
from bcgtune.core.sim.workload import Workload
from bcgtune.core.trace.prefill_trace import PrefillTrace
from bcgtune.errors import InputError
from bcgtune.files.trace_file import load_trace, save_trace

LOGS = Path(__file__).resolve().parent / "data" / "logs"


def _trace(**cols):
    tags = cols.pop("tags", ["DP0 TP0", "DP1 TP1", "DP2 TP2"])
    return PrefillTrace.from_batches(cols, origin="sglang-log", meta={"ranks": tags})


def _votes(g):
    s = g.steps
    return sorted(sorted(s.tokens[a:b].tolist()) for a, b in zip(s.offsets[:-1], s.offsets[1:]))


# ---- grouping -------------------------------------------------------------------------
def test_dp_index_reads_sglang_prefixes():
    assert dp_index("DP3 TP3") == 3 and dp_index("DP12 PP1 TP0 EP0") == 12
    assert dp_index("TP0") is None and dp_index("MOE_DP1 TP1") is None and dp_index(None) is None


def test_iteration_counters_group_exactly_and_restarts_start_new_epochs():
    t = _trace(
        forward_tokens=[100, 30, 50, 900, 20, 400, 7, 9],
        rank=[0, 1, 0, 0, 1, 2, 0, 1],
        forward_iter=[5, 5, 9, 12, 12, 12, 5, 5],
        timestamp=[1.0] * 8,
    )
    g = group_steps(t, 4)
    assert g.rule == RULE_ITERATION and g.ungrouped == 0
    # the counter went back to 5 on both ranks (a restart): a step of its own, not step 5's
    assert _votes(g) == [[7, 9], [20, 400, 900], [30, 100], [50]]


def test_millisecond_stamps_cluster_and_split_on_a_repeated_rank():
    t = _trace(
        forward_tokens=[100, 30, 50, 900, 20, 400], rank=[0, 1, 0, 0, 1, 2], timestamp=[1.001, 1.003, 1.5, 2.0, 2.004, 2.002]
    )
    g = group_steps(t, 3)
    assert g.rule == RULE_MS and g.ungrouped == 0
    assert _votes(g) == [[20, 400, 900], [30, 100], [50]]
    # ranks 4 ms apart with a 1 ms tolerance: separate steps
    assert len(_votes(group_steps(t, 3, tolerance_s=0.001))) == 6


def test_second_stamps_group_only_seconds_without_repeats():
    t = _trace(forward_tokens=[100, 30, 50, 900, 20, 400], rank=[0, 1, 0, 0, 1, 2], timestamp=[1.0, 1.0, 1.0, 3.0, 3.0, 3.0])
    g = group_steps(t, 3)
    assert g.rule == RULE_SECONDS
    assert g.ungrouped == 3  # DP0 printed twice in second 1
    assert _votes(g) == [[20, 400, 900], [30], [50], [100]]


def test_real_log_of_two_dp_ranks_in_one_second_is_one_step():
    trace = parse_logs([str(LOGS / "e7_dp_attention_two_ranks.log")])
    assert trace.meta["ranks"] == ["DP0 TP0", "DP1 TP0"]
    g = group_steps(trace, 2)
    assert g.rule == RULE_SECONDS and g.ungrouped == 0 and _votes(g) == [[14208, 14208]]
    m = evaluate_steps(g.steps, [14208])
    assert (m.batches, m.eager_batches, m.padded_tokens) == (1, 0, 0)
    assert group_steps(trace, 8).steps.ranks == 8  # six more ranks, idle: they pad the bucket
    assert evaluate_steps(group_steps(trace, 8).steps, [14208]).padded_tokens == 6 * 14208


def test_iteration_counter_column_comes_from_the_log(tmp_path):
    log = tmp_path / "it.log"
    lines = [
        "[2026-01-01 10:00:00 DP0 TP0] Prefill batch [7], #new-seq: 1, #new-token: 300, #cached-token: 0, cuda graph: True",
        "[2026-01-01 10:00:00 DP1 TP1] Prefill batch [7], #new-seq: 1, #new-token: 40, #cached-token: 0, cuda graph: True",
        "[2026-01-01 10:00:00 DP0 TP0] Prefill batch [9], #new-seq: 1, #new-token: 80, #cached-token: 0, cuda graph: True",
        "[2026-01-01 10:00:00 DP1 TP1] Prefill batch, #new-seq: 1, #new-token: 8, #cached-token: 0, cuda graph: True",
    ]
    log.write_text("\n".join(lines[:3]) + "\n")
    trace = parse_logs([str(log)])
    assert trace.batches["forward_iter"].tolist() == [7, 7, 9]
    g = group_steps(trace, 2)
    assert g.rule == RULE_ITERATION and _votes(g) == [[40, 300], [80]]
    # a record without a counter: the seconds rule, under which DP0 printed twice in that second
    log.write_text("\n".join(lines) + "\n")
    trace = parse_logs([str(log)])
    assert trace.batches["forward_iter"].tolist() == [7, 7, 9, -1]
    g = group_steps(trace, 2)
    assert g.rule == RULE_SECONDS and g.ungrouped == 4


def test_without_rank_tags_or_per_batch_columns_there_are_no_steps():
    g = group_steps(PrefillTrace.from_sizes([100, 200]), 4)
    assert g.steps is None and "histogram" in g.reason
    t = _trace(forward_tokens=[100, 30], rank=[0, 0], timestamp=[1.0, 1.0], tags=["TP0"])
    g = group_steps(t, 4)
    assert g.steps is None and "DP rank tag" in g.reason


def test_a_dp_rank_beyond_the_layout_is_refused():
    t = _trace(forward_tokens=[100, 30], rank=[0, 2], timestamp=[1.0, 1.0])
    with pytest.raises(InputError, match="DP rank 2") as ei:
        group_steps(t, 2)
    assert ei.value.field == "attention_dp_size"


def test_the_same_rank_in_two_files_means_two_servers():
    t = _trace(forward_tokens=[100, 30, 60, 70], rank=[0, 1, 0, 1], source=[0, 0, 1, 1], timestamp=[1.0] * 4)
    assert _votes(group_steps(t, 2)) == [[30, 100], [60, 70]]
    t = _trace(forward_tokens=[100, 30], rank=[0, 1], source=[0, 1], timestamp=[1.0, 1.0])
    assert _votes(group_steps(t, 2)) == [[30, 100]]  # one file per rank: one server


# ---- the lockstep simulator --------------------------------------------------------------
def _dp_workload(**kw):
    base = Workload(
        dataset_name="random",
        num_prompts=[200],
        random_input_len=1500,
        random_output_len=40,
        random_range_ratio=0.2,
        max_concurrency=[32],
        chunked_prefill_size=4096,
        dp_size=4,
        enable_dp_attention=True,
        seed=3,
    )
    return replace(base, **kw)


@pytest.mark.parametrize(
    "kw", [{}, {"enable_mixed_chunk": True, "prefill_decode_interval": 2}, {"request_rate": 50.0, "max_concurrency": []}]
)
def test_lockstep_steps_hold_one_batch_per_rank_at_one_time(kw):
    tr = simulate(_dp_workload(**kw))
    b = tr.batches
    step, rank, t = b["step"], b["rank"], b["time_s"]
    pairs = set()
    for s_, r_ in zip(step.tolist(), rank.tolist()):
        assert (s_, r_) not in pairs  # one batch per rank and step
        pairs.add((s_, r_))
    for s_ in np.unique(step):
        assert np.unique(t[step == s_]).size == 1  # a step starts on every rank at once
    order = np.argsort(step, kind="stable")
    assert (np.diff(t[order]) >= 0).all()  # steps advance in time
    votes = tr.meta["dp_attention"]["decode_votes"]
    assert tr.meta["dp_attention"]["ranks"] == 4
    for s_, r_ in zip(votes["step"], votes["rank"]):
        assert s_ in set(step.tolist()) and (s_, r_) not in pairs  # a decoding rank of a prefill step
    assert int(b["new_token"].sum()) == sum(lv["input_tokens"] + lv["warmup_input_tokens"] for lv in tr.meta["levels"])
    g = group_steps(tr, 4)
    assert g.rule == RULE_SIMULATED and g.ungrouped == 0 and g.decode_votes == len(votes["step"])


def test_without_dp_attention_ranks_stay_independent_and_record_no_step():
    tr = simulate(_dp_workload(enable_dp_attention=False))
    assert "step" not in tr.batches and "dp_attention" not in tr.meta


def test_lockstep_is_slower_than_independent_ranks():
    lock = simulate(_dp_workload())
    free = simulate(_dp_workload(enable_dp_attention=False, chunked_prefill_size=1024))
    assert lock.meta["levels"][0]["duration_s"] > free.meta["levels"][0]["duration_s"]


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(st.tuples(st.floats(0.001, 0.05), st.floats(0.0, 0.002)), min_size=1, max_size=5),
    k=st.integers(1, 60),
    horizon=st.one_of(st.none(), st.floats(-0.1, 3.0)),
)
def test_lockstep_decode_jump_against_stepping(lines, k, horizon):
    a = np.array([x for x, _ in lines])
    b = np.array([y for _, y in lines])
    n, total = lockstep_decode(a, b, k, horizon)
    # step i takes the slowest rank's time; run while the step starts before the horizon
    t, steps = 0.0, 0
    while steps < k:
        if horizon is not None and steps >= 1 and t >= horizon:
            break
        t += float(np.max(a + b * steps))
        steps += 1
    assert n == steps
    assert total == pytest.approx(t, rel=1e-9, abs=1e-12)


# ---- the command line and the API ----------------------------------------------------------
@pytest.fixture(scope="module")
def dp_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("dp") / "dp.json"
    r = cli(
        [
            "trace",
            "--simulate",
            "--dataset-name",
            "random",
            "--num-prompts",
            "120",
            "--random-input-len",
            "1500",
            "--random-output-len",
            "30",
            "--max-concurrency",
            "24",
            "--chunked-prefill-size",
            "4096",
            "--dp-size",
            "4",
            "--enable-dp-attention",
            "-o",
            path,
            "-q",
        ]
    )
    assert r.code == 0, r.err
    assert "DP attention" in r.out and "of steps replay" in r.out
    return path


def test_trace_simulate_records_steps(dp_trace):
    t = load_trace(str(dp_trace))
    assert "step" in t.batches and t.meta["dp_attention"]["ranks"] == 4
    assert group_steps(t, 4).decode_votes == len(t.meta["dp_attention"]["decode_votes"]["rows"])


def test_suggest_buckets_prices_steps_and_says_so(dp_trace):
    r = cli(["suggest-buckets", dp_trace, "--tp", "4", "--dp", "4", "--dp-attention", "-k", "8"])
    assert r.code == 0, r.err
    assert "DP attention (4 ranks): a step replays in the bucket of its largest rank" in r.out
    assert "grouped by simulated lockstep iterations" in r.out and "% of steps replay" in r.out
    j = cli(["suggest-buckets", dp_trace, "--attn-dp-size", "4", "--tp", "4", "-k", "8", "--json"])
    obj = json.loads(j.out)
    dp = obj["dp_attention"]
    assert dp["unit"] == "step" and dp["ranks"] == 4 and dp["steps"] > 0
    steps = group_steps(load_trace(str(dp_trace)), 4).steps
    for row in obj["comparison"]:  # every row priced per step by SGLang's rule
        m = evaluate_steps(steps, row["buckets"])
        assert (row["eager_batches"], row["padded_tokens"]) == (m.eager_batches, m.padded_tokens)
        assert row["batches"] == steps.n_steps


def test_suggest_buckets_says_when_it_prices_batches(tmp_path, dp_trace):
    csv = tmp_path / "t.csv"
    save_trace(PrefillTrace.from_sizes([300, 700, 700, 1500]), str(csv))
    r = cli(["suggest-buckets", csv, "--tp", "4", "--dp", "4", "--dp-attention"])
    assert r.code == 0, r.err
    assert "DP attention (4 ranks): priced per batch, not per step: the trace is a size histogram" in r.out
    plain = cli(["suggest-buckets", dp_trace])
    assert plain.code == 0 and "priced as the launch --tp 4 --dp 4 --dp-attention" in plain.err
    assert "DP attention (4 ranks): a step replays in the bucket of its largest rank" in plain.out


def test_the_dp_attention_hint_runs_as_printed(dp_trace):
    r = cli(["suggest-buckets", dp_trace, "--tp", "2"])
    assert r.code == 0, r.err
    hint = next(line for line in r.err.splitlines() if "to price its steps" in line)
    flags = hint.split("give ", 1)[1].split(" to price", 1)[0].split()
    again = cli(["suggest-buckets", dp_trace, *flags])
    assert again.code == 0, again.err
    assert "DP attention (4 ranks): a step replays in the bucket of its largest rank" in again.out


def test_a_trace_with_more_dp_ranks_than_the_layout_is_one_line_exit_2(tmp_path):
    trace = tmp_path / "t.json"
    bad = PrefillTrace.from_batches({"forward_tokens": [10, 20], "rank": [0, 1]}, meta={"ranks": ["DP0", "DP5"]})
    save_trace(bad, str(trace))
    r = cli(["suggest-buckets", trace, "--tp", "2", "--dp", "2", "--dp-attention"])
    assert r.code == 2
    assert_one_line_error(r)
    assert "DP rank 5" in r.err and "--dp / --attn-dp-size" in r.err


def test_hostile_decode_votes_in_a_trace_file_are_refused(tmp_path, dp_trace):
    obj = json.loads(Path(dp_trace).read_text())
    obj["meta"]["dp_attention"]["decode_votes"]["rank"][0] = -3
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(obj))
    r = cli(["suggest-buckets", p, "--tp", "4", "--dp", "4", "--dp-attention"])
    assert r.code == 2
    assert_one_line_error(r)
    assert "decode_votes" in r.err


def test_api_takes_the_attention_dp_size(dp_trace):
    t = load_trace(str(dp_trace))
    plan = bcgtune.suggest_buckets(t, max_buckets=6, attention_dp_size=4, max_bucket=1024)
    assert plan.dp_attention.unit == "step" and plan.unit == "step"
    assert plan.recommended.metrics.batches == plan.dp_attention.steps
    assert plan.dp_attention.proven in (True, False) and plan.dp_attention.how
    per_batch = bcgtune.suggest_buckets(t, max_buckets=6, max_bucket=1024, server_flags={"tp_size": 1})
    assert per_batch.dp_attention is None and per_batch.unit == "batch"
    # with no layout given, the API (like the command line) prices the layout the trace records
    default = bcgtune.suggest_buckets(t, max_buckets=6, max_bucket=1024)
    assert default.unit == "step" and default.recommended.buckets == plan.recommended.buckets


def _dp_log(chunk: int, tags: list[str], n: int = 40) -> str:
    """A log with only the scheduler's startup line (no server_args: no layout stated) and
    prefill lines from the ranks `tags`, each batch's ranks in one second."""
    lines = [
        f"[2026-12-01 00:00:00 {tags[0]}] max_total_num_tokens=400000, chunked_prefill_size={chunk}, "
        "max_prefill_tokens=16384, max_running_requests=4096, context_len=40960, available_gpu_mem=10.54 GB"
    ]
    for i in range(n):
        for j, tag in enumerate(tags):
            tok = 64 + (i * 37 + j * 11) % (chunk - 64)
            lines.append(
                f"[2026-12-01 00:{i // 60:02d}:{i % 60:02d} {tag}] Prefill batch, #new-seq: 1, #new-token: {tok}, "
                "#cached-token: 0, token usage: 0.05, #running-req: 0, #queue-req: 0, cuda graph: True"
            )
    return "\n".join(lines) + "\n"


def test_dp_rank_hint_reads_sglangs_rank_layout(tmp_path):
    """SGLang tags lines with the DP rank and the global TP rank, DP rank d owning TP ranks
    d*tp/dp..: tags up to `DP7 TP7` are tp 8, dp 8 (not tp 64). The hint is given for the
    configuration whose lines carry DP ranks only."""

    def traced(name: str, text: str):
        (tmp_path / name).write_text(text)
        out = tmp_path / (name + ".json")
        assert cli(["trace", "--log", tmp_path / name, "-o", out, "-q"]).code == 0
        return out

    dp = tmp_path / "dp.log"
    r = cli(["suggest-buckets", traced("dp.log", _dp_log(4096, [f"DP{d} TP{d}" for d in range(8)])), "-k", "4"])
    assert r.code == 0 and "give --tp 8 --dp 8 --dp-attention" in r.err, r.err
    # DP ranks of two TP ranks each: DP3 on TP6 and TP7 -> tp 8, dp 4
    dp2 = traced("dp2.log", _dp_log(4096, [f"DP{t // 2} TP{t}" for t in range(8)]))
    assert "give --tp 8 --dp 4 --dp-attention" in cli(["suggest-buckets", dp2, "-k", "4"]).err
    # a fleet: the DP configuration gets the hint, the plain one does not
    plain = tmp_path / "plain.log"
    plain.write_text(_dp_log(2048, ["TP0"]))
    t = tmp_path / "fleet.json"
    assert cli(["trace", "--log", dp, plain, "-o", t, "-q"]).code == 0
    groups = {g["rank_chunk"]: i for i, g in enumerate(load_trace(str(t)).to_json_obj()["groups"])}
    r_dp = cli(["suggest-buckets", t, "--group", str(groups[4096]), "-k", "4"])
    r_plain = cli(["suggest-buckets", t, "--group", str(groups[2048]), "-k", "4"])
    assert r_dp.code == 0 and "--tp 8 --dp 8 --dp-attention" in r_dp.err
    assert r_plain.code == 0 and "--dp-attention" not in r_plain.err and "DP ranks" not in r_plain.err
