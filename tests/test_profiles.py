"""Profiles: strict schema (errors name file and key), built-ins, atomic bucket writes."""

import os
from pathlib import Path

import pytest

from bcgtune.errors import ExternalError, InputError
from bcgtune.files.profile_file import (
    builtin_profile_names,
    load_profile,
    parse_profile,
    write_profile_buckets,
)

ROOT = Path(__file__).resolve().parent.parent
SEED_BUCKETS = [256, 512, 768, 1024, 1280, 1408, 2560, 2752, 3840, 4096, 5376]

GOOD = """
[profile]
name = "t"
platform = "cuda"
model = "m"
[server]
tp-size = 2
disable_radix_cache = true
[buckets]
list = [4, 8, 16]
objective = "time"
"""


def test_one_copy_of_the_builtin_profiles():
    # profiles/ is the one source; the package data is made from it at build time, never committed
    top = ROOT / "profiles"
    assert top.is_dir() and not top.is_symlink()
    assert {"mi355x.toml", "h200.toml"} <= {p.name for p in top.glob("*.toml")}
    assert not (ROOT / "bcgtune" / "data" / "profiles").exists() or not _tracked("bcgtune/data/profiles")
    assert {"mi355x", "h200"} <= set(builtin_profile_names())


def _tracked(path: str) -> bool:
    import subprocess

    r = subprocess.run(["git", "ls-files", path], cwd=ROOT, capture_output=True, text=True)
    return r.returncode == 0 and bool(r.stdout.strip())


def test_the_built_package_carries_an_exact_copy_of_the_profiles(tmp_path):
    # setup.py's build step, as pip and uv run it when they build the wheel
    import subprocess
    import sys

    pytest.importorskip("setuptools")
    r = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path / "lib")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    built = tmp_path / "lib" / "bcgtune" / "data" / "profiles"
    source = sorted((ROOT / "profiles").glob("*.toml"))
    assert source and sorted(p.name for p in built.glob("*.toml")) == [p.name for p in source]
    for p in source:
        assert (built / p.name).read_bytes() == p.read_bytes()


def test_mi355x_reproduces_the_seeds_server():
    p = load_profile("mi355x")
    assert (p.platform, p.model, p.hardware) == ("rocm", "amd/Qwen3.8-Flash-Next-Quark-MXFP4", "mi355x")
    assert p.server == {
        "tp_size": 2,
        "ep_size": 2,
        "attention_backend": "aiter",
        "linear_attn_backend": "triton",
        "context_length": 8192,
        "max_running_requests": 128,
        "disable_radix_cache": True,
        "mm_enable_dp_encoder": True,
        "cuda_graph_backend_prefill": "breakable",
    }
    assert p.buckets == SEED_BUCKETS and p.env == {}


def test_builtin_name_and_path():
    a = load_profile("h200")
    b = load_profile(str(ROOT / "profiles" / "h200.toml"))
    assert a.server == b.server and a.platform == "cuda" and a.buckets is None
    with pytest.raises(InputError, match="no built-in profile"):
        load_profile("nope")
    with pytest.raises(InputError, match="no such profile file"):
        load_profile("./nope.toml")


def test_kebab_and_snake_normalized():
    p = parse_profile(GOOD, "x.toml")
    assert p.server == {"tp_size": 2, "disable_radix_cache": True}
    assert p.buckets == [4, 8, 16] and p.provenance == {"objective": "time"}
    again = parse_profile(p.to_toml(), "y.toml")
    assert (again.server, again.buckets, again.provenance) == (p.server, p.buckets, p.provenance)


@pytest.mark.parametrize(
    "text, key",
    [
        (GOOD + "\n[extra]\na = 1\n", "[extra]"),
        (GOOD.replace('model = "m"', 'model = "m"\ncolour = "red"'), "[profile].colour"),
        (GOOD.replace('platform = "cuda"', 'platform = "metal"'), "[profile].platform"),
        (GOOD.replace('platform = "cuda"', "platform = 1"), "[profile].platform"),
        (GOOD.replace("tp-size = 2", "tp-size = 2\ntp_size = 4"), "[server].tp_size"),
        (GOOD.replace("tp-size = 2", "tp-size = {a = 1}"), "[server].tp-size"),
        (GOOD.replace("tp-size = 2", "cuda-graph-bs-prefill = [4, 8]"), "[server].cuda-graph-bs-prefill"),
        (GOOD.replace("tp-size = 2", 'model-path = "x"'), "[server].model-path"),
        (GOOD.replace("tp-size = 2", 'cuda-graph-config = \'{"prefill": {"bs": [4]}}\''), "[server].cuda-graph-config"),
        (GOOD.replace("list = [4, 8, 16]", "list = [4, 16, 8]"), "[buckets].list"),
        (GOOD.replace("list = [4, 8, 16]", "list = [4, 4, 8]"), "[buckets].list"),
        (GOOD.replace("list = [4, 8, 16]", "list = [0, 8]"), "[buckets].list"),
        (GOOD.replace("list = [4, 8, 16]", "list = [4, 8.5]"), "[buckets].list"),
        (GOOD.replace("list = [4, 8, 16]", 'list = "4 8"'), "[buckets].list"),
        (GOOD.replace('objective = "time"', "objective = 3"), "[buckets].objective"),
        (GOOD.replace('objective = "time"', 'flavour = "x"'), "[buckets].flavour"),
        (GOOD + "\n[env]\nHIP_X = 1\n", "[env].HIP_X"),
    ],
)
def test_strictness_names_file_and_key(text, key):
    with pytest.raises(InputError) as ei:
        parse_profile(text, "bad.toml")
    assert ei.value.where.startswith("bad.toml") and key in ei.value.where, str(ei.value)


