"""One tensor-parallel rank: the slice SGLang's sharding gives each rank (engines/shapes.py),
its all-reduces real (one process per rank, gloo on the CPU, services/ranks.py) or modelled
(engines/allreduce.py); the slices of every rank, all-reducing, reproduce the whole model's
forward; ranks die with the process that started them, and a failing rank ends the run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, cli
from proc_helpers import gone

from bcgtune.engines.allreduce import AllReduceCurve, all_reduces_per_forward, load_curve
from bcgtune.engines.shapes import PRESETS, padded_vocab, rank_dims
from bcgtune.errors import InputError

DATA = Path(__file__).parent / "data" / "models"


def test_rank_slices_follow_sglangs_sharding():
    q30 = PRESETS["qwen3-30b-a3b"]  # 32 query heads, 4 KV heads, 128 experts of 768
    d = rank_dims(q30, tp=4, rank=3)
    assert (d.heads, d.head_start, d.kv_heads, d.kv_head_start) == (8, 24, 1, 3)
    assert (d.experts, d.expert_start, d.moe_intermediate) == (128, 0, 192)
    d = rank_dims(q30, tp=8, rank=5)  # fewer KV heads than ranks: one each, replicated over 2 ranks
    assert (d.heads, d.kv_heads, d.kv_head_start, d.moe_intermediate) == (4, 1, 2, 96)
    d = rank_dims(q30, tp=4, rank=3, ep=2)  # experts over EP, each over TP / EP
    assert (d.experts, d.expert_start, d.moe_intermediate) == (64, 64, 384)
    d = rank_dims(PRESETS["qwen3-8b"], tp=8, rank=1)
    assert (d.heads, d.kv_heads, d.kv_head_start, d.intermediate) == (4, 1, 1, 1536)
    assert rank_dims(q30, tp=4, rank=0).vocab * 4 == padded_vocab(151936, 4) == 151936
    assert padded_vocab(1000, 3) == 1152  # 1024 does not divide over 3: padded to 64 x 3
    with pytest.raises(InputError, match="do not divide over 3 ranks"):
        rank_dims(q30, tp=3)
    with pytest.raises(InputError, match="multiple of the expert parallel size"):
        rank_dims(q30, tp=4, ep=3)


def _sglang_function(relative: str, name: str):
    """A function of SGLang's source, read with ast and run alone (its module imports GPU
    packages this machine lacks)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.origin, "the test dependencies install sglang"
    source = (Path(spec.origin).parent / relative).read_text()
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name)
    scope: dict = {"DEFAULT_VOCAB_PADDING_SIZE": 64}
    exec(compile(ast.Module([node], []), relative, "exec"), scope)
    return scope[name]


def test_the_vocabulary_is_padded_as_sglang_pads_it():
    pad_vocab_size = _sglang_function("srt/layers/vocab_parallel_embedding.py", "pad_vocab_size")

    for vocab in (512, 1000, 151936, 152064, 129280):
        for tp in (1, 2, 3, 4, 8):
            pad = 64 if pad_vocab_size(vocab, 64) % tp == 0 else 64 * tp  # VocabParallelEmbedding.__init__
            assert padded_vocab(vocab, tp) == pad_vocab_size(vocab, pad), (vocab, tp)


def test_the_stated_and_measured_all_reduce_curves(tmp_path):
    stated = AllReduceCurve(4)
    one_mib = stated.us(1 << 20)
    assert stated.us(1) == pytest.approx(10.0, abs=0.01) and 10.0 < one_mib < 20.0 and AllReduceCurve(1).us(1 << 20) == 0
    nccl = tmp_path / "ar.txt"
    nccl.write_text(
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
        "        1024           256     float     sum      -1    12.50    0.08    0.14      0    12.10    0.08    0.15      0\n"
        "     1048576        262144     float     sum      -1    30.00   34.95   61.17      0    29.80   35.19   61.58      0\n"
        "# Avg bus bandwidth    : 30.6\n"
    )
    curve = load_curve(str(nccl), 4)
    assert curve.points == ((1024, 12.5), (1048576, 30.0)) and curve.us(1024) == 12.5 and 12.5 < curve.us(32768) < 30.0
    assert curve.us(2 * 1048576) == pytest.approx(60.0)
    js = tmp_path / "ar.json"
    js.write_text(json.dumps({"bytes": [1024, 4096], "us": [5, 6]}))
    assert load_curve(str(js), 2).points == ((1024, 5.0), (4096, 6.0))
    for bad in ('{"bytes": [1], "us": [1]}', '{"bytes": [1, "x"], "us": [1, 2]}', "nothing to read", '{"bytes": [1, 2]}'):
        js.write_text(bad)
        with pytest.raises(InputError):
            load_curve(str(js), 2)
    with pytest.raises(InputError, match="folder"):
        load_curve(str(tmp_path), 2)
    assert all_reduces_per_forward(48, True) == 97 and all_reduces_per_forward(48, False) == 96


