"""The hostile inputs of the attacker's suite (tests/test_hostile_*.py), generated on demand
instead of committed: huge and bombs (compressed, deflated, archive directories, values),
NaN and infinities, unicode (non-ASCII digits, right-to-left marks, byte order marks,
invalid UTF-8), truncated (JSON, gzip, zip, npz), wrong kinds (a log as a trace, a trace as
a profile), and the good inputs they are variants of, made from files in tests/data/.

`Fixtures(root).path(name)` builds fixture `name` once under `root` and returns its path;
every name is a key of BUILDERS. Building everything takes a few seconds and under 100 MB of
disk (the bombs are small: a deflate stream of zeros is repeated, never compressed whole).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Callable

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
REAL_LOG = HERE / "data" / "sglang-logs" / "24_newest_decode_graph_end_startup_and_load.log"
DP_LOG = HERE / "data" / "logs" / "e7_dp_attention_two_ranks.log"
GOOD_CSV = "size,count\n100,5\n300,2\n700,1\n2000,3\n"
SMALL_CSV = HERE / "data" / "docs" / "small.csv"  # priced by tiny-cal.json
TINY_CAL = HERE / "data" / "docs" / "tiny-cal.json"
CSV_CAL = HERE / "data" / "calibrations" / "whole_forward_qwen3-8b_h200.csv"
H200 = REPO / "profiles" / "h200.toml"
WORKLOAD = REPO / "bcgtune" / "data" / "workloads" / "chat-text-h200.toml"
MODEL_DIR = HERE / "data" / "models" / "qwen3-moe-tiny"

Builder = Callable[[Path, "Fixtures"], None]
BUILDERS: dict[str, Builder] = {}


class Fixtures:
    """Fixtures built on demand under `root` (one folder per process: tests share them and
    must never change them; the suite checks that they did not)."""

    def __init__(self, root: Path):
        self.root = root

    def path(self, name: str) -> Path:
        p = self.root / name
        if not p.exists() and not p.is_symlink():
            BUILDERS[name](p, self)
        return p


def fixture(name: str) -> Callable[[Builder], Builder]:
    def add(fn: Builder) -> Builder:
        assert name not in BUILDERS, name
        BUILDERS[name] = fn
        return fn

    return add


def data(name: str, content: bytes | str | Callable[[], bytes]) -> None:
    """A fixture that is these bytes (text is UTF-8)."""

    def build(p: Path, fx: Fixtures) -> None:
        raw = content() if callable(content) else content
        p.write_bytes(raw.encode("utf-8") if isinstance(raw, str) else raw)

    fixture(name)(build)


def copy(name: str, source: Path) -> None:
    fixture(name)(lambda p, fx: shutil.copy(source, p))


# ---- the raw material of hostile bytes -----------------------------------------------------
def _random(n: int, seed: int = 7) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def gzip_bomb(unit: bytes, total: int) -> bytes:
    """A gzip file of `total` bytes of `unit` repeated: one member compressed once and
    repeated (gzip reads concatenated members as one stream)."""
    member_bytes = 16 << 20
    member = gzip.compress(unit * (member_bytes // len(unit)), compresslevel=9, mtime=0)
    return member * max(1, total // member_bytes)


def deflated_zeros(head: bytes, zeros: int, chunk: int = 1_000_000) -> bytes:
    """A raw deflate stream of `head` then `zeros` zero bytes, built from one flushed block of
    `chunk` zeros repeated (after a full flush the compressor starts afresh, so each repeat is
    the same bytes): an 8 GB stream is 8 MB and takes milliseconds."""
    assert zeros % chunk == 0
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    start = c.compress(head) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(b"\0" * chunk) + c.flush(zlib.Z_FULL_FLUSH)
    again = c.compress(b"\0" * chunk) + c.flush(zlib.Z_FULL_FLUSH)
    assert block == again
    return start + block * (zeros // chunk) + c.flush()


def write_zip(path: Path, members: list[tuple[str, bytes, int, int]]) -> None:
    """A zip archive written by hand from (name, raw deflate data, crc32, size once inflated)
    members, each with a zip64 record of its sizes (so a member may claim more than 4 GiB)."""
    buf = io.BytesIO()
    central = []
    for name, comp, crc, size in members:
        offset = buf.tell()
        n = name.encode("utf-8")
        extra = struct.pack("<HHQQ", 1, 16, size, len(comp))
        head = struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, 8, 0, 0x21, crc, 0xFFFFFFFF, 0xFFFFFFFF, len(n), len(extra))
        buf.write(head + n + extra + comp)
        central.append(
            struct.pack(
                "<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, 8, 0, 0x21, crc, 0xFFFFFFFF, 0xFFFFFFFF, len(n), len(extra),
                0, 0, 0, 0, offset,
            ) + n + extra
        )  # fmt: skip
    directory = b"".join(central)
    start = buf.tell()
    buf.write(directory)
    count = min(len(central), 0xFFFF)
    buf.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, count, count, len(directory), start, 0))
    path.write_bytes(buf.getvalue())


def _deflate(raw: bytes) -> tuple[bytes, int, int]:
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    return c.compress(raw) + c.flush(), zlib.crc32(raw), len(raw)


def _npy_header(descr: str, rows: int) -> bytes:
    h = io.BytesIO()
    np.lib.format.write_array_header_1_0(h, {"descr": descr, "fortran_order": False, "shape": (rows,)})
    return h.getvalue()


def _npz_members(fx: Fixtures) -> dict[str, bytes]:
    with zipfile.ZipFile(fx.path("trace.npz")) as zf:
        return {i.filename: zf.read(i) for i in zf.infolist()}


def _npz(path: Path, members: dict[str, bytes]) -> None:
    write_zip(path, [(name, *_deflate(raw)) for name, raw in members.items()])


def _trace_doc(fx: Fixtures) -> dict:
    return json.loads(fx.path("trace.json").read_text())


def _json_variant(name: str, change: Callable[[dict], object]) -> None:
    def build(p: Path, fx: Fixtures) -> None:
        doc = _trace_doc(fx)
        change(doc)
        p.write_text(json.dumps(doc, allow_nan=True))

    fixture(name)(build)


# ---- generic hostile bytes (any kind of input) ------------------------------------------------
data("any.empty", b"")
data("any.blank", b"  \n\n\t \r\n")
data("any.binary", lambda: _random(4096))
data("any.zeros", b"\0" * 100_000)
data("any.nul_late", b"x" * 70_000 + b"\0tail\n")  # a NUL past the first 64 KiB
data("any.bad_utf8", b"size,count\n100,1\n\xff\xfe\xfa,2\n")
data("any.bom_only", b"\xef\xbb\xbf")
data("any.utf16", "size,count\n100,1\n".encode("utf-16"))
data("any.rtl", "\u202e1,2\u202c\nsize,count\n")
data("any.long_line", b"y" * (3 << 20))  # 3 MiB on one line, no newline
data("any.gz_zeros", lambda: gzip_bomb(b"\0", 64 << 20))  # binary once decompressed
data("any.gz_truncated", lambda: gzip.compress(GOOD_CSV.encode() * 50, mtime=0)[:-20])
data("any.gz_corrupt", lambda: b"\x1f\x8b\x08\x00" + _random(300))
data("any.zip_truncated", lambda: _zip_of({"a.log": REAL_LOG.read_bytes()})[:-30])
data("any.json_deep", "[" * 100_000 + "]" * 100_000)
data("any.toml_deep", "a = " + "[" * 100_000 + "]" * 100_000 + "\n")
data("any.json_bigint", "[" + "9" * 5000 + "]")
data("any.python", "import os\nos.system('false')\n")
data("any.html", "<!doctype html><html><body>404 Not Found</body></html>\n")
fixture("any.folder")(lambda p, fx: (p.mkdir(), (p / "x.csv").write_text(GOOD_CSV)))
fixture("any.empty_folder")(lambda p, fx: p.mkdir())
fixture("any.loop_link")(lambda p, fx: os.symlink(p, p))
fixture("any.dangling_link")(lambda p, fx: os.symlink(p.parent / "nowhere", p))


def _zip_of(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, raw in files.items():
            zf.writestr(name, raw)
    return buf.getvalue()


# ---- traces ------------------------------------------------------------------------------------
data("trace.csv", GOOD_CSV)
copy("trace.small", SMALL_CSV)
data("trace.plain", "# sizes\n100\n300\n\n700 # a comment\n")
data("trace.list", "[100, 300, 700, 2000]")
data("trace.csv_gz", lambda: gzip.compress(GOOD_CSV.encode(), mtime=0))
data("trace.csv_bom_crlf", "\ufeffsize,count\r\n100,5\r\n300,2\r\n")


@fixture("trace.json")
def _trace_json(p: Path, fx: Fixtures) -> None:
    from bcgtune.files.trace_file import save_trace
    from bcgtune.services.trace import trace_logs

    save_trace(trace_logs([str(REAL_LOG)]), str(p))


@fixture("trace.npz")
def _trace_npz(p: Path, fx: Fixtures) -> None:
    from bcgtune.files.trace_file import load_trace, save_trace

    save_trace(load_trace(str(fx.path("trace.json"))), str(p))


data("trace.csv_nan", "size,count\nnan,1\n100,2\n")
data("trace.csv_inf", "size,count\n100,inf\n")
data("trace.csv_negative", "size,count\n-100,1\n")
data("trace.csv_zero", "size,count\n0,1\n")
data("trace.csv_huge", f"size,count\n{2**70},1\n")
data("trace.csv_count_huge", f"size,count\n100,{2**40}\n")
data("trace.csv_fraction", "size,count\n100.5,1\n")
data("trace.csv_fullwidth", "size,count\n１００,1\n")
data("trace.csv_arabic", "size,count\n١٠٠,1\n")
data("trace.csv_no_header", "100,5\n300,2\n")
data("trace.csv_header_only", "size,count\n")
data("trace.csv_short_row", "size,count\n100\n")
data("trace.csv_stray_quote", 'size,count\n"100,5\n300,2\n')
data("trace.csv_bare_cr", "size,count\n100,5\r300,2\n")
data("trace.csv_10k_digits", "size,count\n" + "9" * 10_000 + ",1\n")
data("trace.plain_nan", "100\nnan\n")
data("trace.plain_fullwidth", "１\n")
data("trace.plain_words", "hello world\n")
data("trace.list_strings", '["100", "300"]')
data("trace.list_bools", "[true, 100]")
data("trace.list_nan", "[100, NaN]")
data("trace.list_empty", "[]")
data("trace.list_nested", "[[100]]")
data("trace.list_floats", "[100.0, 1e300]")
data("trace.list_values_bomb", lambda: b"[" + b"1," * (1 << 25) + b"1]")  # 64 MiB: 2^25 + 1 values
data("trace.gz_bomb", lambda: gzip_bomb(b"1\n", 600 << 20))  # 600 MiB of text decompressed
_HEAD = '{"format_version": 1, "kind": "bcgtune.prefill-trace", '
data("trace.json_truncated", _HEAD + '"histogram": {"sizes": [1')
data("trace.json_nan_literal", _HEAD + '"histogram": {"sizes": [NaN], "counts": [1]}}')
data("trace.json_infinity", _HEAD + '"histogram": {"sizes": [100], "counts": [Infinity]}}')
data("trace.json_other_kind", _HEAD.replace("prefill-trace", "calibration") + '"histogram": {"sizes": [1], "counts": [1]}}')
data("trace.json_future", _HEAD.replace(": 1,", ": 99,", 1) + '"histogram": {"sizes": [1], "counts": [1]}}')
data("trace.json_no_histogram", '{"format_version": 1, "kind": "bcgtune.prefill-trace"}')
data("trace.json_not_object", '"just a string"')
_json_variant("trace.json_sizes_mismatch", lambda d: d["histogram"]["counts"].append(1))
_json_variant("trace.json_dup_size", lambda d: d["histogram"].update(sizes=[5, 5], counts=[1, 1]))
_json_variant("trace.json_negative_size", lambda d: d["histogram"]["sizes"].__setitem__(0, -1))
_json_variant("trace.json_float_count", lambda d: d["histogram"]["counts"].__setitem__(0, 1.5))
_json_variant("trace.json_bool_count", lambda d: d["histogram"]["counts"].__setitem__(0, True))
_json_variant("trace.json_column_nan", lambda d: d["batches"]["forward_tokens"].__setitem__(0, float("nan")))
_json_variant("trace.json_column_short", lambda d: d["batches"]["forward_tokens"].pop())
_json_variant("trace.json_group_oob", lambda d: d["batches"]["group"].__setitem__(0, 7))
_json_variant("trace.json_chunk_negative", lambda d: d["meta"]["startup"][0].__setitem__("chunked_prefill_size", -7))
_json_variant("trace.json_chunk_1e30", lambda d: d["meta"]["startup"][0].__setitem__("chunked_prefill_size", 1e30))
_json_variant("trace.json_unicode_source", lambda d: d["sources"][0].__setitem__("path", "\u202eevil\u0000.log"))
_json_variant("trace.json_setting_huge", lambda d: d["groups"][0]["settings"].__setitem__("tp_size", 2**40))
_json_variant("trace.json_groups_dont_add", lambda d: d["groups"][0]["histogram"]["counts"].__setitem__(0, 99))
_json_variant("trace.json_mix_more_requests", lambda d: d["groups"][0]["mix"]["requests"].__setitem__(0, 10**6))


@fixture("trace.npz_bomb_rows")
def _npz_bomb_rows(p: Path, fx: Fixtures) -> None:
    """The reproduction: a valid header declaring 10^9 int64 rows of deflated zeros (8 GB
    inflated, 8 MB stored) where the document counts 14 batches."""
    members = [(n, *_deflate(raw)) for n, raw in _npz_members(fx).items() if n != "batches.forward_tokens.npy"]
    head = _npy_header("<i8", 10**9)
    members.append(("batches.forward_tokens.npy", deflated_zeros(head, 8 * 10**9), 0, len(head) + 8 * 10**9))
    write_zip(p, members)


@fixture("trace.npz_bomb_count")
def _npz_bomb_count(p: Path, fx: Fixtures) -> None:
    """The document itself claims 2^33 batches, and a column as many rows (zeros, deflated)."""
    m = _npz_members(fx)
    doc = json.loads(np.lib.format.read_array(io.BytesIO(m["document.npy"])).tobytes())
    doc["histogram"] = {"sizes": [1, 2, 3, 4], "counts": [2**31 - 1] * 4}
    doc["groups"] = []
    raw = json.dumps(doc).encode()
    doc_npy = io.BytesIO()
    np.lib.format.write_array(doc_npy, np.frombuffer(raw, np.uint8))
    rows = 4 * (2**31 - 1)
    head = _npy_header("|i1", rows)
    column = deflated_zeros(head, 8 * 10**9)  # 8 GB of its 8.6: a reader that trusts the header reads them all
    write_zip(p, [("document.npy", *_deflate(doc_npy.getvalue())), ("batches.graph.npy", column, 0, len(head) + rows)])


@fixture("trace.npz_many_members")
def _npz_many(p: Path, fx: Fixtures) -> None:
    m = _npz_members(fx)
    members = [(n, *_deflate(raw)) for n, raw in m.items()]
    empty = _deflate(b"")
    members += [(f"x{i}.npy", *empty) for i in range(5000)]
    write_zip(p, members)


@fixture("trace.npz_truncated")
def _npz_truncated(p: Path, fx: Fixtures) -> None:
    raw = fx.path("trace.npz").read_bytes()
    p.write_bytes(raw[: len(raw) // 2])


@fixture("trace.npz_no_document")
def _npz_no_doc(p: Path, fx: Fixtures) -> None:
    m = _npz_members(fx)
    del m["document.npy"]
    _npz(p, m)


@fixture("trace.npz_pickled")
def _npz_pickled(p: Path, fx: Fixtures) -> None:
    m = _npz_members(fx)
    buf = io.BytesIO()
    np.save(buf, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    m["batches.line.npy"] = buf.getvalue()
    _npz(p, m)


@fixture("trace.npz_doc_binary")
def _npz_doc_binary(p: Path, fx: Fixtures) -> None:
    m = _npz_members(fx)
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.frombuffer(_random(500), np.uint8))
    m["document.npy"] = buf.getvalue()
    _npz(p, m)


@fixture("trace.npz_column_nan")
def _npz_column_nan(p: Path, fx: Fixtures) -> None:
    m = _npz_members(fx)
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.full(14, np.nan))
    m["batches.forward_tokens.npy"] = buf.getvalue()
    _npz(p, m)


@fixture("trace.zip_of_log")  # an archive given where a trace is read
def _zip_of_log(p: Path, fx: Fixtures) -> None:
    p.write_bytes(_zip_of({"a.log": REAL_LOG.read_bytes()}))


copy("trace.log_as_trace", REAL_LOG)
copy("trace.profile_as_trace", H200)


# ---- server logs ---------------------------------------------------------------------------
copy("log.good", REAL_LOG)
copy("log.dp", DP_LOG)
data("log.gz", lambda: gzip.compress(REAL_LOG.read_bytes(), mtime=0))
data("log.gz_truncated", lambda: gzip.compress(REAL_LOG.read_bytes(), mtime=0)[:-200])
data("log.no_prefill", "[2026-01-01 00:00:00] server started\nnothing else\n")
data("log.long_line_then_good", lambda: b"z" * (3 << 20) + b"\n" + REAL_LOG.read_bytes())
data("log.crlf", lambda: REAL_LOG.read_bytes().replace(b"\n", b"\r\n"))
data("log.bad_utf8_lines", lambda: REAL_LOG.read_bytes().replace(b"Prefill batch", b"Prefill \xff\xfe batch", 3))
data("log.huge_numbers", "[2026-01-01 00:00:00] Prefill batch, #new-seq: 1, #new-token: " + "9" * 400 + ", cuda graph: True\n")
data("log.negative", "[2026-01-01 00:00:00] Prefill batch, #new-seq: -1, #new-token: -100, cuda graph: True\n")
data("log.nan", "[2026-01-01 00:00:00] Prefill batch, #new-seq: nan, #new-token: nan, cuda graph: True\n")
data("log.fullwidth", "[2026-01-01 00:00:00] Prefill batch, #new-seq: １, #new-token: １００, cuda graph: True\n")
data("log.rtl", "[2026-01-01 00:00:00] \u202ePrefill batch, #new-seq: 1, #new-token: 100, cuda graph: True\n")
data("log.gz_bomb", lambda: gzip_bomb(b"no prefill here\n", 256 << 20))  # 256 MiB of lines, no batch
data("log.gz_one_line", lambda: gzip_bomb(b"y", 1 << 30))  # 1 GiB on one line, decompressed


@fixture("log.folder")
def _log_folder(p: Path, fx: Fixtures) -> None:
    p.mkdir()
    shutil.copy(REAL_LOG, p / "a.log")
    (p / "sub").mkdir()
    shutil.copy(DP_LOG, p / "sub" / "b.log")
    (p / "notes.md").write_text("not a log")


@fixture("log.folder_binary")
def _log_folder_binary(p: Path, fx: Fixtures) -> None:
    p.mkdir()
    (p / "a.log").write_bytes(_random(2000))


@fixture("log.folder_no_logs")
def _log_folder_no_logs(p: Path, fx: Fixtures) -> None:
    p.mkdir()
    (p / "readme.md").write_text("nothing")


data("log.zip", lambda: _zip_of({"a.log": REAL_LOG.read_bytes(), "sub/b.log": DP_LOG.read_bytes()}))
data("log.zip_binary_member", lambda: _zip_of({"a.log": _random(3000)}))


@fixture("log.tar")
def _log_tar(p: Path, fx: Fixtures) -> None:
    import tarfile

    with tarfile.open(p, "w") as tf:
        tf.add(REAL_LOG, arcname="a.log")


@fixture("log.zip_many_members")
def _log_zip_many(p: Path, fx: Fixtures) -> None:
    """An archive whose directory lists 200,000 members (about 15 MB)."""
    empty = _deflate(b"")
    write_zip(p, [(f"m{i}.log", *empty) for i in range(200_000)])


# ---- profiles and workloads (TOML) ---------------------------------------------------------
def _h200(replace: dict[str, str] | None = None, append: str = "") -> Callable[[], bytes]:
    def make() -> bytes:
        text = H200.read_text()
        for old, new in (replace or {}).items():
            assert old in text, old
            text = text.replace(old, new)
        return (text + append).encode("utf-8")

    return make


copy("profile.good", H200)
data("profile.tp_nan", _h200({"tp-size = 1": "tp-size = nan"}))
data("profile.tp_inf", _h200({"tp-size = 1": "tp-size = inf"}))
data("profile.tp_fullwidth", _h200({"tp-size = 1": 'tp-size = "１"'}))
data("profile.tp_negative", _h200({"tp-size = 1": "tp-size = -8"}))
data("profile.tp_huge", _h200({"tp-size = 1": "tp-size = 9223372036854775807"}))
data("profile.tp_float", _h200({"tp-size = 1": "tp-size = 1.5"}))
data("profile.tp_list", _h200({"tp-size = 1": "tp-size = []"}))
data("profile.chunk_huge", _h200({"tp-size = 1": "tp-size = 1\nchunked-prefill-size = 99999999999"}))
data("profile.unknown_table", _h200(append="\n[surprise]\nx = 1\n"))
data("profile.unknown_key", _h200({'hardware = "h200"': 'hardware = "h200"\ncolour = "red"'}))
data("profile.forbidden_flag", _h200({"tp-size = 1": "tp-size = 1\ncuda-graph-bs-prefill = [256]"}))
data("profile.flag_twice", _h200({"tp-size = 1": "tp-size = 1\ntp_size = 2"}))
data("profile.bad_flag_name", _h200({"tp-size = 1": 'tp-size = 1\n"--evil flag" = 1'}))
data("profile.buckets_empty", _h200(append="\n[buckets]\nlist = []\n"))
data("profile.buckets_zero", _h200(append="\n[buckets]\nlist = [0, 256]\n"))
data("profile.buckets_huge", _h200(append=f"\n[buckets]\nlist = [256, {2**40}]\n"))
data("profile.buckets_strings", _h200(append='\n[buckets]\nlist = ["256"]\n'))
data("profile.buckets_many", _h200(append="\n[buckets]\nlist = [" + ", ".join(map(str, range(1, 200_001))) + "]\n"))
data("profile.name_rtl", _h200({'name = "h200"': 'name = "h2\u202e00"'}))
data("profile.model_nul", _h200({'model = "Qwen/Qwen3.8-Flash-Next-FP8"': 'model = "Qwen/evil\\u0000model"'}))
data("profile.model_newline", _h200({'model = "Qwen/Qwen3.8-Flash-Next-FP8"': 'model = "a\\nrm -rf /"'}))
data("profile.env_bad_name", _h200({"[env]": '[env]\n"A B" = "1"'}))
data("profile.env_number", _h200({"[env]": "[env]\nX = 1"}))
data("profile.platform_bad", _h200({'platform = "cuda"': 'platform = "tpu"'}))
data("profile.no_profile_table", "[server]\ntp-size = 1\n")
data("profile.invalid_toml", "[profile\nname = \n")
data("profile.crlf_bom", lambda: b"\xef\xbb\xbf" + H200.read_bytes().replace(b"\n", b"\r\n"))
data("profile.oversize", lambda: H200.read_bytes() + b"#" * (2 << 20) + b"\n")
data("profile.gz_bomb", lambda: gzip_bomb(b"# a comment line\n", 64 << 20))
data("profile.tuned_bad", _h200(append="\n[buckets]\nlist = [256]\n\n[tuned]\ngain_pct = nan\n"))
copy("profile.trace_as_profile", SMALL_CSV)
copy("profile.log_as_profile", REAL_LOG)

copy("workload.good", WORKLOAD)
data("workload.nan", lambda: WORKLOAD.read_text().replace("random_range_ratio = 0.5", "random_range_ratio = nan").encode())
data("workload.inf_rate", lambda: WORKLOAD.read_text().replace("seed = 42", "seed = 42\nrequest_rate = inf").encode())
data("workload.huge_prompts", lambda: WORKLOAD.read_text().replace("[80, 320, 1280]", "[80, 320, 99999999999]").encode())
data("workload.negative_len", lambda: WORKLOAD.read_text().replace("random_input_len = 2048", "random_input_len = -5").encode())
data("workload.unknown_key", lambda: WORKLOAD.read_text().replace("seed = 42", "seed = 42\nsneak = 1").encode())
data("workload.levels_many", lambda: WORKLOAD.read_text().replace("[8, 32, 128]", "[" + ", ".join(["8"] * 5000) + "]").encode())
data(
    "workload.fullwidth",
    lambda: WORKLOAD.read_text().replace('dataset_name = "random"', 'dataset_name = "ｒａｎｄｏｍ"').encode(),
)
data("workload.seed_huge", lambda: WORKLOAD.read_text().replace("seed = 42", f"seed = {2**62}").encode())
data("workload.oversize", lambda: WORKLOAD.read_bytes() + b"#" * (17 << 20) + b"\n")

# ---- calibrations ------------------------------------------------------------------------------
copy("cal.good", TINY_CAL)
copy("cal.csv", CSV_CAL)


def _cal_variant(name: str, change: Callable[[dict], object]) -> None:
    def build(p: Path, fx: Fixtures) -> None:
        doc = json.loads(TINY_CAL.read_text())
        change(doc)
        p.write_text(json.dumps(doc, allow_nan=True))

    fixture(name)(build)


_cal_variant("cal.nan_ms", lambda d: d["rows"][0].__setitem__("graph_ms", float("nan")))
_cal_variant("cal.inf_ms", lambda d: d["rows"][0].__setitem__("graph_ms", float("inf")))
_cal_variant("cal.negative_ms", lambda d: d["rows"][0].__setitem__("graph_ms", -1.0))
_cal_variant("cal.huge_tokens", lambda d: d["rows"][0].__setitem__("tokens", 2**40))
_cal_variant("cal.rounds_mismatch", lambda d: d["rows"][0]["graph_rounds_ms"].pop())
_cal_variant("cal.rounds_huge", lambda d: d.__setitem__("rounds", 10**12))
_cal_variant("cal.no_rows", lambda d: d.__setitem__("rows", []))
_cal_variant("cal.other_kind", lambda d: d.__setitem__("kind", "bcgtune.prefill-trace"))
_cal_variant("cal.future", lambda d: d.__setitem__("format_version", 99))
_cal_variant("cal.runner_bad", lambda d: d.__setitem__("runner", "warp-drive"))
data("cal.csv_nan", "tokens,eager_ms,graph_ms\n16,nan,1\n")
data("cal.csv_inf", "tokens,eager_ms,graph_ms\n16,1,inf\n")
data("cal.csv_negative", "tokens,eager_ms,graph_ms\n16,-1,1\n")
data("cal.csv_fullwidth", "tokens,eager_ms,graph_ms\n１６,1,1\n")
data("cal.csv_dup", "tokens,eager_ms,graph_ms\n16,1,1\n16,2,1\n")
data("cal.csv_tokens_huge", f"tokens,eager_ms,graph_ms\n{2**70},1,1\n")
data("cal.csv_no_header", "16,1,1\n")
data("cal.csv_header_only", "tokens,eager_ms,graph_ms\n")
data("cal.oversize", lambda: b" " * (65 << 20) + b"{}")
data("cal.values_bomb", lambda: b'{"rows": [' + b"0," * (1 << 25) + b"0]}")
data("cal.gz_bomb", lambda: gzip_bomb(b"tokens,eager_ms,graph_ms\n", 128 << 20))
copy("cal.trace_as_cal", SMALL_CSV)

# ---- doctor's runner sources and model folders ----------------------------------------------
copy("runner.patched", HERE / "data" / "runner" / "patched_as_proposed.py")
data("runner.not_python", lambda: _random(5000))
data("runner.no_runner", "x = 1\n")
data("runner.oversize", lambda: b"# pad\n" * ((5 << 20) // 6))
data("runner.latin1", b"# \xe9t\xe9\nclass PrefillCudaGraphRunner:\n    pass\n")
fixture("model.good")(lambda p, fx: shutil.copytree(MODEL_DIR, p))


@fixture("model.config_nan")
def _model_nan(p: Path, fx: Fixtures) -> None:
    shutil.copytree(MODEL_DIR, p)
    cfg = json.loads((p / "config.json").read_text())
    cfg["hidden_size"] = float("nan")
    (p / "config.json").write_text(json.dumps(cfg, allow_nan=True))


@fixture("model.config_huge")
def _model_huge(p: Path, fx: Fixtures) -> None:
    shutil.copytree(MODEL_DIR, p)
    cfg = json.loads((p / "config.json").read_text())
    cfg["num_hidden_layers"] = 10**12
    cfg["hidden_size"] = 10**9
    (p / "config.json").write_text(json.dumps(cfg))


@fixture("model.config_garbage")
def _model_garbage(p: Path, fx: Fixtures) -> None:
    p.mkdir()
    (p / "config.json").write_bytes(_random(800))


@fixture("model.config_oversize")
def _model_oversize(p: Path, fx: Fixtures) -> None:
    p.mkdir()
    (p / "config.json").write_bytes(b" " * (5 << 20) + b"{}")


# ---- tune's state folders -------------------------------------------------------------------
def _state(name: str, files: dict[str, bytes | Callable[[], bytes]]) -> None:
    def build(p: Path, fx: Fixtures) -> None:
        p.mkdir()
        for fname, raw in files.items():
            (p / fname).write_bytes(raw() if callable(raw) else raw)

    fixture(name)(build)


_STATE_HEAD = {"kind": "bcgtune.tune-state", "format_version": 1}
_state("state.garbage", {"state.json": b"{not json"})
_state("state.binary", {"state.json": lambda: _random(3000)})
_state("state.other_kind", {"state.json": json.dumps({"kind": "bcgtune.calibration", "format_version": 1}).encode()})
_state(
    "state.other_trace",
    {"state.json": json.dumps({**_STATE_HEAD, "trace": {"sha256": "0" * 64}, "engine": {}, "settings": {}}).encode()},
)
_state("state.deep", {"state.json": b"[" * 100_000 + b"]" * 100_000})
_state("state.oversize", {"state.json": lambda: b" " * (65 << 20) + b"{}"})
_state("state.json_is_folder", {})
fixture("state.file")(lambda p, fx: p.write_text("a file where the state folder should be"))


def _state_json_folder(p: Path, fx: Fixtures) -> None:
    p.mkdir()
    (p / "state.json").mkdir()


BUILDERS["state.json_is_folder"] = _state_json_folder
