"""The cache of SGLang's answers (bcgtune.adapters.sglang.answer_cache) and how asking SGLang uses
it (bcgtune.adapters.sglang.resolve.ask): a hit and a miss for each part of the key, stale
entries when SGLang's files or the runner change, `--refresh`, a corrupt entry, eviction,
two doctors at once. SGLang itself is replaced by a stand-in probe that records each call
(the real probe is exercised by tests/test_sglang_resolve.py and tests/test_doctor.py)."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

import bcgtune.adapters.sglang.resolve as sr
from bcgtune.adapters.sglang.answer_cache import AnswerCache, cache_root, key_of
from bcgtune.errors import InputError
from bcgtune.files.profile_file import parse_profile

DATA = Path(__file__).parent / "data"
RUNNERS = DATA / "runner"
H200 = {"platform": "cuda", "name": "NVIDIA H200", "memory_gib": 141.0, "capability": [9, 0]}


class FakeProbe:
    """Answers like the probe child, recording each call; `files` stand for SGLang's
    source files the answers were read from."""

    def __init__(self, files: list[Path], delay: float = 0.0, log: Path | None = None):
        self.files, self.delay, self.log = files, delay, log
        self.calls: list[dict] = []

    def stamps(self):
        return [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in self.files]

    def __call__(self, request, timeout=0, **_):
        self.calls.append(request)
        if self.log is not None:
            with open(self.log, "a") as fh:
                fh.write("probe\n")
        time.sleep(self.delay)
        result = {"sglang_version": "0.5.23", "files": {}}
        for _argv in request.get("launches", []):
            bs = [256, 512]
            result.setdefault("launches", []).append(
                {"ok": True, "backend": "breakable", "bs": bs, "captured": bs, "max_bs": 8192, "alignment": 1,
                 "chunked_prefill_size": 8192, "messages": []}
            )  # fmt: skip
            result["files"]["launches"] = self.stamps()
        if "flags" in request:
            result["flags"] = {"ok": True}
            result["files"]["flags"] = self.stamps()
        if "runners" in request:
            answers = {"image_spec_off": False, "image_spec_on": False, "text_spec_off": True, "text_spec_on": True}
            result["runners"] = [{"ok": True, "imported": True, "answers": answers} for _ in request["runners"]["sources"]]
            result["files"]["runners"] = self.stamps()
        return result


@pytest.fixture
def fake_sglang(tmp_path, monkeypatch):
    src = tmp_path / "sglang_src.py"
    src.write_text("x = 1\n")
    probe = FakeProbe([src])
    monkeypatch.setattr(sr, "run_probe", probe)
    monkeypatch.setattr(sr, "sglang_installed", lambda: True)
    monkeypatch.setenv("BCGTUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("BCGTUNE_SGLANG_PROBE", raising=False)
    return probe


def _profile(tmp_path, server="tp-size = 1", hardware="h200", config=None):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(
        json.dumps(config or {"architectures": ["Qwen3ForCausalLM"], "max_position_embeddings": 4096})
    )
    text = f'[profile]\nname = "t"\nplatform = "cuda"\nhardware = "{hardware}"\nmodel = "{model}"\n[server]\n{server}\n'
    return parse_profile(text, str(tmp_path / "t.toml"))


def _ask(prof, **kw):
    return sr.ask_sglang(prof, check_flags=True, runner_sources=[str(RUNNERS / "patched_as_proposed.py")], **kw)


def test_cache_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("BCGTUNE_CACHE_DIR", str(tmp_path / "a"))
    assert cache_root() == tmp_path / "a"
    monkeypatch.delenv("BCGTUNE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "bcgtune"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # not absolute: ignored, as XDG says
    assert cache_root() == Path("~/.cache/bcgtune").expanduser()


def test_second_ask_is_answered_from_the_cache(fake_sglang, tmp_path):
    prof = _profile(tmp_path)
    first = _ask(prof)
    assert len(fake_sglang.calls) == 1
    assert first.capture.source.cached_at is None and first.flags.ok and first.runners[0].ok
    second = _ask(prof)
    assert len(fake_sglang.calls) == 1  # nothing started
    assert second.capture.source.cached_at is not None
    assert (second.flags.cached_at, second.runners[0].cached_at) != (None, None)
    assert second.capture.captured == first.capture.captured


@pytest.mark.parametrize(
    "change",
    ["launch flags", "model config", "hardware", "runner file", "sglang installation"],
)
def test_each_part_of_the_key_misses_alone(fake_sglang, tmp_path, monkeypatch, change):
    prof = _profile(tmp_path)
    runner = tmp_path / "runner.py"
    runner.write_text((RUNNERS / "patched_as_proposed.py").read_text())

    def ask(p):
        return sr.ask_sglang(p, runner_sources=[str(runner)])

    ask(prof)
    ask(prof)
    assert len(fake_sglang.calls) == 1
    if change == "launch flags":
        prof = _profile(tmp_path, server="tp-size = 2")
    elif change == "model config":
        _profile(tmp_path, config={"architectures": ["Qwen3ForCausalLM"], "max_position_embeddings": 8192})
    elif change == "hardware":
        prof = _profile(tmp_path, hardware="b200")
    elif change == "runner file":
        runner.write_text(runner.read_text() + "\n# edited\n")
    else:
        base = sr._base_parts()
        monkeypatch.setattr(sr, "_base_parts", lambda: {**base, "sglang": ["0.5.24", base["sglang"][1]]})
    ask(prof)
    asked = fake_sglang.calls[-1]
    assert len(fake_sglang.calls) == 2
    # only what changed is asked again
    if change in ("launch flags", "model config"):
        assert "launches" in asked and "runners" not in asked
    elif change == "runner file":
        assert "runners" in asked and "launches" not in asked
    else:
        assert "launches" in asked and "runners" in asked


def test_an_edited_sglang_file_makes_answers_stale(fake_sglang, tmp_path):
    prof = _profile(tmp_path)
    _ask(prof)
    src = fake_sglang.files[0]
    src.write_text("x = 22\n")  # SGLang upgraded or patched in place: another size
    again = _ask(prof)
    assert len(fake_sglang.calls) == 2 and again.capture.source.cached_at is None


def test_refresh_asks_again(fake_sglang, tmp_path):
    prof = _profile(tmp_path)
    _ask(prof)
    again = _ask(prof, refresh=True)
    assert len(fake_sglang.calls) == 2 and again.capture.source.cached_at is None
    _ask(prof)
    assert len(fake_sglang.calls) == 2  # the refreshed answers are cached


def test_without_probe_only_the_cache_answers(fake_sglang, tmp_path):
    prof = _profile(tmp_path)
    miss = _ask(prof, probe=False, not_asked="--no-sglang-probe")
    assert fake_sglang.calls == [] and miss.capture is None and "--no-sglang-probe" in miss.capture_error
    _ask(prof)
    hit = _ask(prof, probe=False, not_asked="--no-sglang-probe")
    assert len(fake_sglang.calls) == 1 and hit.capture is not None and hit.capture.source.cached_at


@pytest.mark.parametrize("garbage", [b"", b"{not json", b'{"kind": "something else"}', b"\xff\xfe", b"[]"])
def test_a_corrupt_entry_is_ignored_and_replaced(fake_sglang, tmp_path, garbage):
    prof = _profile(tmp_path)
    _ask(prof)
    entries = list((tmp_path / "cache" / "sglang-answers").glob("*.json"))
    assert len(entries) == 3  # the launch, the flag check, the runner
    for e in entries:
        e.write_bytes(garbage)
    again = _ask(prof)
    assert len(fake_sglang.calls) == 2 and again.capture.source.cached_at is None
    for e in entries:
        assert json.loads(e.read_text())["kind"] == "bcgtune.sglang-answer"


def test_eviction_keeps_the_most_recently_used(tmp_path):
    cache = AnswerCache(tmp_path, max_entries=3)
    for i in range(5):
        cache.put(key_of({"i": i}), {"v": i}, [], {"i": i})
        time.sleep(0.02)
        if i == 2:
            assert cache.get(key_of({"i": 0})) is not None  # used: kept
            time.sleep(0.02)
    assert len(list(tmp_path.glob("*.json"))) == 3
    assert [cache.get(key_of({"i": i})) is not None for i in range(5)] == [True, False, False, True, True]


def test_an_unwritable_cache_still_answers(fake_sglang, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("BCGTUNE_CACHE_DIR", str(blocker))  # a file, not a folder
    prof = _profile(tmp_path)
    assert _ask(prof).capture is not None and _ask(prof).capture is not None
    assert len(fake_sglang.calls) == 2  # nothing could be cached


def _doctor_in_child(cache_dir: str, model_dir: str, log: str, out: str) -> None:
    import bcgtune.adapters.sglang.resolve as child_sr
    from bcgtune.files.profile_file import parse_profile as parse
    from bcgtune.services.doctor import run_doctor

    src = Path(log).with_suffix(".src")
    child_sr.run_probe = FakeProbe([src], delay=1.0, log=Path(log))
    child_sr.sglang_installed = lambda: True
    os.environ["BCGTUNE_CACHE_DIR"] = cache_dir
    os.environ.pop("BCGTUNE_SGLANG_PROBE", None)
    text = f'[profile]\nname = "t"\nplatform = "cuda"\nhardware = "h200"\nmodel = "{model_dir}"\n'
    report = run_doctor(parse(text, "t.toml"), runner_path=RUNNERS / "patched_as_proposed.py")
    Path(out).write_text(json.dumps(report.to_json()))


def test_two_doctors_at_once_ask_sglang_once(tmp_path):
    prof = _profile(tmp_path)  # writes the model folder
    log = tmp_path / "probe.log"
    log.with_suffix(".src").write_text("x = 1\n")
    ctx = multiprocessing.get_context("fork")
    outs = [tmp_path / f"out{i}.json" for i in range(2)]
    procs = [ctx.Process(target=_doctor_in_child, args=(str(tmp_path / "cache"), prof.model, str(log), str(o))) for o in outs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert log.read_text().count("probe") == 1  # the second doctor waited, then read the first one's answers
    reports = [json.loads(o.read_text()) for o in outs]
    assert reports[0]["resolved_prefill"]["buckets"] == reports[1]["resolved_prefill"]["buckets"] == [256, 512]
    assert sorted(r["resolved_prefill"]["cached_at"] is None for r in reports) == [False, True]


def test_a_live_launch_is_checked_as_serve_checks_it_without_importing_sglang(fake_sglang, tmp_path, monkeypatch):
    """trace --live, bench and validate --server build their launch with serve's flag check:
    SGLang's parser in the child process (or its cached answer), never SGLang in this one."""
    import sys

    from bcgtune.adapters.sglang.live import build_launch

    monkeypatch.delenv("BCGTUNE_SERVER_CMD", raising=False)
    before = "sglang.srt.server_args" in sys.modules
    prof = _profile(tmp_path)
    launch = build_launch(prof, tmp_path / "server.log", port=30000)
    assert launch.argv[1:3] == ["-m", "sglang.launch_server"] and len(fake_sglang.calls) == 1
    build_launch(prof, tmp_path / "server.log", port=30000)
    assert len(fake_sglang.calls) == 1  # the cached answer
    assert ("sglang.srt.server_args" in sys.modules) == before

    def refuses(request, timeout=0, **_):
        result = fake_sglang(request, timeout)
        result["flags"] = {"ok": False, "message": "--tp-size must be an integer", "where": "[server] tp-size"}
        return result

    monkeypatch.setattr(sr, "run_probe", refuses)
    with pytest.raises(InputError) as err:
        build_launch(_profile(tmp_path, server="tp-size = 2"), tmp_path / "server.log", port=30000)
    assert "--tp-size must be an integer" in str(err.value) and err.value.where == "[server] tp-size"