torch = pytest.importorskip("torch")


def _forward(cfg, n):
    """One eager forward of a seeded batch on this rank's engine: (hidden, logits, rank)."""
    from bcgtune.engines.build import open_engine
    from bcgtune.engines.inputs import text_inputs

    session = open_engine(cfg)
    x = text_inputs(session.model, n, session.device, seed=5, requests=2)
    hidden, logits = session.engine.eager(x)
    return hidden.clone(), logits.clone(), cfg.parallel.rank


@pytest.mark.parametrize(
    "model, tp, ep",
    [("tiny", 2, 1), ("tiny", 4, 1), ("tiny-moe", 2, 1), ("tiny-moe", 2, 2), ("deepseek-v3-tiny", 2, 1)],
)
def test_the_ranks_slices_all_reduced_are_the_whole_model(model, tp, ep):
    """Real all-reduces over gloo, one spawned process per rank: rank 0's hidden states and
    gathered logits are the TP-1 model's (heads, replicated KV heads, intermediate sizes,
    experts and vocabulary sliced as SGLang slices them)."""
    from bcgtune.engines.config import resolve
    from bcgtune.engines.spec import EngineSpec
    from bcgtune.services.ranks import run_ranks

    name = model if model in PRESETS else str(DATA / model / "config.json")
    whole = _forward(resolve(EngineSpec(model=name, device="cpu"), [40]), 40)
    cfg = resolve(EngineSpec(model=name, device="cpu", tp=tp, ep=ep, all_reduce="real"), [40])
    assert cfg.parallel.all_reduce == "real" and cfg.parallel.backend == "gloo"
    hidden, logits, rank = run_ranks(cfg, _forward, 40)
    assert rank == 0
    assert torch.allclose(hidden, whole[0], atol=1e-5) and torch.allclose(logits, whole[1], atol=1e-4)


def test_a_modelled_all_reduce_holds_each_block_for_the_rows_it_reduces(monkeypatch):
    from bcgtune.engines.build import open_engine
    from bcgtune.engines.config import resolve
    from bcgtune.engines.inputs import text_inputs
    from bcgtune.engines.models import Comm
    from bcgtune.engines.spec import EngineSpec

    waits: list[int] = []
    monkeypatch.setattr(Comm, "wait", lambda self, rows, device: waits.append(rows))
    session = open_engine(resolve(EngineSpec(model="tiny", device="cpu", tp=2), [64]))
    eng = session.engine
    eng.capture([64])
    x = text_inputs(session.model, 40, session.device, requests=2)
    waits.clear()
    eng.eager(x)
    assert waits == [40] * all_reduces_per_forward(2, True)  # embedding, then attention and MLP of 2 layers
    waits.clear()
    eng.replay(x)
    assert waits == [64] * all_reduces_per_forward(2, True)  # the graph reduces the padded bucket
    assert "modelled" in session.settings.tensor_parallel


def _fail_on_rank_one(cfg):
    if cfg.parallel.rank == 1:
        raise ValueError("rank one fails on purpose")
    return "rank 0 done"