def test_load_names_the_file(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text(GOOD.replace("tp-size = 2", "tp-size = true\nx = [[1]]"))
    with pytest.raises(InputError) as ei:
        load_profile(str(f))
    assert str(f) in str(ei.value) and "[server].x" in str(ei.value)


def test_write_updates_only_buckets_and_keeps_comments(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text((ROOT / "profiles" / "mi355x.toml").read_text())
    before = f.read_text()
    prof = write_profile_buckets(f, [128, 256, 512], {"objective": "hit-rate", "trace_sha256": "ab" * 32, "max_buckets": 3})
    after = f.read_text()
    assert prof.buckets == [128, 256, 512] and prof.provenance["max_buckets"] == 3
    head = before.split("[buckets]")[0]
    assert after.startswith(head)  # [profile], [server], [env] and their comments untouched
    again = load_profile(str(f))
    assert again.buckets == [128, 256, 512] and again.server == load_profile("mi355x").server
    assert "source" not in again.provenance  # provenance describes the new list only
    assert [p.name for p in tmp_path.iterdir()] == ["mine.toml"]  # no temp file left


def test_write_creates_from_base(tmp_path):
    f = tmp_path / "h200-tuned.toml"
    prof = write_profile_buckets(f, [256, 512, 1024], {"tool_version": "0.1.0"}, base_profile="h200")
    assert prof.name == "h200-tuned" and prof.buckets == [256, 512, 1024]
    text = f.read_text()
    assert "# 1x NVIDIA H200" in text  # the base's comments come along
    assert load_profile(str(f)).server == load_profile("h200").server
    with pytest.raises(InputError, match="base profile"):
        write_profile_buckets(tmp_path / "other.toml", [4])


def test_write_is_atomic_on_failure(tmp_path, monkeypatch):
    f = tmp_path / "p.toml"
    f.write_text(GOOD)
    with pytest.raises(InputError):
        write_profile_buckets(f, [8, 4])  # bad list: nothing written
    with pytest.raises(InputError):
        write_profile_buckets(f, [8], {"colour": "x"})
    assert f.read_text() == GOOD

    import bcgtune.fileio as fileio

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(fileio.os, "replace", boom)
    with pytest.raises(ExternalError, match="disk full"):
        write_profile_buckets(f, [8, 16])
    assert f.read_text() == GOOD and sorted(os.listdir(tmp_path)) == ["p.toml"]


# ---------------------------------------------------------------- SGLang's short flags
def test_short_flags_are_stored_under_the_full_name():
    p = parse_profile(GOOD.replace("tp-size = 2", "tp = 2\ndp = 2\nep = 2\ntensor-parallel-size-x = 1"), "x.toml")
    assert p.server == {"tp_size": 2, "dp_size": 2, "ep_size": 2, "tensor_parallel_size_x": 1, "disable_radix_cache": True}
    assert "tp-size = 2" in p.to_toml() and "\ntp = " not in p.to_toml()
    with pytest.raises(InputError) as ei:
        parse_profile(GOOD.replace("tp-size = 2", "tp-size = 2\ntp = 4"), "x.toml")
    assert "same flag as [server].tp-size" in str(ei.value) and "[server].tp" in ei.value.where
    with pytest.raises(InputError):
        parse_profile(GOOD.replace("tp-size = 2", "tp = 2\ntensor-parallel-size = 2"), "x.toml")


def test_snake_is_the_one_flag_normalizer():
    from bcgtune.files.profile_file import flag_name, snake

    assert [snake(k) for k in ("--tp-size", "tp-size", "tp_size", "tp", "--tp", " dp ", "attention-data-parallel-size")] == [
        "tp_size",
        "tp_size",
        "tp_size",
        "tp_size",
        "tp_size",
        "dp_size",
        "attn_dp_size",
    ]
    assert snake("mem-frac") == "mem_frac"  # other abbreviations pass through, for the parser check to refuse
    assert flag_name("tp") == "--tp-size"


@pytest.mark.sglang
def test_flag_aliases_agree_with_sglangs_parser():
    """Each short form, on SGLang's own parser (prefix matching on, as `launch_server` runs
    it), lands in the same setting as the flag bcgtune writes for it."""
    pytest.importorskip("sglang.srt.server_args")
    import argparse

    from sglang.srt.server_args import ServerArgs

    from bcgtune.files.profile_file import FLAG_ALIASES, flag_name

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    for short, full in FLAG_ALIASES.items():
        ns, rest = parser.parse_known_args(["--model-path", "m", "--" + short.replace("_", "-"), "3"])
        assert not rest and getattr(ns, full) == 3, short
        assert parser._option_string_actions[flag_name(full)].dest == full


@pytest.mark.sglang
def test_serve_accepts_short_flags_and_refuses_other_abbreviations():
    pytest.importorskip("sglang.srt.server_args")
    from bcgtune.adapters.sglang.launcher import build_server_command, check_command_flags

    p = parse_profile(GOOD.replace("tp-size = 2", "tp = 2\ndp = 2"), "x.toml")
    cmd = build_server_command(p)
    assert cmd.argv[cmd.argv.index("--tp-size") + 1] == "2" and "--dp-size" in cmd.argv
    check_command_flags(cmd)
    p = parse_profile(GOOD.replace("tp-size = 2", "tp-si = 2"), "x.toml")
    with pytest.raises(InputError, match="abbreviation of --tp-size"):
        check_command_flags(build_server_command(p))


# ---------------------------------------------------------------- editing keeps the document
def test_write_keeps_comments_before_the_next_table_and_drops_the_old_lists_keys(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text(
        '# mine\n[profile]\nname = "p"\nplatform = "cuda"\n\n[buckets]  # tuned\n# about the old list\n'
        'list = [4, 8]\nsource = "old"\n\n# the launch environment\n[env]\nA = "1"\n'
    )
    write_profile_buckets(f, [16, 32], {"objective": "padding"})
    text = f.read_text()
    assert text == (
        '# mine\n[profile]\nname = "p"\nplatform = "cuda"\n\n[buckets]  # tuned\nlist = [16, 32]\nobjective = "padding"\n'
        '\n# the launch environment\n[env]\nA = "1"\n'
    )


def test_write_keeps_crlf_line_endings(tmp_path):
    f = tmp_path / "p.toml"
    f.write_bytes(GOOD.replace("\n", "\r\n").encode())
    write_profile_buckets(f, [16, 32], {"objective": "padding"})
    data = f.read_bytes()
    assert data.count(b"\n") == data.count(b"\r\n") > 5  # no bare LF: one line ending throughout
    assert load_profile(str(f)).buckets == [16, 32]


def test_write_a_profile_whose_description_holds_a_buckets_line(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text('[profile]\nname = "p"\nplatform = "cuda"\ndescription = """tuned:\n[buckets]\nsee below"""\n')
    assert parse_profile(f.read_text(), "p.toml").description == "tuned:\n[buckets]\nsee below"
    write_profile_buckets(f, [16, 32])
    p = load_profile(str(f))
    assert p.buckets == [16, 32] and p.description == "tuned:\n[buckets]\nsee below"
    assert f.read_text().count("[buckets]") == 2  # the description's line and the new table


def test_a_profile_written_from_a_builtin_claims_nothing_about_its_old_list(tmp_path):
    """The built-ins' descriptions and comments hold whether or not a list is set."""
    for base in builtin_profile_names():
        f = tmp_path / f"{base}-tuned.toml"
        write_profile_buckets(f, [256, 512], {"objective": "padding"}, base_profile=base)
        text = f.read_text().lower()
        assert "no [buckets]" not in text and 'default ladder"' not in text
        assert load_profile(str(f)).description == load_profile(base).description
        assert "default ladder" not in load_profile(base).description.lower()


def test_server_flags_written_with_the_list_keep_the_profiles_own_spelling(tmp_path):
    """Flags written with a list (the launch it was priced for) replace the profile's own
    keys however they are spelled (tp_size or tp-size), never add the same flag twice."""
    f = tmp_path / "p.toml"
    f.write_text(
        '[profile]\nname = "p"\nplatform = "cuda"\nhardware = "h200"\nmodel = "m"\n\n'
        "[server]\ntp_size = 1  # one GPU\nchunked-prefill-size = 8192\n"
    )
    prof = write_profile_buckets(f, [256, 512], {}, server={"tp-size": 2, "chunked-prefill-size": 16384, "dp-size": 2})
    text = f.read_text()
    assert "tp_size = 2" in text and "tp-size" not in text and text.count("chunked-prefill-size") == 1
    assert prof.server["tp_size"] == 2 and prof.server["chunked_prefill_size"] == 16384 and prof.server["dp_size"] == 2