# ------------------------------------------------------------------ the lock: bounded, says who, stale taken over
HOLD = """
import sys, time
from pathlib import Path
from bcgtune.adapters.sglang.answer_cache import AnswerCache
root, ready = Path(sys.argv[1]), Path(sys.argv[2])
with AnswerCache(root).asking():
    ready.write_text("held")
    time.sleep(60)
"""

# a bcgtune that dies while holding the lock, whose lock lives on in a process that
# inherited it (the inheritor's pid is printed; the recorded holder is gone)
DIE_HOLDING = """
import os, subprocess, sys
from pathlib import Path
from bcgtune.adapters.sglang.answer_cache import AnswerCache
root = Path(sys.argv[1])
with AnswerCache(root).asking():
    fds = [int(n) for n in os.listdir("/proc/self/fd") if os.path.realpath(f"/proc/self/fd/{n}").endswith(".asking.lock")]
    keeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=fds,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(keeper.pid, flush=True)
    os._exit(0)  # dies holding it: no unlock runs
"""


def _child_env():
    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}


def _kill(pid: int) -> None:
    import signal

    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_a_lock_held_by_another_process_is_waited_for_boundedly_and_names_its_holder(tmp_path, fake_sglang):
    import socket
    import subprocess
    import sys

    from bcgtune.adapters.sglang.answer_cache import LOCKED_BY, CacheLocked

    root = tmp_path / "cache" / "sglang-answers"
    ready = tmp_path / "ready"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(root), str(ready)], env=_child_env())
    try:
        for _ in range(600):
            if ready.exists() or holder.poll() is not None:
                break
            time.sleep(0.05)
        assert ready.exists(), "the holder did not take the lock"
        said = []
        with pytest.raises(CacheLocked) as exc, AnswerCache(root).asking(on_wait=said.append, timeout=0.5):
            pass
        msg = str(exc.value)
        assert msg.startswith(LOCKED_BY) and f"pid {holder.pid} on host {socket.gethostname()} since " in msg
        assert "waited 0.5 s" in msg and said and f"pid {holder.pid}" in said[0] and "BCGTUNE_LOCK_TIMEOUT" in said[0]
        # asking SGLang through the locked cache: no answer, the reason says who holds it, nothing hangs
        prof = _profile(tmp_path)
        os.environ["BCGTUNE_LOCK_TIMEOUT"] = "0.3"
        try:
            answers = _ask(prof)
        finally:
            del os.environ["BCGTUNE_LOCK_TIMEOUT"]
        assert answers.capture is None and fake_sglang.calls == []
        assert answers.capture_error.startswith(LOCKED_BY) and f"pid {holder.pid}" in answers.capture_error
    finally:
        _kill(holder.pid)
        holder.wait()
    # the holder gone, the lock is free at once
    with AnswerCache(root).asking(timeout=0):
        pass