def test_a_rank_that_fails_fails_the_run():
    from bcgtune.engines.config import resolve
    from bcgtune.engines.spec import EngineSpec
    from bcgtune.errors import ExternalError
    from bcgtune.services.ranks import run_ranks

    cfg = resolve(EngineSpec(model="tiny", device="cpu", tp=2, all_reduce="real"), [16])
    with pytest.raises(ExternalError, match="rank 1 failed: ValueError: rank one fails on purpose"):
        run_ranks(cfg, _fail_on_rank_one)


_WAITS_FOREVER = """
import sys, time
sys.path.insert(0, {tests!r})
from bcgtune.engines.config import resolve
from bcgtune.engines.spec import EngineSpec
from bcgtune.services.ranks import run_ranks
import test_engine_tp as t
cfg = resolve(EngineSpec(model="tiny", device="cpu", tp=2, all_reduce="real"), [16])
run_ranks(cfg, t._{what})
"""


def _rank0_waits_in_a_collective(cfg):
    """Rank 0 joins the group and waits in a barrier; rank 1 fails before joining."""
    import datetime as dt

    import torch.distributed as dist

    if cfg.parallel.rank == 1:
        raise ValueError("rank one fails before its first collective")
    where = f"file://{cfg.parallel.rendezvous}"
    dist.init_process_group("gloo", init_method=where, rank=0, world_size=2, timeout=dt.timedelta(seconds=600))
    dist.barrier()


def _everyone_sleeps(cfg):
    print(f"rank {cfg.parallel.rank} pid {os.getpid()}", flush=True)
    time.sleep(600)


def test_a_rank_that_fails_while_rank_zero_waits_ends_the_run():
    code = _WAITS_FOREVER.format(tests=str(Path(__file__).parent), what="rank0_waits_in_a_collective")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 3, p.stderr
    assert "rank-1 failed: ValueError: rank one fails before its first collective" in p.stderr


def test_ranks_die_with_the_process_that_started_them():
    code = _WAITS_FOREVER.format(tests=str(Path(__file__).parent), what="everyone_sleeps")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pids = {}
        while len(pids) < 2:
            line = parent.stdout.readline()
            assert line, "the run ended before both ranks started"
            rank, pid = line.split()[1], int(line.split()[3])
            pids[rank] = pid
        child = pids["1"]
        assert child != parent.pid and pids["0"] == parent.pid
        parent.send_signal(signal.SIGKILL)
        assert gone(child)
    finally:
        parent.kill()
        parent.wait()


def test_calibrate_a_tp_rank_with_real_all_reduces_from_the_command_line(tmp_path):
    out = tmp_path / "cal.json"
    args = ["calibrate", "--model", "tiny-moe", "--device", "cpu", "--tp", "2", "--all-reduce", "real", "--sizes", "16,48"]
    r = cli([*args, "--repeats", "2", "-o", str(out)])
    assert r.code == 0, r.err
    meta = json.loads(out.read_text())["meta"]
    assert meta["shape"]["tp"] == 2 and meta["shape"]["all_reduce"] == "real" and meta["shape"]["moe"]["experts"] == 8
    assert "measured across 2 processes (gloo)" in meta["engine"]["tensor_parallel"]
    both = ["--all-reduce", "real", "--all-reduce-curve", "x.json"]
    r = cli(["calibrate", "--model", "tiny", "--device", "cpu", "--tp", "2", *both, "-o", str(tmp_path / "b.json")])
    assert r.code == 2 and "--all-reduce-curve" in r.err
    assert_one_line_error(r)


def test_the_all_reduce_curve_benchmark_measures_what_modelled_runs_read(tmp_path):
    """benchmarks/allreduce_curve.py over gloo on the CPU (2 ranks): a curve --all-reduce-curve
    reads, one point per size."""
    out = tmp_path / "ar.json"
    args = ["--ranks", "2", "--device", "cpu", "--hidden", "16", "--max-tokens", "64", "--warmup", "1", "--repeats", "3"]
    root = Path(__file__).resolve().parents[1]
    p = subprocess.run(
        [sys.executable, "benchmarks/allreduce_curve.py", *args, "-o", str(out)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    curve = load_curve(str(out), 2)
    assert [b for b, _ in curve.points] == [4 * 16 * t for t in (1, 2, 4, 8, 16, 32, 64)]
