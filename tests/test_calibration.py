import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bcgtune.core.plan.calibration import Calibration
from bcgtune.errors import InputError
from bcgtune.files.calibration_file import load_calibration, save_calibration


def _cal(**kw):
    base = dict(
        tokens=[16, 256, 1024, 4096],
        eager_ms=[10.0, 10.0, 30.0, 120.0],
        graph_ms=[5.0, 9.0, 28.0, 119.0],
    )
    base.update(kw)
    return Calibration(**base)


def test_interpolation_and_extrapolation():
    cal = _cal()
    assert cal.eager_time(16) == pytest.approx(10.0)
    assert cal.eager_time(640) == pytest.approx(20.0)  # halfway 256..1024
    # beyond the last row: slope of the last two rows (90 ms over 3072 tokens)
    assert cal.eager_time(8192) == pytest.approx(120.0 + 90.0 / 3072 * 4096)
    # below the first row: slope of the first two rows, clipped at zero
    assert cal.graph_time(8) == pytest.approx(5.0 - 4.0 / 240 * 8)
    assert cal.graph_time(-10_000) == 0.0
    out = cal.graph_time(np.array([16, 256, 4096]))
    assert out.tolist() == pytest.approx([5.0, 9.0, 119.0])


def test_single_row_is_constant():
    cal = Calibration(tokens=[512], eager_ms=[3.0], graph_ms=[2.0])
    assert cal.eager_time([1, 512, 9999]).tolist() == [3.0, 3.0, 3.0]


def test_graph_memory():
    cal = _cal(pool_gib=1.0, per_graph_gib=0.02)
    assert cal.graph_memory_gib([256, 1024, 4096]) == pytest.approx(1.04)
    cal2 = _cal(pool_by_tokens=(np.array([1024, 4096]), np.array([0.3, 1.2])), per_graph_gib=0.01)
    assert cal2.graph_memory_gib([512, 2048]) == pytest.approx(0.6 + 0.01)
    with pytest.raises(InputError, match="no graph memory"):
        _cal().graph_memory_gib([256])


def test_json_round_trip(tmp_path):
    cal = _cal(
        pool_gib=1.15,
        per_graph_gib=0.02,
        pool_by_tokens=(np.array([256, 4096]), np.array([0.1, 1.15])),
        meta={"gpu": {"name": "NVIDIA H200"}},
    )
    p = tmp_path / "cal.json"
    save_calibration(cal, p)
    obj = json.loads(p.read_text())
    assert obj["format_version"] == 4 and obj["runner"] == "full" and obj["kind"] == "bcgtune.calibration"
    back = load_calibration(p)
    assert back.tokens.tolist() == cal.tokens.tolist()
    assert back.graph_ms.tolist() == pytest.approx(cal.graph_ms.tolist())
    assert back.pool_gib == pytest.approx(1.15)
    assert back.pool_by_tokens[0].tolist() == [256, 4096]
    assert back.meta["gpu"]["name"] == "NVIDIA H200"


def test_csv_round_trip_and_unsorted(tmp_path):
    p = tmp_path / "c.csv"
    p.write_text("tokens,eager_ms,graph_ms\n1024,30,28\n# a comment\n16,10,5\n\n256,10,9\n")
    cal = load_calibration(p)
    assert cal.tokens.tolist() == [16, 256, 1024]
    assert not cal.has_memory
    out = tmp_path / "o.csv"
    save_calibration(cal, out)
    assert out.read_text().splitlines()[0] == "tokens,eager_ms,graph_ms"
    assert load_calibration(out).eager_ms.tolist() == pytest.approx([10, 10, 30])