def test_a_lock_whose_holder_is_gone_is_taken_over(tmp_path):
    import subprocess
    import sys

    from bcgtune.adapters.sglang.answer_cache import read_holder

    root = tmp_path / "cache" / "sglang-answers"
    died = subprocess.run([sys.executable, "-c", DIE_HOLDING, str(root)], env=_child_env(), capture_output=True, text=True)
    keeper = int(died.stdout.split()[0])
    try:
        dead = read_holder(root / ".asking.lock")
        assert dead is not None and dead["pid"] != keeper  # the recorded holder, now gone
        import fcntl

        with open(root / ".asking.lock", "rb") as fh, pytest.raises(BlockingIOError):
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # still locked, by the inheritor
        said = []
        with AnswerCache(root).asking(on_wait=said.append, timeout=5):
            assert read_holder(root / ".asking.lock")["pid"] == os.getpid()
        assert said and "taking over" in said[0] and f"pid {dead['pid']}" in said[0] and "is gone" in said[0]
    finally:
        _kill(keeper)


def test_lock_timeout_from_the_environment(monkeypatch):
    from bcgtune.adapters.sglang.answer_cache import DEFAULT_LOCK_TIMEOUT_S, lock_timeout

    monkeypatch.delenv("BCGTUNE_LOCK_TIMEOUT", raising=False)
    assert lock_timeout() == DEFAULT_LOCK_TIMEOUT_S
    monkeypatch.setenv("BCGTUNE_LOCK_TIMEOUT", "12.5")
    assert lock_timeout() == 12.5 and lock_timeout(3) == 3
    for bad in ("soon", "-1", "inf"):
        monkeypatch.setenv("BCGTUNE_LOCK_TIMEOUT", bad)
        with pytest.raises(InputError) as exc:
            lock_timeout()
        assert exc.value.where == "BCGTUNE_LOCK_TIMEOUT"
