"""DeepStack (Qwen3-VL's per-layer visual embeddings) through eager and both runners on
qwen3-vl-tiny, CPU: replay equals eager on image and text batches (padded rows included), a
text batch after an image batch in the same bucket sees none of the image, and the negative
controls (a replay that drops DeepStack, or never zeroes its slot) make validation fail
naming DeepStack."""

import json

import pytest
from cli_helpers import HANG_S, assert_one_line_error, cli

torch = pytest.importorskip("torch")

from bcgtune.engines.breakable import BreakablePrefillEngine  # noqa: E402
from bcgtune.engines.compare import check_pad_invariance, compare_batch, probe_side_inputs  # noqa: E402
from bcgtune.engines.full import FullPrefillEngine  # noqa: E402
from bcgtune.engines.inputs import image_inputs, text_inputs  # noqa: E402
from bcgtune.engines.models import build_model, preset  # noqa: E402
from bcgtune.engines.spec import EngineSpec  # noqa: E402
from bcgtune.errors import InputError  # noqa: E402
from bcgtune.services.validate import run_validate  # noqa: E402

CPU = torch.device("cpu")
RUNNERS = {"breakable": BreakablePrefillEngine, "full": FullPrefillEngine}


@pytest.fixture(scope="module")
def vl():
    return build_model(preset("qwen3-vl-tiny"), CPU, dtype=torch.float32, seed=0)


def test_presets_carry_deepstack_as_qwen3_vl():
    assert preset("qwen3-vl-8b").vision.deepstack == 3  # deepstack_visual_indexes [8, 16, 24]
    assert preset("qwen3-vl-tiny").vision.deepstack == 2
    assert preset("tiny").vision is None and build_model(preset("tiny"), CPU, dtype=torch.float32).deepstack_layers == 0
    with pytest.raises(InputError, match="deepstack 3 must be between 0 and the 2 decoder layers"):
        from dataclasses import replace

        cfg = preset("qwen3-vl-tiny")
        build_model(replace(cfg, vision=replace(cfg.vision, deepstack=3)), CPU, dtype=torch.float32)


def test_image_inputs_carry_deepstack_on_image_rows_only(vl):
    x = image_inputs(vl, 90, 128, CPU, seed=1)
    h, n_ds = vl.hidden_size, vl.deepstack_layers
    assert x.deepstack is not None and x.deepstack.shape == (90, h * n_ds)
    image_rows = (x.deepstack != 0).any(dim=1).nonzero().flatten().tolist()
    assert len(image_rows) == x.visual_tokens == 16 and image_rows == list(range(image_rows[0], image_rows[0] + 16))
    assert text_inputs(vl, 90, CPU).deepstack is None  # a text batch carries none, as in SGLang


def test_eager_adds_deepstack_after_the_first_layers(vl):
    """body(inp, pos, deepstack) adds slice i after decoder layer i < deepstack_layers: the
    same numbers as running the layers by hand; DeepStack changes only its rows' futures."""
    x = image_inputs(vl, 90, 128, CPU, seed=1)
    with torch.no_grad():
        got = vl.body(x.inp, x.positions, x.deepstack)
        cos, sin = vl._rope(x.positions, x.inp.dtype)
        h = x.inp
        for i, layer in enumerate(vl.layers):
            h = layer(h, cos, sin)
            if i < vl.deepstack_layers:
                h = h + x.deepstack[:, i * vl.hidden_size : (i + 1) * vl.hidden_size]
        assert torch.equal(got, vl.norm(h))
        without = vl.body(x.inp, x.positions)
    first_image_row = int((x.deepstack != 0).any(dim=1).nonzero()[0])
    assert torch.equal(got[:first_image_row], without[:first_image_row])  # causal: rows before the image
    assert not torch.equal(got[first_image_row:], without[first_image_row:])


@pytest.mark.parametrize("runner", ["breakable", "full"])
def test_replay_equals_eager_on_image_and_text_batches_padded_rows_included(vl, runner):
    eng = RUNNERS[runner](vl, CPU, 128)
    assert eng.s_deepstack is not None and eng.side_inputs() == ["input_embeds", "mrope_positions", "deepstack"]
    eng.capture([64, 128])
    batches = [image_inputs(vl, n, 128, CPU, seed=n) for n in (40, 64, 100)] + [text_inputs(vl, 100, CPU, seed=3)]
    for x in batches:
        he, le = eng.eager(x)
        he, le = he.clone(), le.clone()
        hr, lr, b = eng.replay(x)
        assert x.n < b or x.n == 64  # padded rows in all but one
        c = compare_batch(vl, he, hr, le, lr, x.lengths)
        assert c.ok and c.max_abs_diff < 1e-4, (runner, x.kind, x.n)
        if runner == "breakable":  # attention on the real rows: bit for bit
            assert c.bitwise, (x.kind, x.n)
        uses = {s.name: (s.given, s.replay_used) for s in probe_side_inputs(eng, x, b, hr.clone(), lr.clone())}
        assert uses["deepstack"] == ((True, True) if x.kind.startswith("image") else (False, False))
        assert uses["input_embeds"] == uses["mrope_positions"] == (True, True)
        assert check_pad_invariance(eng, x, b).ok  # garbage in the padded rows, DeepStack's included


