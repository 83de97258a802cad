"""MoE layers (engines/moe.py) and any model from its config (engines/shapes.py): shapes read
from Qwen3-MoE, Qwen3-VL-MoE and DeepSeek-V2/V3 configs, refusals naming the field, the
experts grouped or looped alike, padded rows routed or masked as SGLang does, seeded routing
imbalance, and validate's pad-invariance rule for MoE: passes what rounding alone changes,
fails a padded row that changes a real token's expert or answer."""

import json
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, cli

from bcgtune.engines.shapes import PRESETS, rank_dims, read_config, shape_from_config
from bcgtune.errors import InputError

DATA = Path(__file__).parent / "data" / "models"


def _shape(name: str):
    return shape_from_config(read_config(DATA / name / "config.json", name), name, name)


def test_shapes_from_moe_configs():
    q = _shape("qwen3-moe-tiny")
    assert q.moe is not None and (q.moe.num_experts, q.moe.top_k, q.moe.intermediate_size) == (8, 2, 128)
    assert q.moe.norm_topk_prob and q.moe.dense_layers == () and q.qk_norm and q.mla is None
    vl = _shape("qwen3-vl-moe-tiny")
    assert vl.moe is not None and vl.moe.num_experts == 8 and vl.vision is not None and vl.vision.deepstack == 3
    assert vl.architecture == "Qwen3VLMoeForConditionalGeneration" and vl.mrope_section == (2, 3, 3)
    v2, v3 = _shape("deepseek-v2-mla-tiny"), _shape("deepseek-v3-tiny")
    for d in (v2, v3):
        assert d.mla is not None and d.mla.kv_lora_rank == 64 and d.head_dim == 48 and d.num_kv_heads == d.num_heads
        assert d.moe is not None and d.moe.dense_layers == (0,) and d.moe.shared_intermediate_size == 128
    assert (v2.moe.scoring, v2.moe.correction_bias, v3.moe.scoring, v3.moe.correction_bias) == ("softmax", False, "sigmoid", True)


def test_the_presets_are_the_published_sizes():
    # Qwen3-30B-A3B: 30.5B parameters in all (its model card); Qwen3-8B 8.2B
    assert 30.0e9 < PRESETS["qwen3-30b-a3b"].params() < 31.0e9
    assert 8.1e9 < PRESETS["qwen3-8b"].params() < 8.3e9
    assert PRESETS["qwen3-vl-30b-a3b"].moe == PRESETS["qwen3-30b-a3b"].moe


