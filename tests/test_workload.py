"""Workload: bench_serving's sampling rule, Qwen-VL image tokens, sources, validation and
hostile inputs (files and option values)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bcgtune.adapters.bench_serving.client import sample_lengths
from bcgtune.core.sim.image_tokens import image_tokens, parse_random_resolution, parse_resolution, smart_resize
from bcgtune.core.sim.workload import StepTimeModel, StepTimeSettings, Workload, WorkloadSettings
from bcgtune.errors import InputError
from bcgtune.files.workload_file import (
    DEFAULT_PRESET,
    default_workload,
    load_workload_file,
    preset_names,
    workload_from_options,
)


# ---- sampling: sglang/benchmark/datasets/common.py compute_random_lens -----------------------
def _bench_serving_lens(seed, L_in, L_out, r, n):
    np.random.seed(seed)  # serving.py / ImageDataset.load
    inp = np.random.randint(max(int(L_in * r), 1), L_in + 1, size=n)
    out = np.random.randint(max(int(L_out * r), 1), L_out + 1, size=n)
    return inp, out


@pytest.mark.parametrize("seed,L_in,L_out,r,n", [(42, 1024, 128, 0.8, 1280), (1, 2048, 256, 0.0, 50), (7, 3, 1, 1.0, 9)])
def test_lengths_equal_bench_serving_draws(seed, L_in, L_out, r, n):
    w = Workload(random_input_len=L_in, random_output_len=L_out, random_range_ratio=r, seed=seed)
    inp, out = sample_lengths(w, n)
    ref_in, ref_out = _bench_serving_lens(seed, L_in, L_out, r, n)
    assert inp.tolist() == ref_in.tolist()
    assert out.tolist() == ref_out.tolist()


@settings(max_examples=60, deadline=None)
@given(L=st.integers(1, 5000), r=st.floats(0, 1), seed=st.integers(0, 2**31 - 1))
def test_lengths_lie_on_the_documented_interval(L, r, seed):
    inp, _ = sample_lengths(Workload(random_input_len=L, random_output_len=1, random_range_ratio=r, seed=seed), 200)
    lo = max(math.floor(L * r), 1)
    assert inp.min() >= lo and inp.max() <= L


# ---- images: resize rule worked by hand ---------------------------------------------------
@pytest.mark.parametrize(
    "res,family,expected",
    [
        ("512x512", "qwen3-vl", 16 * 16 + 2),  # 512/32 = 16 exactly
        ("1080p", "qwen3-vl", 34 * 60 + 2),  # 1080/32 = 33.75 -> 34; 1920/32 = 60
        ("1080p", "qwen2-vl", 39 * 69 + 2),  # 1080/28 = 38.57 -> 39; 1920/28 = 68.57 -> 69
        ("1080p", "qwen2.5-vl", 39 * 69 + 2),
        ("4k", "qwen3-vl", 68 * 120 + 2),  # 2160/32 = 67.5 -> 68 (half to even); 3840/32 = 120
        ("720p", "qwen3-vl", 22 * 40 + 2),  # 720/32 = 22.5 -> 22 (half to even); 1280/32 = 40
        ("360p", "qwen3-vl", 11 * 20 + 2),  # 360/32 = 11.25 -> 11; 640/32 = 20
        ("100x100", "qwen3-vl", 8 * 8 + 2),  # 96x96 < 65536 px: beta = 2.56, ceil(256/32) = 8
        ("5000x3000", "qwen2-vl", 165 * 99 + 2),  # 5012x2996 > 12845056: beta = 1.0806 -> 4620x2772
    ],
)
def test_image_tokens_follow_the_resize_rule(res, family, expected):
    w, h = parse_resolution(res)
    assert image_tokens(w, h, family) == expected


def test_custom_resolution_is_height_by_width():
    assert parse_resolution("1080x1920") == (1920, 1080) == parse_resolution("1080p")
    assert parse_random_resolution("random:256x512-1024x2048") == ((512, 256), (2048, 1024))
    assert parse_random_resolution("720p") is None


@settings(max_examples=200, deadline=None)
@given(h=st.integers(16, 6000), w=st.integers(16, 6000), fam=st.sampled_from(["qwen2-vl", "qwen3-vl"]))
def test_smart_resize_invariants(h, w, fam):
    if max(h, w) / min(h, w) > 200:
        return
    factor, lo, hi = (28, 3136, 12845056) if fam == "qwen2-vl" else (32, 65536, 16777216)
    rh, rw = smart_resize(h, w, factor, lo, hi)
    assert rh % factor == 0 and rw % factor == 0 and rh >= factor and rw >= factor
    assert rh * rw <= hi
    assert rh * rw >= lo or rh * rw >= h * w  # tiny images are scaled up into the range


# ---- presets, files, profiles, options ------------------------------------------------------
def test_default_workload_is_the_multimodal_pr_benchmark():
    w = default_workload()
    assert w.name == DEFAULT_PRESET == "mi355x-multimodal-pr"
    assert w.dataset_name == "image" and w.image_resolution == "512x512" and w.image_count == 1
    assert (w.random_input_len, w.random_output_len, w.random_range_ratio) == (1024, 128, 0.8)
    assert w.max_concurrency == [4, 16, 32, 64, 128]
    assert w.num_prompts == [10 * c for c in w.max_concurrency]
    assert w.model_family == "qwen3-vl" and w.fixed_image_tokens() == 258
    assert w.max_running_requests == 128 and w.disable_radix_cache and w.context_length == 8192
    assert w.resolved_chunked_prefill_size == 16384 and w.max_prefill_tokens == 16384 and w.tp_size == 2
    assert DEFAULT_PRESET in preset_names() and "seeds-mi355x" not in preset_names()


def test_workload_toml_is_strict(tmp_path):
    p = tmp_path / "w.toml"
    p.write_text("[client]\nrandom_input_len = 512\nrandom_inptu_len = 3\n")
    with pytest.raises(InputError) as e:
        load_workload_file(str(p))
    assert "random_inptu_len" in str(e.value) and str(p) in str(e.value)
    p.write_text('colour = "red"\n')
    with pytest.raises(InputError, match="colour"):
        load_workload_file(str(p))


def test_workload_toml_sets_fields_and_options_win(tmp_path):
    p = tmp_path / "w.toml"
    p.write_text(
        '[client]\ndataset_name = "random"\nmax_concurrency = [2, 8]\nnum_prompts = [20, 80]\n'
        "[server]\nchunked-prefill-size = 2048\nenable_mixed_chunk = true\n[step_time]\ndecode_base_ms = 7\n"
    )
    w = workload_from_options(workload=str(p), random_input_len=300, max_concurrency="2,8")
    assert w.max_concurrency == [2, 8] and w.num_prompts == [20, 80]
    assert w.chunked_prefill_size == 2048 and w.enable_mixed_chunk and w.step.decode_base_ms == 7.0
    assert w.random_input_len == 300


def test_profile_server_table_is_read(tmp_path):
    p = tmp_path / "prof.toml"
    p.write_text(
        '[profile]\nname = "x"\nplatform = "cuda"\nhardware = "h100"\n'
        '[server]\nmax-running-requests = 48\nchunked-prefill-size = 4096\nattention-backend = "fa3"\n'
    )
    w = workload_from_options(profile=str(p))
    assert (w.max_running_requests, w.chunked_prefill_size, w.gpu_memory_gib) == (48, 4096, 80.0)
    w = workload_from_options(profile="mi355x")
    assert (w.tp_size, w.context_length, w.max_running_requests, w.disable_radix_cache) == (2, 8192, 128, True)
    assert w.resolved_chunked_prefill_size == 16384  # 288 GB MI355X


def test_profile_value_the_simulator_reads_is_checked(tmp_path):
    p = tmp_path / "prof.toml"
    p.write_text('[profile]\nname = "x"\nplatform = "cuda"\n[server]\nmax-running-requests = 0\n')
    with pytest.raises(InputError) as e:
        workload_from_options(profile=str(p))
    assert "[server].max_running_requests" in str(e.value) and str(p) in str(e.value)


@pytest.mark.parametrize(
    "opts,field,needle",
    [
        ({"random_input_len": -5}, "random_input_len", "greater than or equal to 1"),
        ({"random_output_len": -1}, "random_output_len", "greater than or equal to 0"),
        ({"random_range_ratio": 1.5}, "random_range_ratio", "less than or equal to 1"),
        ({"random_range_ratio": -0.1}, "random_range_ratio", "greater than or equal to 0"),
        ({"dataset_name": "sharegpt"}, "dataset_name", "'random-ids', 'random' or 'image'"),
        ({"model_family": "llava"}, "model_family", "qwen3-vl"),
        ({"dataset_name": "image", "image_resolution": "big"}, "image_resolution", "bad image resolution"),
        ({"dataset_name": "image", "image_resolution": "random:512x512"}, "image_resolution", "bad image resolution"),
        ({"max_concurrency": "4,0"}, "max_concurrency", "greater than or equal to 1"),
        ({"max_concurrency": "4,x"}, "max_concurrency", "not an integer"),
        ({"num_prompts": "10,20", "max_concurrency": "1,2,3"}, "num_prompts", "2 values for 3 concurrency levels"),
        ({"num_prompts": "1000000000"}, "num_prompts", "less than or equal to 10000000"),
        ({"num_prompts": "6000000", "max_concurrency": "8,16"}, "num_prompts", "above the limit of 10,000,000"),
        ({"seed": -1}, "seed", "greater than or equal to 0"),
        ({"seed": 2**32}, "seed", "less than or equal to 4294967295"),
        ({"random_input_len": 10**30}, "random_input_len", "less than or equal to 2147483647"),
        ({"request_rate": float("nan")}, "request_rate", "greater than 0"),
        ({"request_rate": 0.0}, "request_rate", "greater than 0"),
        ({"chunked_prefill_size": 0}, "chunked_prefill_size", "-1 to turn chunked prefill off"),
        ({"chunked_prefill_size": -7}, "chunked_prefill_size", "greater than or equal to -1"),
        ({"dp_size": 0}, "dp_size", "greater than or equal to 1"),
        ({"tp_size": -4}, "tp_size", "greater than or equal to 1"),
        ({"image_count": 10**6}, "image_count", "less than or equal to 1024"),
        ({"decode_base_ms": -1.0}, "decode_base_ms", "greater than 0"),
        ({"prefill_c0_ms": float("inf")}, "prefill_c0_ms", "finite"),
        ({"dataset_name": "image", "tokens_per_image": 2**31 - 1, "image_count": 2}, "random_input_len", "int32"),
    ],
)
def test_bad_option_is_one_line_naming_the_field(opts, field, needle):
    with pytest.raises(InputError) as e:
        workload_from_options(**opts)
    msg = str(e.value)
    assert e.value.field == field and e.value.where is None
    assert needle in msg and "\n" not in msg and len(msg) < 200


def test_unknown_preset_lists_presets():
    with pytest.raises(InputError, match="mi355x-multimodal-pr"):
        load_workload_file("no-such-preset")


def test_preset_text_names_its_source():
    from importlib import resources

    text = (resources.files("bcgtune") / "data" / "workloads" / f"{DEFAULT_PRESET}.toml").read_text()
    assert "the image benchmark of the qwen multimodal breakable-prefill pull request (sglang, mi355x)" in text.lower()
    assert "seeds" not in text.lower()


# ---- hostile workload files: one line naming the file and [table].key -------------------------
@pytest.mark.parametrize(
    "body,needles",
    [
        ('[client]\nrandom_input_len = "abc"\n', ["[client].random_input_len", "valid integer"]),
        ("[client]\nrandom_input_len = 99999999999999999999999\n", ["[client].random_input_len", "less than or equal"]),
        ("[client]\nseed = -1\n", ["[client].seed", "greater than or equal to 0"]),
        ("[client]\nnum_prompts = 0\n", ["[client].num_prompts[0]", "greater than or equal to 1"]),
        ("[client]\nnum_prompts = [10, 0]\nmax_concurrency = [1, 2]\n", ["[client].num_prompts[1]"]),
        ("[client]\nnum_prompts = nan\n", ["[client].num_prompts", "an integer or a list of integers, got nan"]),
        ('[client]\nmax_concurrency = "8"\n', ["[client].max_concurrency", "an integer or a list of integers"]),
        ("[client]\nnum_prompts = []\n", ["[client].num_prompts", "must have at least 1 item"]),
        (
            "[client]\nnum_prompts = [6000000, 6000000]\nmax_concurrency = [1, 2]\n",
            ["[client].num_prompts", "12,000,002 requests", "10,000,000"],
        ),
        ('[client]\nrequest_rate = "fast"\n', ["[client].request_rate", "valid number"]),
        ('[client]\nimage_resolution = "x"\ndataset_name = "image"\n', ["[client].image_resolution"]),
        ("[step_time]\ndecode_base_ms = -1\n", ["[step_time].decode_base_ms", "greater than 0"]),
        ("[step_time]\nprefill_c1_ms = -0.5\n", ["[step_time].prefill_c1_ms", "greater than or equal to 0"]),
        ("[step_time]\nprefill_floor_ms = nan\n", ["[step_time].prefill_floor_ms", "finite"]),
        ("[step_time]\nlevel_gap_s = inf\n", ["[step_time].level_gap_s", "finite"]),
        ('[server]\nenable_mixed_chunk = "yes"\n', ["[server].enable_mixed_chunk", "valid boolean"]),
        ("[server]\ndp_size = 100000\n", ["[server].dp_size", "less than or equal to 1024"]),
        (
            "[server]\nchunked-prefill-size = 1024\nchunked_prefill_size = 2048\n",
            ["[server].chunked_prefill_size", "same setting as [server].chunked-prefill-size"],
        ),
        ("client = 5\n", ["client", "must be a table"]),
        ("name = 5\n", ["name", "valid string"]),
        ('colour = "red"\n', ["colour", "unknown key"]),
        ("[client]\nrandom_inptu_len = 3\n", ["[client].random_inptu_len", "unknown key"]),
        ("[client\n", ["invalid TOML"]),
        ("a = " + "[" * 100_000 + "]" * 100_000 + "\n", ["invalid TOML"]),
    ],
)
def test_hostile_workload_file_is_one_line(tmp_path, body, needles):
    p = tmp_path / "w.toml"
    p.write_text(body)
    with pytest.raises(InputError) as e:
        load_workload_file(str(p))
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 400 and str(p) in msg
    for needle in needles:
        assert needle in msg


@pytest.mark.parametrize(
    "data,needle",
    [
        (b"[client]\nrandom_input_len = 5\n# \xff\xfe caf\xe9\n", "not UTF-8"),
        (b"\x00" * 4096, "binary data"),
    ],
)
def test_workload_file_bytes_that_are_not_toml(tmp_path, data, needle):
    p = tmp_path / "w.toml"
    p.write_bytes(data)
    with pytest.raises(InputError, match=needle) as e:
        load_workload_file(str(p))
    assert str(p) in str(e.value)


def test_workload_folder_and_missing_file(tmp_path):
    (tmp_path / "d.toml").mkdir()
    with pytest.raises(InputError, match="folder"):
        load_workload_file(str(tmp_path / "d.toml"))
    with pytest.raises(InputError, match="no such file"):
        load_workload_file(str(tmp_path / "missing.toml"))


def test_workload_file_accepts_kebab_keys_aliases_and_inf(tmp_path):
    p = tmp_path / "w.toml"
    p.write_text('[client]\nrandom-input-len = 300\nrequest_rate = "inf"\nnum_prompts = 12\n[server]\ntp = 4\ndp-size = 2\n')
    w = load_workload_file(str(p))
    assert (w.random_input_len, w.request_rate, w.num_prompts, w.tp_size, w.dp_size) == (300, math.inf, [12], 4, 2)
    assert w.name == "w"


def test_schema_names_match_the_rules():
    from typing import get_args

    from bcgtune.core.sim.image_tokens import MODEL_FAMILIES, ModelFamily

    assert set(get_args(ModelFamily)) == set(MODEL_FAMILIES)


def test_every_step_time_key_is_in_the_schema():
    from dataclasses import fields as dc_fields

    assert {f.name for f in dc_fields(StepTimeModel)} - {"prefill_curve"} == set(StepTimeSettings.model_fields)
    assert set(WorkloadSettings.model_fields) == set(Workload().settings())
