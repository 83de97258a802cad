"""SGLang's own launch resolution against bcgtune's model of it (bcgtune.core.sglang.ladder.
resolve_prefill_capture), over a grid of launches, and the resolution API that doctor and
`serve --dry-run` use.

The differential test drives SGLang 0.5.23's real parser, `prepare_server_args` and
resolution pipeline (every hook under srt/arg_groups/) in one child process, with the GPU
queries answered as an H200 or an MI355X would (bcgtune.adapters.sglang.probe), and
compares the backend, the exact captured bucket list, the alignment, the ladder maximum
and the chunk per attention-DP rank for every launch.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest
from cli_helpers import HANG_S

from bcgtune.adapters.machine.hardware import gpu_for
from bcgtune.adapters.machine.model_config import locate_model_config
from bcgtune.adapters.sglang.launcher import build_server_command
from bcgtune.adapters.sglang.resolve import PROBE_CONFIG_DIR, known_device, run_probe, sglang_installed
from bcgtune.cli.render.launch import render_resolved_prefill
from bcgtune.files.profile_file import Profile
from bcgtune.services.launch import capture_for_profile as resolve_prefill
from bcgtune.services.launch import model_capture

DATA = Path(__file__).parent / "data"
MLA_CONFIG = DATA / "models" / "deepseek-v2-mla-tiny"
MOE_CONFIG = DATA / "models" / "qwen3-moe-tiny"
VL_CONFIG = DATA / "models" / "qwen2.5-vl-tiny"
DSV3_CONFIG = DATA / "models" / "deepseek-v3-tiny"

# (tp, dp, extra flags): replicas, attention DP in both spellings, and plain TP
LAYOUTS = [
    (1, 1, {}),
    (2, 1, {}),
    (2, 2, {}),
    (8, 1, {"attn-dp-size": 2}),
    (8, 8, {"enable-dp-attention": True}),
    (8, 1, {"attn-dp-size": 8}),
    (4, 4, {"enable-dp-attention": True}),
]
A2A = ["none", "deepep", "mooncake", "nixl"]
CHUNKS = [None, 4096, 1536, 12288]
LISTS = [None, [100, 300, 1000, 3000], [512, 256, 256, 2048], [96, 200, 4000], None]
SPECIAL = [
    # pipeline parallelism: default off, explicit on (ladder capped at 8192)
    ("h200", "plain", {"pp-size": 2}, None),
    ("h200", "plain", {"pp-size": 2, "cuda-graph-backend-prefill": "breakable"}, None),
    ("mi355x", "plain", {"pp-size": 2, "cuda-graph-backend-prefill": "breakable"}, None),
    ("h200", "plain", {"pp-size": 2, "cuda-graph-backend-prefill": "breakable"}, [128, 9000, 16000]),
    # ROCm: opt-in; a list without the backend is dead
    ("mi355x", "plain", {"tp-size": 2}, None),
    ("mi355x", "plain", {"tp-size": 2}, [256, 512]),
    ("mi355x", "plain", {"tp-size": 2, "cuda-graph-backend-prefill": "breakable"}, None),
    ("mi355x", "plain", {"tp-size": 4, "attn-dp-size": 2, "cuda-graph-backend-prefill": "breakable"}, [250, 500]),
    # MLA caps the ladder at 8192; llama-2 paths at 4096; --max-total-tokens
    ("mi355x", "mla", {"cuda-graph-backend-prefill": "breakable"}, None),
    ("h200", "mla", {"tp-size": 8, "attn-dp-size": 2}, None),
    ("mi355x", "llama2", {"cuda-graph-backend-prefill": "breakable"}, None),
    ("h200", "plain", {"max-total-tokens": 5000}, None),
    ("h200", "plain", {"max-total-tokens": 5000, "cuda-graph-max-bs-prefill": 6000}, None),
    # chunked prefill off: an empty ladder, graphs off
    ("h200", "plain", {"chunked-prefill-size": -1}, None),
    ("h200", "plain", {"chunked-prefill-size": -1}, [64, 128]),
    ("h200", "plain", {"chunked-prefill-size": -1, "tp-size": 2, "moe-a2a-backend": "deepep"}, None),
    # explicit switches, the JSON config, DeepEP's own rules
    ("h200", "plain", {"disable-prefill-cuda-graph": True}, [256]),
    ("h200", "plain", {"cuda-graph-backend-prefill": "disabled"}, None),
    ("h200", "plain", {"cuda-graph-backend-prefill": "full"}, [100, 200]),
    ("h200", "plain", {"cuda-graph-config": '{"prefill": {"backend": "breakable", "max_bs": 3000}}'}, None),
    ("h200", "plain", {"tp-size": 4, "moe-a2a-backend": "deepep", "cuda-graph-max-bs-prefill": 1000}, None),
    ("h200", "plain", {"tp-size": 4, "moe-a2a-backend": "deepep", "deepep-mode": "normal"}, [256]),
    ("h200", "plain", {"tp-size": 8, "attn-dp-size": 4, "moe-a2a-backend": "deepep", "cuda-graph-max-bs-prefill": 4096}, None),
    (
        "h200",
        "plain",
        {"tp-size": 4, "enable-two-batch-overlap": True, "cuda-graph-backend-prefill": "breakable", "moe-a2a-backend": "deepep"},
        [100, 301],
    ),
    ("h200", "plain", {"tp-size": 4, "attn-cp-size": 2}, None),
    # DeepEP v2 turns prefill graphs off even when breakable is chosen (it needs a model
    # registered for it and a per-rank budget of 128 tokens); MoRI is not validated
    (
        "h200",
        "moe",
        {
            "tp-size": 2,
            "moe-a2a-backend": "deepep_v2",
            "cuda-graph-backend-prefill": "breakable",
            "chunked-prefill-size": 128,
            "max-prefill-tokens": 128,
            "cuda-graph-max-bs-decode": 64,
        },
        None,
    ),
    ("h200", "moe", {"tp-size": 2, "moe-a2a-backend": "mori", "chunked-prefill-size": 4096}, None),
    (
        "h200",
        "moe",
        {"tp-size": 2, "moe-a2a-backend": "mori", "chunked-prefill-size": 4096, "cuda-graph-backend-prefill": "breakable"},
        [100, 301],
    ),
    # pplx needs attention DP and at most 128 tokens per rank: SGLang turns graphs off with it
    ("h200", "plain", {"tp-size": 8, "attn-dp-size": 8, "moe-a2a-backend": "pplx", "chunked-prefill-size": 1024}, None),
    ("h200", "plain", {"tp-size": 4, "attn-cp-size": 2, "cuda-graph-backend-prefill": "breakable"}, [100, 301]),
]


def _grid(tmp: Path) -> list[tuple[str, Profile]]:
    plain = PROBE_CONFIG_DIR
    llama2 = tmp / "Llama-2-7b-shaped"
    llama2.mkdir(exist_ok=True)
    shutil.copy(plain / "config.json", llama2 / "config.json")
    models = {"plain": plain, "mla": MLA_CONFIG, "moe": MOE_CONFIG, "llama2": llama2}
    out = []
    chunk_i, list_i = itertools.cycle(CHUNKS), itertools.cycle(LISTS)
    for (tp, dp, extra), a2a, tbo, explicit in itertools.product(LAYOUTS, A2A, (False, True), (False, True)):
        server = {"tp-size": tp, "dp-size": dp, **extra}
        if a2a != "none":
            server["moe-a2a-backend"] = a2a
        if tbo:
            server["enable-two-batch-overlap"] = True
        if explicit:
            server["cuda-graph-backend-prefill"] = "breakable"
        chunk = next(chunk_i)
        if chunk is not None:
            server["chunked-prefill-size"] = chunk
        out.append(("h200", _profile(server, next(list_i), "cuda", "h200", plain)))
    for hw, model, server, buckets in SPECIAL:
        spec = gpu_for(hw)
        out.append((hw, _profile(dict(server), buckets, spec.platform, hw, models[model])))
    return out


def _profile(server: dict, buckets, platform: str, hardware: str, model: Path) -> Profile:
    from bcgtune.files.profile_file import snake

    return Profile(
        name="grid",
        platform=platform,
        hardware=hardware,
        model=str(model),
        server={snake(k): v for k, v in server.items()},
        buckets=list(buckets) if buckets else None,
    )


def _device(hw: str) -> dict:
    return known_device(gpu_for(hw))


def _ours(p: Profile):
    return model_capture(p)


@pytest.mark.sglang
def test_fallback_model_equals_sglang_resolution(tmp_path):
    if not sglang_installed():
        pytest.skip("sglang not installed")
    grid = _grid(tmp_path)
    # the grid's size, recorded: 7 layouts x 4 a2a backends x two-batch overlap on/off x
    # backend default/explicit (112, with chunk sizes and lists cycled through them) plus
    # 30 special launches
    assert len(grid) == 142
    by_device: dict[str, list[int]] = {}
    for i, (hw, _p) in enumerate(grid):
        by_device.setdefault(hw, []).append(i)
    answers: dict[int, dict] = {}
    for hw, idx in by_device.items():
        launches = [build_server_command(grid[i][1]).argv[3:] for i in idx]
        result = run_probe({"device": _device(hw), "launches": launches}, timeout=600)
        assert "error" not in result, result.get("error")
        for i, res in zip(idx, result["launches"]):
            answers[i] = res
    mismatches = []
    for i, (hw, prof) in enumerate(grid):
        sg = answers[i]
        assert sg["ok"], (hw, prof.server, prof.buckets, sg.get("error"))
        ours = _ours(prof)
        sg_backend = sg["backend"] if sg["captured"] else "disabled"
        got = (sg_backend, tuple(sg["captured"]), sg["alignment"], sg["max_bs"], sg["chunked_prefill_size"])
        want = (
            ours.backend if ours.captured else "disabled",
            ours.captured,
            ours.alignment,
            ours.max_bs,
            ours.chunked_prefill_size,
        )
        if got != want:
            mismatches.append((hw, prof.server, prof.buckets, "sglang:", got, "bcgtune:", want))
    assert not mismatches, "\n".join(map(str, mismatches[:10])) + f"\n{len(mismatches)} of {len(grid)} differ"
    # the grid reaches every outcome the rules can produce
    outcomes = {(answers[i]["backend"] if answers[i]["captured"] else "disabled") for i in answers}
    assert {"breakable", "full", "disabled"} <= outcomes
    assert any(answers[i]["alignment"] > 1 for i in answers)


# The rules the model gained, each against SGLang: (GPU, model, [server], bucket list, the
# model checks this rule itself). Every answer of the model must equal SGLang's or name what
# it could not check; the answers of rules it checks must equal SGLang's.
OFF_RULES = [
    # multimodal models outside SGLang's breakable allowlist run prefill eager (unless chosen)
    ("h100", "vl", {}, None, True),
    ("h100", "vl", {"cuda-graph-backend-prefill": "breakable"}, None, True),
    ("h100", "vl", {"enable-multimodal": True}, None, True),
    # DeepSeek-V3 on an sm100 GPU: trtllm_mla attention by default, so prefill runs eager
    ("b200", "dsv3", {}, None, True),
    ("b200", "dsv3", {"cuda-graph-backend-prefill": "breakable"}, None, True),
    ("b200", "dsv3", {"attention-backend": "fa3"}, None, True),
    ("h200", "dsv3", {}, None, True),
    # torch_native and flex_attention: no CUDA graphs, even chosen ones
    ("h100", "plain", {"attention-backend": "torch_native"}, None, True),
    ("h100", "plain", {"attention-backend": "flex_attention", "cuda-graph-backend-prefill": "breakable"}, None, True),
    # prefill context parallelism: refused without a strategy; with one, not modelled
    ("h100", "plain", {"enable-prefill-cp": True}, None, True),
    ("h100", "plain", {"enable-prefill-cp": True, "cp-strategy": "zigzag", "tp-size": 2}, None, False),
    ("h100", "plain", {"debug-tensor-dump-output-folder": "/tmp/dump"}, None, True),
    # the capture step drops buckets above request rows x context length
    ("h100", "plain", {"max-running-requests": 2, "context-length": 2048}, None, True),
    ("h100", "plain", {"max-running-requests": 2, "context-length": 2048, "cuda-graph-backend-prefill": "full"}, None, True),
    ("h100", "plain", {"cuda-graph-backend-prefill": "full", "chunked-prefill-size": 1024, "context-length": 512}, None, True),
    ("h200", "plain", {"tp-size": 8, "attn-dp-size": 4, "max-running-requests": 8, "context-length": 512}, None, True),
    # ascend_tp: unvalidated for breakable graphs, then reset to no all-to-all (alignment 1)
    ("h100", "plain", {"tp-size": 2, "moe-a2a-backend": "ascend_tp"}, None, True),
    ("h100", "plain", {"tp-size": 2, "moe-a2a-backend": "ascend_tp", "cuda-graph-backend-prefill": "breakable"}, None, True),
    (
        "h200",
        "plain",
        {"tp-size": 4, "attn-dp-size": 2, "moe-a2a-backend": "ascend_tp", "cuda-graph-backend-prefill": "breakable"},
        [100, 301],
        True,
    ),
    # --chunked-prefill-size 0, which SGLang accepts
    ("h100", "plain", {"chunked-prefill-size": 0}, None, True),
    ("h100", "plain", {"chunked-prefill-size": 0}, [64, 128], True),
    # launches SGLang refuses
    ("h100", "plain", {"context-length": 100000}, None, True),
    ("h100", "plain", {"attention-backend": "flex_attention", "speculative-algorithm": "NGRAM"}, None, True),
    ("b200", "dsv3", {"tp-size": 4, "moe-a2a-backend": "flashinfer"}, None, False),
    ("h100", "plain", {"enable-mis": True}, None, False),
    ("h100", "plain", {"enable-kv-cache-sharding": True}, None, False),
    ("h100", "vl", {"language-model-only": True}, None, False),
    # speculative decoding's default request pool (48) and the capture filter
    ("h100", "plain", {"speculative-algorithm": "NGRAM", "context-length": 64}, None, False),
    # launches SGLang refuses that the model once priced (or called "graphs off"): its refusal rules
    ("h100", "plain", {"attention-backend": "trtllm_mla"}, None, True),
    ("b200", "dsv3", {"attention-backend": "trtllm_mla"}, None, False),
    ("h200", "dsv3", {"moe-a2a-backend": "mori", "cuda-graph-backend-prefill": "breakable"}, None, True),
    ("h200", "moe", {"moe-a2a-backend": "mori"}, None, True),
    ("h200", "moe", {"moe-a2a-backend": "mori", "chunked-prefill-size": 4096}, None, True),
    ("h200", "moe", {"tp-size": 4, "attn-dp-size": 2, "moe-a2a-backend": "mori"}, None, True),
    (
        "h200",
        "plain",
        {"tp-size": 4, "moe-a2a-backend": "flashinfer_megamoe", "cuda-graph-backend-prefill": "breakable"},
        None,
        True,
    ),
    ("h200", "dsv3", {"enable-single-batch-overlap": True, "tp-size": 4, "moe-a2a-backend": "deepep"}, None, True),
    ("h200", "moe", {"tp-size": 2, "moe-a2a-backend": "pplx"}, None, True),
    ("a100", "moe", {"tp-size": 2, "moe-a2a-backend": "megamoe"}, None, True),
    ("mi300x", "mla", {"attention-backend": "trtllm_mla", "cuda-graph-backend-prefill": "breakable"}, None, True),
    ("h200", "dsv3", {"tp-size": 4, "moe-a2a-backend": "megamoe", "enable-two-batch-overlap": True}, None, True),
    # prefill context parallelism: not modelled, named
    ("h200", "plain", {"enable-prefill-cp": True, "cp-strategy": "zigzag", "tp-size": 2, "attn-cp-size": 2}, None, False),
]


def _outcome(sg: dict) -> tuple:
    if not sg["ok"]:
        assert sg.get("refused"), sg  # a failure to ask is not an answer
        return ("refused",)
    backend = sg["backend"] if sg["captured"] else "disabled"
    return (backend, tuple(sg["captured"]), sg["alignment"], sg["max_bs"], sg["chunked_prefill_size"])


def _our_outcome(ours) -> tuple:
    if ours.refused is not None:
        return ("refused",)
    backend = ours.backend if ours.captured else "disabled"
    return (backend, ours.captured, ours.alignment, ours.max_bs, ours.chunked_prefill_size)


@pytest.mark.sglang
def test_model_equals_sglang_or_names_what_it_could_not_check():
    if not sglang_installed():
        pytest.skip("sglang not installed")
    models = {
        "plain": PROBE_CONFIG_DIR,
        "vl": VL_CONFIG.resolve(),
        "dsv3": DSV3_CONFIG.resolve(),
        "moe": MOE_CONFIG.resolve(),
        "mla": MLA_CONFIG.resolve(),
    }
    cases = [(hw, _profile(dict(srv), lst, gpu_for(hw).platform, hw, models[m]), exact) for hw, m, srv, lst, exact in OFF_RULES]
    answers: dict[int, dict] = {}
    for hw in sorted({c[0] for c in cases}):
        idx = [i for i, c in enumerate(cases) if c[0] == hw]
        launches = [build_server_command(cases[i][1]).argv[3:] for i in idx]
        result = run_probe({"device": _device(hw), "launches": launches}, timeout=600)
        assert "error" not in result, result.get("error")
        answers.update(zip(idx, result["launches"]))
    wrong, silent = [], []
    for i, (hw, prof, exact) in enumerate(cases):
        got, ours = _outcome(answers[i]), _model_capture_of(prof)
        want = _our_outcome(ours)
        if exact and got != want:
            wrong.append((hw, prof.model, prof.server, prof.buckets, "sglang:", got, "bcgtune:", want))
        if got != want and not ours.unchecked:
            silent.append((hw, prof.model, prof.server, "sglang:", got, "bcgtune:", want))
    assert not wrong, "\n".join(map(str, wrong))
    assert not silent, "answers that differ from SGLang's without naming what was not checked:\n" + "\n".join(map(str, silent))
    # the cases reach the outcomes they are there for
    assert sum(_outcome(a) == ("refused",) for a in answers.values()) >= 16
    assert any(0 < len(a["captured"]) < 58 and a.get("capture_limit", {}).get("pool_known") for a in answers.values() if a["ok"])


def _model_capture_of(prof):
    return model_capture(prof)


# ---------------------------------------------------------------- the resolution API
def test_fallback_when_sglang_absent(monkeypatch, tmp_path):
    import bcgtune.adapters.sglang.resolve as sr

    monkeypatch.setattr(sr, "sglang_installed", lambda: False)
    prof = _profile(
        {"tp": 8, "dp": 8, "enable-dp-attention": True, "moe-a2a-backend": "deepep", "chunked-prefill-size": 8192},
        None,
        "cuda",
        "h200",
        PROBE_CONFIG_DIR,
    )
    r = resolve_prefill(prof)
    assert r.source.label == "bcgtune model" and r.source.not_asked == "sglang is not installed"
    assert (r.backend, len(r.captured), r.captured[-1], r.max_bs, r.chunked_prefill_size) == ("breakable", 38, 1024, 1024, 1024)
    text = "\n".join(render_resolved_prefill(r))
    assert "SGLang not asked: sglang is not installed" in text and "38 graphs, 4..1024" in text


def test_fallback_chunk_off_says_graphs_off(monkeypatch):
    import bcgtune.adapters.sglang.resolve as sr

    monkeypatch.setattr(sr, "sglang_installed", lambda: False)
    prof = _profile({"chunked-prefill-size": -1}, None, "cuda", "h200", PROBE_CONFIG_DIR)
    r = resolve_prefill(prof)
    assert r.backend == "disabled" and r.captured == () and "--chunked-prefill-size -1" in r.reason
    assert "captures   nothing" in "\n".join(render_resolved_prefill(r))


def test_model_config_lookup(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert locate_model_config(str(MLA_CONFIG)) == (MLA_CONFIG, None)
    folder, why = locate_model_config("org/missing-model")
    assert folder is None and "not in the local Hugging Face cache" in why and str(tmp_path / "hub") in why
    snap = tmp_path / "hub" / "models--org--model" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (tmp_path / "hub" / "models--org--model" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--model" / "refs" / "main").write_text("abc123")
    assert locate_model_config("org/model") == (snap, None)
    assert locate_model_config(str(tmp_path))[0] is None  # a folder without config.json
    assert locate_model_config(None)[0] is None


def test_resolve_with_model_reads_mla_from_config():
    prof = _profile({"cuda-graph-backend-prefill": "breakable"}, None, "rocm", "mi355x", MLA_CONFIG)
    r = model_capture(prof, config_dir=MLA_CONFIG)
    assert (r.max_bs, r.captured[-1], r.chunked_prefill_size) == (8192, 8192, 16384)
    prof = _profile({"cuda-graph-backend-prefill": "breakable"}, None, "rocm", "mi355x", PROBE_CONFIG_DIR)
    assert model_capture(prof, config_dir=PROBE_CONFIG_DIR).max_bs == 16384


@pytest.mark.sglang
def test_resolve_prefill_asks_sglang(tmp_path, sglang_probe):
    prof = _profile({"tp": 2, "moe-a2a-backend": "deepep"}, [100, 300, 1000], "cuda", "h200", PROBE_CONFIG_DIR)
    r = resolve_prefill(prof)
    assert r.source.label == "sglang 0.5.23" and r.source.not_asked is None
    assert (r.backend, r.captured, r.alignment) == ("breakable", (104, 304, 1000), 2)
    assert any("divisible by 8" in n for n in r.notes)


def test_serve_dry_run_lines(monkeypatch):
    import bcgtune.adapters.sglang.resolve as sr

    monkeypatch.setattr(sr, "sglang_installed", lambda: False)
    prof = _profile({"tp": 2, "enable-two-batch-overlap": True}, [256, 512], "cuda", "h200", PROBE_CONFIG_DIR)
    lines = render_resolved_prefill(resolve_prefill(prof))
    assert lines[0] == "prefill graphs (NOT CHECKED by SGLang: bcgtune model; SGLang not asked: sglang is not installed):"
    assert "backend    disabled: SGLang turns breakable prefill graphs off with two-batch overlap" in lines[1]
    assert lines[2] == "  captures   nothing"


@pytest.mark.sglang
def test_pipeline_steps_mirror_sglang_functions_in_order():
    """Each step of the model names the SGLang function it mirrors: that function is defined
    in the installed SGLang, and SGLang runs them in the model's order. Read from the
    source (importing every hook needs SGLang's GPU dependencies)."""
    if not sglang_installed():
        pytest.skip("sglang not installed")
    import ast
    import importlib.util

    from bcgtune.core.sglang.capture import PIPELINE_STEPS

    hooks = Path(importlib.util.find_spec("sglang").origin).parent / "srt" / "arg_groups"

    def body(module: str, func: str) -> str:
        src = (hooks / f"{module}.py").read_text(encoding="utf-8")
        defs = [n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == func]
        assert defs, f"{module}.{func} is not defined in the installed SGLang"
        return ast.get_source_segment(src, defs[0])

    for name, _step in PIPELINE_STEPS:
        body(*name.rsplit(".", 1))
    config_src = body("cuda_graph_hook", "handle_cuda_graph_config")
    pipeline_src = body("pipeline", "run_resolution_pipeline")
    # the parse step first, then each step where SGLang calls it: inside
    # handle_cuda_graph_config, or as a hook of the pipeline
    positions = [(pipeline_src.index("run_hook(handle_cuda_graph_config,"), config_src.index("parse_cuda_graph_config("))]
    for name, _step in PIPELINE_STEPS:
        module, func = name.rsplit(".", 1)
        if module == "cuda_graph_hook" and f"\n    {func}(" in config_src:
            positions.append((positions[0][0], config_src.index(f"\n    {func}(")))
        else:
            positions.append((pipeline_src.index(f"run_hook({func},"), 0))
    assert positions == sorted(positions)


@pytest.mark.sglang
def test_architecture_tables_match_the_installed_sglang():
    """bcgtune/core/sglang/tables.py (the multimodal allowlist, the architectures SGLang's
    resolution treats specially) is what scripts/extract_sglang_tables.py reads from the
    installed SGLang's source."""
    import subprocess
    import sys

    if not sglang_installed():
        pytest.skip("sglang not installed")
    script = Path(__file__).resolve().parents[1] / "scripts" / "extract_sglang_tables.py"
    r = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=HANG_S)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    "platform, installed, want_cuda, want_hip",
    [
        ("cuda", ("13.0", None), "13.0", None),  # a CUDA build of torch keeps its own version
        ("cuda", (None, None), "12.9", None),  # a CPU build: a CUDA version SGLang accepts
        ("rocm", ("13.0", None), None, "7.2.0"),
        ("rocm", (None, "6.4.1"), None, "6.4.1"),
    ],
)
def test_the_probe_keeps_the_installed_torchs_own_gpu_build(monkeypatch, platform, installed, want_cuda, want_hip):
    """On a GPU machine the packages built against the installed torch check its CUDA
    version at import (torchvision refuses another major): the probe's stand-in GPU keeps
    the installed build's version and invents one only for a CPU build."""
    torch = pytest.importorskip("torch")
    from bcgtune.adapters.sglang import probe as sglang_probe

    for name in ("is_available", "device_count", "current_device", "get_device_capability"):
        monkeypatch.setattr(torch.cuda, name, getattr(torch.cuda, name))
    for name in ("get_device_properties", "get_device_name", "mem_get_info", "set_device"):
        monkeypatch.setattr(torch.cuda, name, getattr(torch.cuda, name))
    monkeypatch.setattr(torch.version, "cuda", installed[0])
    monkeypatch.setattr(torch.version, "hip", installed[1])
    sglang_probe.fake_device({"platform": platform, "name": "GPU", "capability": [9, 0], "memory_gib": 141})
    assert (torch.version.cuda, torch.version.hip) == (want_cuda, want_hip)
