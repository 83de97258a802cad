"""GPU tests of the breakable engine (run through the device tool): segments in one pool,
replay equal to eager on multi-request batches, no host sync inside replay, memory kept by
weak references, and SGLang's own capture classes giving the same outputs as bcgtune's."""

import json
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU"),
]

BATCHES = ((1024, 1), (1024, 6), (700, 3), (300, 2), (129, 1))


@pytest.fixture(scope="module")
def small():
    from bcgtune.engines.build import open_engine
    from bcgtune.engines.config import resolve
    from bcgtune.engines.spec import EngineSpec

    session = open_engine(resolve(EngineSpec(model="qwen3-0.6b", device="cuda", dtype="bf16"), [1024]))
    return session.model, session.device


def _report(name, obj):
    """Figures for benchmarks/RESULTS.md: printed, and written under $BCGTUNE_GPU_OUT if set."""
    print(name, json.dumps(obj))
    out = os.environ.get("BCGTUNE_GPU_OUT")
    if out:
        Path(out, f"{name}.json").write_text(json.dumps(obj, indent=1))


def test_breakable_capture_and_multi_request_replay(small):
    from bcgtune.engines.breakable import BreakablePrefillEngine
    from bcgtune.engines.compare import check_pad_invariance, compare_batch
    from bcgtune.engines.inputs import text_inputs

    model, dev = small
    eng = BreakablePrefillEngine(model, dev, 1024, graph_impl="bcgtune")
    assert eng.attention_kind == "flash-varlen"
    recs = eng.capture([256, 512, 1024])
    assert [r.bucket for r in recs] == [1024, 512, 256] and all(r.ok for r in recs), [r.error for r in recs]
    assert eng.segment_count(1024) == model.cfg.num_layers + 1  # one segment around each attention break
    # weak references: later, smaller graphs reuse the pool the first one sized
    assert recs[0].pool_growth_gib > 0 and max(r.pool_growth_gib for r in recs[1:]) < 0.5 * recs[0].pool_growth_gib
    rows = []
    for n, r in BATCHES:
        x = text_inputs(model, n, dev, seed=n, requests=r, split="random")
        he, le = eng.eager(x)
        he, le = he.clone(), le.clone()
        hr, lr, b = eng.replay(x)
        c = compare_batch(model, he, hr, le, lr, x.lengths)
        pad = check_pad_invariance(eng, x, b)
        rows.append(
            {
                "n": n,
                "requests": r,
                "bucket": b,
                "bitwise": c.bitwise,
                "max_abs_diff": c.max_abs_diff,
                "differing_requests": c.differing_requests,
                "pad_invariant": pad.ok,
            }
        )
        assert c.ok, c
        assert pad.ok, pad
        if n == b:  # same shapes, same kernels: bit for bit
            assert c.bitwise, c
    _report("breakable_replay_vs_eager", {"rows": rows, "pool_growth_gib": [r.pool_growth_gib for r in recs]})


def test_replay_never_syncs_the_host(small):
    from bcgtune.engines.breakable import BreakablePrefillEngine
    from bcgtune.engines.inputs import text_inputs

    model, dev = small
    eng = BreakablePrefillEngine(model, dev, 512, graph_impl="bcgtune")
    eng.capture([512])
    x = text_inputs(model, 400, dev, requests=4)
    eng.replay(x)  # warm: first pinned allocations
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            eng.replay(x)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_sglang_capture_classes_give_the_same_outputs(small):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import sglang_breakable_loader as loader

    from bcgtune.engines.breakable import BreakablePrefillEngine
    from bcgtune.engines.inputs import text_inputs
    from bcgtune.engines.segmented import sglang_impl_from

    module, how, plain_error = loader.load()
    if module is None:
        pytest.skip(how)
    try:
        model, dev = small
        ours = BreakablePrefillEngine(model, dev, 1024, graph_impl="bcgtune")
        theirs = BreakablePrefillEngine(model, dev, 1024, graph_impl=sglang_impl_from(module, how))
        r_ours, r_theirs = ours.capture([512, 1024]), theirs.capture([512, 1024])
        assert all(r.ok for r in r_ours + r_theirs), [r.error for r in r_ours + r_theirs]
        assert ours.segment_count(1024) == theirs.segment_count(1024)
        timings = []
        for n, r in BATCHES[:4]:
            x = text_inputs(model, n, dev, seed=n, requests=r)
            h1, l1, b1 = ours.replay(x)
            h1, l1 = h1.clone(), l1.clone()
            h2, l2, b2 = theirs.replay(x)
            assert b1 == b2 and torch.equal(h1, h2) and torch.equal(l1, l2)
            timings.append(
                {
                    "n": n,
                    "requests": r,
                    "bucket": b1,
                    "bcgtune_ms": ours.time_replay(x, b1, 3, 20).median_ms,
                    "sglang_ms": theirs.time_replay(x, b2, 3, 20).median_ms,
                }
            )
        mem = {"bcgtune_gib": [r.pool_growth_gib for r in r_ours], "sglang_gib": [r.pool_growth_gib for r in r_theirs]}
        _report(
            "sglang_vs_bcgtune_capture",
            {
                "loaded_by": how,
                "plain_import_error": plain_error,
                "segments": theirs.segment_count(1024),
                "timings": timings,
                "memory": mem,
            },
        )
    finally:
        loader.restore()