@pytest.mark.parametrize(
    "text,match",
    [
        ("16,10,5\n", "header"),
        ("tokens,eager_ms,graph_ms\n", "no rows"),
        ("tokens,eager_ms,graph_ms\nx,1,2\n", r"c.csv:2.*|tokens 'x'"),
        ("tokens,eager_ms,graph_ms\n16,1,nan\n", "graph_ms"),
        ("tokens,eager_ms,graph_ms\n16,1\n", "expected"),
        ("tokens,eager_ms,graph_ms\n16,1,2\n16,1,2\n", "repeated"),
        ("tokens,eager_ms,graph_ms\n0,1,2\n", r"tokens must be within 1\.\..*got .0."),
        ("tokens,eager_ms,graph_ms\n16,-1,2\n", "eager_ms"),
    ],
)
def test_csv_errors_name_file_line_field(tmp_path, text, match):
    p = tmp_path / "c.csv"
    p.write_text(text)
    with pytest.raises(InputError, match=match) as ei:
        load_calibration(p)
    assert "c.csv" in str(ei.value)


def test_csv_error_has_line_number(tmp_path):
    p = tmp_path / "c.csv"
    p.write_text("tokens,eager_ms,graph_ms\n16,1,2\n32,oops,2\n")
    with pytest.raises(InputError) as ei:
        load_calibration(p)
    assert ei.value.where.endswith("c.csv:3") and "eager_ms" in ei.value.what


@pytest.mark.parametrize(
    "obj,match",
    [
        ({"format_version": 5, "rows": []}, "format_version '5' .this bcgtune reads 1, 2, 3 and 4"),
        ({"format_version": 2, "runner": "breakable", "rows": [{"tokens": 16, "graph_ms": 1}]}, "batches"),
        ({"format_version": 2, "runner": "tiled", "rows": []}, "runner"),
        ({"format_version": 1, "rows": []}, "rows"),
        ({"format_version": 1, "rows": [{"tokens": 16, "eager_ms": 1}]}, r"rows\[0\]\.graph_ms"),
        ({"format_version": 1, "rows": [{"tokens": 1.5, "eager_ms": 1, "graph_ms": 1}]}, "tokens"),
        ({"format_version": 1, "kind": "bcgtune.prefill-trace", "rows": []}, "not a calibration"),
        (
            {"format_version": 1, "rows": [{"tokens": 16, "eager_ms": 1, "graph_ms": 1}], "memory": {"pool_gib": "x"}},
            "memory.pool_gib",
        ),
    ],
)
def test_json_errors(tmp_path, obj, match):
    p = tmp_path / "c.json"
    p.write_text(json.dumps(obj))
    with pytest.raises(InputError, match=match):
        load_calibration(p)


def test_missing_file_and_bad_json(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_calibration(tmp_path / "nope.json")
    p = tmp_path / "b.json"
    p.write_text("{oops")
    with pytest.raises(InputError, match="line 1"):
        load_calibration(p)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 20000), min_size=2, max_size=12, unique=True),
    st.integers(1, 30000),
)
def test_interpolation_stays_between_neighbours(tokens, n):
    tokens = sorted(tokens)
    rng = np.random.default_rng(len(tokens))
    eager = np.cumsum(rng.uniform(0.1, 5.0, len(tokens)))
    cal = Calibration(tokens=tokens, eager_ms=eager, graph_ms=eager * 0.9)
    v = float(cal.eager_time(n))
    assert v >= 0.0
    if tokens[0] <= n <= tokens[-1]:
        i = np.searchsorted(tokens, n)
        lo, hi = eager[max(i - 1, 0)], eager[min(i, len(tokens) - 1)]
        assert min(lo, hi) - 1e-9 <= v <= max(lo, hi) + 1e-9


def test_csv_columns_by_name_any_order_and_bom(tmp_path):
    p = tmp_path / "c.csv"
    p.write_bytes("\ufeffgraph_ms,note,tokens,eager_ms\r\n2,a,100,5\r\n10,b,1000,20\r\n".encode("utf-8"))
    cal = load_calibration(p)
    assert cal.tokens.tolist() == [100, 1000]
    assert cal.eager_ms.tolist() == [5.0, 20.0] and cal.graph_ms.tolist() == [2.0, 10.0]
    p.write_text("tokens,eager_ms\n100,5\n")
    with pytest.raises(InputError, match="missing graph_ms"):
        load_calibration(p)