@pytest.mark.parametrize(
    "edit, field",
    [
        ({"num_experts_per_tok": None}, "num_experts_per_tok"),
        ({"moe_intermediate_size": None}, "moe_intermediate_size"),
        ({"hidden_size": None}, "hidden_size"),
        ({"layer_types": ["full_attention", "linear_attention"]}, "layer_types"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"linear_num_key_heads": 16}, "linear_num_key_heads"),
        ({"num_experts": "many"}, "num_experts"),
        ({"hidden_size": 10**12}, "hidden_size"),
    ],
)
def test_a_config_bcgtune_cannot_build_is_refused_naming_the_field(tmp_path, edit, field):
    raw = json.loads((DATA / "qwen3-moe-tiny" / "config.json").read_text())
    raw.update(edit)
    raw = {k: v for k, v in raw.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(InputError, match=field):
        shape_from_config(raw, "m", "m")
    r = cli(["capture", "--buckets", "16", "--model", str(tmp_path / "config.json"), "--device", "cpu"])
    assert r.code == 2 and field in r.err, r.err
    assert_one_line_error(r)


def test_a_folder_holding_only_a_config_is_built_by_bcgtune(tmp_path):
    pytest.importorskip("torch")
    folder = tmp_path / "qwen3-moe-tiny"
    folder.mkdir()
    (folder / "config.json").write_text((DATA / "qwen3-moe-tiny" / "config.json").read_text())
    out = tmp_path / "cap.json"
    r = cli(["capture", "--buckets", "16,32", "--model", str(folder), "--device", "cpu", "--json", "-o", str(out)])
    assert r.code == 0, r.err
    rep = json.loads(out.read_text())
    assert rep["model"]["source"] == "config.json" and rep["model"]["moe"]["num_experts"] == 8
    assert rep["environment"]["expert_gemm"].startswith(("grouped", "looped")) and rep["environment"]["pad_rows"] == "routed"


# ---- the layer ------------------------------------------------------------------------
torch = pytest.importorskip("torch")
CPU = torch.device("cpu")


def _layer(gemm, pad_rows="routed", experts=8, top_k=2, hidden=64, shared=0, ep=1, tp=1, rank=0):
    from bcgtune.engines.moe import MoELayer
    from bcgtune.engines.shapes import DecoderConfig, MoeConfig

    moe = MoeConfig(experts, top_k, 32, shared_intermediate_size=shared, shared_gate=bool(shared))
    cfg = DecoderConfig("m", 64, hidden, 128, 1, 4, 2, 16, moe=moe)
    dims = rank_dims(cfg, tp, rank, ep)
    layer = MoELayer(hidden, cfg.moe, dims, gemm, pad_rows, device=CPU, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return layer


def test_grouped_and_looped_experts_agree():
    from bcgtune.engines.moe import ExpertGemm, probe_grouped_gemm

    if not probe_grouped_gemm(CPU, torch.float32, 64, 32).grouped:
        pytest.fail("torch's grouped GEMM runs on the CPU from torch 2.9: the pins install it")
    grouped, looped = _layer(ExpertGemm(True), shared=32), _layer(ExpertGemm(False), shared=32)
    looped.load_state_dict(grouped.state_dict())
    x = torch.randn(50, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = grouped(x), looped(x)
    assert torch.allclose(a, b, atol=1e-5) and a.abs().max() > 0


def test_padded_rows_are_masked_from_routing_or_routed_as_sglang_does():
    from bcgtune.engines.moe import ExpertGemm, non_padded_rows

    x = torch.randn(20, 64, generator=torch.Generator().manual_seed(2))
    bound = torch.tensor([12])
    out = {}
    for rows in ("routed", "masked"):
        layer = _layer(ExpertGemm(True), pad_rows=rows)
        token = non_padded_rows().set(bound)
        try:
            with torch.no_grad():
                out[rows] = layer(x)
        finally:
            non_padded_rows().reset(token)
    # real rows alike (up to the rounding of experts' GEMMs over another number of rows)
    assert torch.allclose(out["routed"][:12], out["masked"][:12], atol=1e-6)
    assert out["routed"][12:].abs().max() > 0 and out["masked"][12:].abs().max() == 0  # padded rows: computed, or dropped


def test_expert_parallel_ranks_sum_to_the_whole_layer():
    from bcgtune.engines.moe import ExpertGemm

    whole = _layer(ExpertGemm(True), experts=8)
    x = torch.randn(30, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = whole(x)
        total = torch.zeros_like(ref)
        for rank in range(2):
            part = _layer(ExpertGemm(True), experts=8, ep=2, tp=2, rank=rank)
            part.gate.weight.copy_(whole.gate.weight)
            n = part.local
            part.w13.copy_(whole.w13[rank * n : (rank + 1) * n])
            part.w2.copy_(whole.w2[rank * n : (rank + 1) * n])
            total += part(x)
    assert torch.allclose(total, ref, atol=1e-5)


def test_skewed_routing_is_seeded_and_uneven():
    from bcgtune.engines.moe import ExpertGemm, routing_spread

    def spread(mode, seed):
        layer = _layer(ExpertGemm(True), experts=128, top_k=8, hidden=256)
        with torch.no_grad():
            layer.gate.weight.normal_(0.0, 256**-0.5, generator=torch.Generator().manual_seed(4))
        layer.set_routing(mode, seed, 0)
        return routing_spread(torch.nn.Sequential(layer))

    uniform, skewed = spread("uniform", 0), spread("skewed", 0)
    assert skewed == spread("skewed", 0) and skewed != spread("skewed", 1)
    assert uniform["busiest_over_mean"] < 1.6 < 2.0 < skewed["busiest_over_mean"] < 5.0, (uniform, skewed)


# ---- through the engines: capture, replay, validate ---------------------------------------
@pytest.mark.parametrize("model", ["tiny-moe", "deepseek-v3-tiny", "deepseek-v2-mla-tiny", "qwen3-moe-tiny"])
@pytest.mark.parametrize("runner", ["breakable", "full"])
def test_moe_models_validate_on_the_cpu(model, runner):
    from bcgtune.engines.spec import EngineSpec
    from bcgtune.services.validate import run_validate

    name = model if model in PRESETS else str(DATA / model / "config.json")
    rep = run_validate([16, 64], EngineSpec(model=name, device="cpu", runner=runner), sizes_per_bucket=2, requests=(1, 3))
    assert rep.ok, rep.problems()
    pads = [e.pad_invariance for e in rep.per_bucket]
    assert all(p is not None and p.rule == "moe" and p.answers_agree and p.routing_changes == 0 for p in pads)
    assert rep.environment["pad_rows"] == ("routed" if runner == "breakable" else "masked")


def test_a_vl_moe_config_validates_with_images():
    from bcgtune.engines.spec import EngineSpec
    from bcgtune.services.validate import run_validate

    spec = EngineSpec(model=str(DATA / "qwen3-vl-moe-tiny"), device="cpu")
    rep = run_validate([64, 128], spec, sizes_per_bucket=1, requests=(1,), image_px=(128,))
    assert rep.ok, rep.problems()
    assert rep.image_sweep is not None and rep.image_sweep.done and rep.side_inputs[-1] == "deepstack"


def test_looped_experts_pass_the_moe_rule_without_being_bit_for_bit(monkeypatch):
    """The experts looped one GEMM each on the CPU: an expert that got one row rounds
    differently from one that got several, which SGLang's server would not show; the rule
    passes it (answers within the thresholds, no real row's expert changed)."""
    from bcgtune.engines import build
    from bcgtune.engines.moe import ExpertGemm
    from bcgtune.engines.spec import EngineSpec
    from bcgtune.services.validate import run_validate

    monkeypatch.setattr(build, "_expert_gemm", lambda cfg, device, dtype: ExpertGemm(False, "forced by the test"))
    rep = run_validate([64, 256], EngineSpec(model="tiny-moe", device="cpu"), sizes_per_bucket=2, requests=(1, 4))
    assert rep.ok, rep.problems()
    assert rep.environment["expert_gemm"].startswith("looped")


def test_a_padded_row_that_changes_real_tokens_fails_the_rule(monkeypatch):
    """A negative control: a router that reads every row of the bucket (its logits shifted by
    the batch's mean hidden state, padded rows included) lets garbage in the padding move
    real tokens to other experts; pad invariance must fail, whatever the rounding."""
    from bcgtune.engines import moe
    from bcgtune.engines.spec import EngineSpec
    from bcgtune.services.validate import run_validate

    real_route = moe.MoELayer.route

    def leaky(self, x):
        ids, weights, chosen = real_route(self, x)
        shift = (x.mean(dim=0, keepdim=True) @ self.gate.weight.t()).float() * 50.0
        top = (self.gate(x).float() + self.route_bias + shift).softmax(-1).topk(self.moe.top_k + 1, dim=-1)
        return top.indices[:, : self.moe.top_k], weights, top.values

    monkeypatch.setattr(moe.MoELayer, "route", leaky)
    rep = run_validate([64], EngineSpec(model="tiny-moe", device="cpu", runner="full"), sizes_per_bucket=1, requests=(1,))
    pad = rep.per_bucket[0].pad_invariance
    assert pad is not None and not pad.ok and pad.routing_changes and not rep.ok
