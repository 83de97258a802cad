"""What a CPU dry run does differently from a GPU run: no capture warm-up of attention, one
timed round by default, SDPA's tiled flash kernel."""

from typing import get_args

import pytest

from bcgtune.engines import choices

torch = pytest.importorskip("torch")


def test_the_engines_closed_sets_are_the_choices():
    from bcgtune.engines.base import SIDE_INPUT_LABELS
    from bcgtune.engines.build import torch_dtype
    from bcgtune.engines.segmented import IMPLEMENTATIONS

    assert {"auto", *choices.DTYPE_ALIASES} == set(get_args(choices.DtypeName))
    assert set(choices.DTYPE_ALIASES.values()) == set(get_args(choices.ResolvedDtype))
    assert {torch_dtype(d) for d in get_args(choices.ResolvedDtype)} == {torch.bfloat16, torch.float16, torch.float32}
    assert IMPLEMENTATIONS == get_args(choices.GraphImplName)
    assert tuple(SIDE_INPUT_LABELS) == get_args(choices.SideInputName)


def test_cpu_capture_runs_each_buckets_segments_once_without_attention(monkeypatch):
    """No GPU: a capture runs what the graph would hold (the segments), once, and never the
    attention over the whole bucket (its cost grows with the square of the bucket)."""
    import bcgtune.engines.breakable as bk
    from bcgtune.engines.breakable import BreakablePrefillEngine
    from bcgtune.engines.models import build_model, preset

    cpu = torch.device("cpu")
    model = build_model(preset("tiny"), cpu, dtype=torch.float32)
    eng = BreakablePrefillEngine(model, cpu, 256, warmup=5)
    sdpa, bodies = [], []
    real_sdpa, real_body = bk.F.scaled_dot_product_attention, model.body
    monkeypatch.setattr(bk.F, "scaled_dot_product_attention", lambda *a, **k: sdpa.append(1) or real_sdpa(*a, **k))
    monkeypatch.setattr(model, "body", lambda *a: bodies.append(a[0].shape[0]) or real_body(*a))
    recs = eng.capture([64, 256])
    assert all(r.ok for r in recs) and sdpa == [] and bodies == [256, 64]
    from bcgtune.engines.inputs import text_inputs

    eng.replay(text_inputs(model, 200, cpu, requests=2))
    assert len(sdpa) == 2 * model.cfg.num_layers  # replay runs attention on each request's rows


def test_cpu_calibration_defaults_to_one_round_and_sdpa_flash():
    from bcgtune.engines.spec import EngineSpec
    from bcgtune.services.calibrate import CPU_ROUNDS, GPU_ROUNDS, run_calibrate

    assert GPU_ROUNDS == (3, 10) and CPU_ROUNDS == (0, 1)
    spec = EngineSpec(model="tiny", device="cpu")
    result = run_calibrate([16, 32], spec, memory=False)
    eng = result.calibration.meta["engine"]
    assert (eng["warmup"], eng["repeats"]) == CPU_ROUNDS and eng["sdpa_backend"] == "flash"
    assert all(len(r) == 1 for r in result.rounds.graph_ms + result.rounds.eager_ms)
    assert result.calibration.meta["capture_s"] == {}  # declared, not captured: the round runs every bucket
    result = run_calibrate([16, 32], spec, warmup=1, repeats=3, memory=False)  # given values are kept
    assert (result.calibration.meta["engine"]["warmup"], result.calibration.meta["engine"]["repeats"]) == (1, 3)
    assert all(len(r) == 3 for r in result.rounds.graph_ms)