@pytest.mark.parametrize("runner", ["breakable", "full"])
def test_a_text_batch_after_an_image_batch_sees_none_of_it(vl, runner):
    """Image, then text of the same length in the same bucket: the text replay equals eager
    (its slot zeroed). Without the zeroing (the stale-deepstack fault) the image leaks in."""
    img = image_inputs(vl, 100, 256, CPU, seed=5)
    txt = text_inputs(vl, 100, CPU, seed=6)
    he, le = (t.clone() for t in FullPrefillEngine(vl, CPU, 128).eager(txt))
    for fault, leaks in (("none", False), ("stale-deepstack", True)):
        eng = RUNNERS[runner](vl, CPU, 128, fault=fault)
        eng.capture([128])
        eng.replay(img)
        hr, lr, _ = eng.replay(txt)
        assert torch.allclose(hr, he, atol=1e-4) is not leaks, fault
        assert eng.s_deepstack is not None and bool(eng.s_deepstack.any()) is leaks


def test_drop_deepstack_replays_as_if_the_image_had_none(vl):
    """The negative control rebuilds sglang 0.5.23's breakable replay: no DeepStack slot, so
    an image batch replays as eager does without DeepStack."""
    eng = BreakablePrefillEngine(vl, CPU, 128, fault="drop-deepstack")
    assert eng.s_deepstack is None and "deepstack" in eng.side_inputs()
    eng.capture([128])
    x = image_inputs(vl, 100, 128, CPU, seed=2)
    hr, _, _ = eng.replay(x)
    with torch.no_grad():
        assert torch.equal(hr, vl.body(x.inp, x.positions))
        assert not torch.equal(hr, vl.body(x.inp, x.positions, x.deepstack))
    from bcgtune.engines.config import resolve

    with pytest.raises(InputError, match="needs a model with DeepStack"):  # refused before anything is built
        resolve(EngineSpec(model="tiny", device="cpu", fault="drop-deepstack"), [64])


def _validate(runner, fault="none"):
    spec = EngineSpec(model="qwen3-vl-tiny", device="cpu", runner=runner, fault=fault)
    return run_validate([32, 64, 128], spec, sizes_per_bucket=2, requests=(1, 3), image_px=(64, 128))


@pytest.mark.parametrize("runner", ["breakable", "full"])
def test_validation_lists_every_side_input_per_batch_and_passes(runner):
    rep = _validate(runner)
    assert rep.ok and rep.problems() == [] and rep.side_inputs == ["input_embeds", "mrope_positions", "deepstack"]
    sw = rep.image_sweep
    assert sw is not None and len(sw.done) == 6 and len(sw.text_after_image) == 3
    for c in [*rep.checks, *sw.done, *sw.text_after_image]:
        names = [s.name for s in c.side_inputs]
        assert names == rep.side_inputs
        ds = c.side_inputs[2]
        assert (ds.given, ds.replay_used) == ((True, True) if c.kind.startswith("image") else (False, False)), c.kind
    doc = rep.to_json()
    assert doc["injected_fault"] == "none" and doc["image_sweep"]["text_after_image"][0]["kind"] == "text after image"
    row = doc["image_sweep"]["checks"][0]
    assert row["side_inputs"][2] == {"name": "deepstack", "given": True, "replay_used": True, "ok": True}


@pytest.mark.parametrize("runner", ["breakable", "full"])
def test_negative_controls_fail_naming_deepstack(runner):
    rep = _validate(runner, "drop-deepstack")
    assert not rep.ok and rep.injected_fault == "drop-deepstack"
    assert any(p.startswith("image batches: replay dropped DeepStack") for p in rep.problems()), rep.problems()
    assert all("dropped DeepStack" in c.problems[0] for c in rep.image_sweep.done)
    rep = _validate(runner, "stale-deepstack")
    assert not rep.ok
    assert any(p.startswith("text batches after an image batch: replay read DeepStack") for p in rep.problems()), rep.problems()


