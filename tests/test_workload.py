"""Workload: bench_serving's sampling rule, Qwen-VL image tokens, sources and validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bcgtune.adapters.workload import (
    Workload,
    default_workload,
    image_tokens,
    load_workload_file,
    parse_random_resolution,
    parse_resolution,
    preset_names,
    sample_lengths,
    smart_resize,
    workload_from_options,
)
from bcgtune.errors import InputError


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
def test_default_workload_is_the_seeds_benchmark():
    w = default_workload()
    assert w.dataset_name == "image" and w.image_resolution == "512x512" and w.image_count == 1
    assert (w.random_input_len, w.random_output_len, w.random_range_ratio) == (1024, 128, 0.8)
    assert w.max_concurrency == [4, 16, 32, 64, 128]
    assert w.num_prompts == [10 * c for c in w.max_concurrency]
    assert w.model_family == "qwen3-vl" and w.fixed_image_tokens() == 258
    assert w.max_running_requests == 128 and w.disable_radix_cache and w.context_length == 8192
    assert w.resolved_chunked_prefill_size == 16384 and w.max_prefill_tokens == 16384 and w.tp_size == 2
    assert "mi355x-multimodal-pr" in preset_names()


def test_workload_toml_is_strict(tmp_path):
    p = tmp_path / "w.toml"
    p.write_text('[client]\nrandom_input_len = 512\nrandom_inptu_len = 3\n')
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
        '[server]\nchunked-prefill-size = 2048\nenable_mixed_chunk = true\n[step_time]\ndecode_base_ms = 7\n'
    )
    w = workload_from_options(workload=str(p), random_input_len=300, max_concurrency="2,8")
    assert w.max_concurrency == [2, 8] and w.num_prompts == [20, 80]
    assert w.chunked_prefill_size == 2048 and w.enable_mixed_chunk and w.step.decode_base_ms == 7.0
    assert w.random_input_len == 300


def test_profile_server_table_is_read(tmp_path):
    p = tmp_path / "prof.toml"
    p.write_text('[server]\nmax_running_requests = 48\nchunked_prefill_size = 4096\ncontext_length = 4096\n')
    try:
        w = workload_from_options(profile=str(p))
    except InputError as exc:  # a stricter profile loader may want more fields; then it says so in one line
        assert "\n" not in str(exc)
        return
    assert w.max_running_requests == 48 and w.chunked_prefill_size == 4096


@pytest.mark.parametrize(
    "opts,needle",
    [
        ({"random_input_len": -5}, "random-input-len"),
        ({"random_output_len": -1}, "random-output-len"),
        ({"random_range_ratio": 1.5}, "random-range-ratio"),
        ({"random_range_ratio": -0.1}, "random-range-ratio"),
        ({"dataset_name": "sharegpt"}, "unknown dataset"),
        ({"model_family": "llava"}, "unknown model family"),
        ({"dataset_name": "image", "image_resolution": "big"}, "bad image resolution"),
        ({"dataset_name": "image", "image_resolution": "random:512x512"}, "bad image resolution"),
        ({"max_concurrency": "4,0"}, "max-concurrency"),
        ({"max_concurrency": "4,x"}, "not an integer"),
        ({"num_prompts": "10,20", "max_concurrency": "1,2,3"}, "num-prompts"),
    ],
)
def test_bad_input_is_one_clear_line(opts, needle):
    with pytest.raises(InputError) as e:
        workload_from_options(**opts)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg


def test_unknown_preset_lists_presets():
    with pytest.raises(InputError, match="mi355x-multimodal-pr"):
        load_workload_file("no-such-preset")