def test_cli_negative_control_exits_1_naming_the_dropped_input(tmp_path):
    args = ["validate", "--buckets", "32,64", "--model", "qwen3-vl-tiny", "--device", "cpu", "--quiet"]
    r = cli([*args, "--inject-fault", "drop-deepstack", "-o", str(tmp_path / "v.json")])
    assert r.code == 1, r.err
    assert_one_line_error(r)
    assert "replay dropped DeepStack (per-layer visual embeddings)" in r.err.strip().splitlines()[-1]
    assert "NEGATIVE CONTROL" in r.out and "FAIL" in r.out
    assert json.loads((tmp_path / "v.json").read_text())["injected_fault"] == "drop-deepstack"
    r = cli([*args, "--inject-fault", "stale-deepstack"])
    assert r.code == 1 and "DeepStack" in r.err and "a previous batch's" in r.err
    r = cli(args)
    assert r.code == 0, r.err
    assert "DeepStack (per-layer visual embeddings): read in 2 of 2 batches carrying it" in r.out
    for bad, where in (
        (["--inject-fault", "drop-deepstack", "--no-images"], "--inject-fault"),
        (["--inject-fault", "drop-input"], "--inject-fault"),
    ):
        r = cli([*args, *bad])
        assert r.code == 2 and where in r.err, r.err
    r = cli(["validate", "--buckets", "32", "--model", "tiny", "--device", "cpu", "--inject-fault", "drop-deepstack"])
    assert r.code == 2 and "needs a model with DeepStack" in r.err
    r = cli(["validate", "--server", "--profile", "mi355x", "--inject-fault", "drop-deepstack"])
    assert r.code == 2 and "not --server" in r.err


# ---- a checkpoint folder whose config declares DeepStack ----------------------------------
@pytest.fixture(scope="module")
def qwen3_vl_folder(tmp_path_factory):
    """A tiny Qwen3-VL config (transformers' own class), saved as a checkpoint folder."""
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("qwen3-vl-mini")
    transformers.Qwen3VLConfig(
        text_config={
            "vocab_size": 600,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "rope_scaling": {"rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": True},
            "max_position_embeddings": 4096,
        },
        vision_config={
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 64,
            "deepstack_visual_indexes": [0, 1],
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "num_position_embeddings": 64,
        },
        image_token_id=500,
        vision_start_token_id=501,
        vision_end_token_id=502,
    ).save_pretrained(folder)
    return folder


def test_a_checkpoint_declaring_deepstack_runs_it_as_transformers_does(qwen3_vl_folder):
    from bcgtune.engines.build import open_engine
    from bcgtune.engines.config import resolve
    from bcgtune.engines.hf import HFVisionLanguageModel

    session = open_engine(resolve(EngineSpec(model=str(qwen3_vl_folder), device="cpu", random_weights=True), [128]))
    model, desc = session.model, session.description
    assert isinstance(model, HFVisionLanguageModel) and model.deepstack_layers == 2 and desc["deepstack_layers"] == 2
    assert model.language.config._attn_implementation == "bcgtune_causal_sdpa"
    assert model.lm.model.visual.config._attn_implementation == "sdpa"  # an image attends both ways
    x = image_inputs(model, 90, 128, CPU, seed=4)
    mask = (x.deepstack != 0).any(dim=1)
    assert int(mask.sum()) == x.visual_tokens == 16
    h = model.hidden_size
    with torch.no_grad():
        ours = model.body(x.inp, x.positions, x.deepstack)
        theirs = model.language(
            inputs_embeds=x.inp[None],
            position_ids=x.positions[:, None, :],
            use_cache=False,
            visual_pos_masks=mask[None],
            deepstack_visual_embeds=[x.deepstack[mask, i * h : (i + 1) * h] for i in range(2)],
        )[0][0]
        plain = model.body(x.inp, x.positions)
    assert torch.allclose(ours, theirs, atol=1e-6) and not torch.allclose(ours, plain, atol=1e-3)


@pytest.mark.parametrize("runner", ["breakable", "full"])
def test_validate_a_deepstack_checkpoint_and_its_negative_control(qwen3_vl_folder, runner):
    spec = EngineSpec(model=str(qwen3_vl_folder), device="cpu", random_weights=True, runner=runner)
    rep = run_validate([64, 128], spec, sizes_per_bucket=2, requests=(1, 3), image_px=(128,))
    assert rep.ok, rep.problems()
    assert rep.side_inputs == ["input_embeds", "mrope_positions", "deepstack"]
    assert all(c.side_inputs[2].replay_used for c in rep.image_sweep.done)
    bad = run_validate(
        [64, 128], EngineSpec(**{**spec.__dict__, "fault": "drop-deepstack"}), sizes_per_bucket=1, requests=(1,), image_px=(128,)
    )
    assert not bad.ok and any("replay dropped DeepStack" in p for p in bad.problems())


def test_the_device_script_passes_then_fails_both_negative_controls_on_cpu(tmp_path):
    """benchmarks/h200_deepstack_validate.sh (the H200 run) on qwen3-vl-tiny: the plain run
    passes, both negative controls fail naming DeepStack, and the script says so (exit 0)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(
        os.environ,
        OUT=str(tmp_path),
        MODEL="qwen3-vl-tiny",
        BUCKETS="32 64",
        DEVICE="cpu",
        EXTRA="--sizes-per-bucket 2",
        PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    )
    p = subprocess.run(
        ["bash", "benchmarks/h200_deepstack_validate.sh"], cwd=root, env=env, capture_output=True, text=True, timeout=HANG_S
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "none: exit 0" in p.stdout and "drop-deepstack: exit 1" in p.stdout and "stale-deepstack: exit 1" in p.stdout
    assert json.loads((tmp_path / "validate_qwen3-vl-tiny_drop-deepstack.json").read_text())["ok"] is False
