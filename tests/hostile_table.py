"""The attacker's suite as a table: each row is (command, input, expected exit, the first words
of the expected one-line error, files that must be unchanged). The rows are the README's
exit-code promise, executable: every row runs the real command line in-process and checks
the exit code and message, that no traceback and at most one `error:` line is printed, that
exit 4 (a bug) never happens, and that the inputs it names are byte-identical afterwards.

A row's command is one string, split on spaces, with placeholders:
  {in}        the row's input, presented as its kind says (below)
  {F:name}    another fixture's path (hostile_fixtures.BUILDERS), never changed
  {C:name}    a copy of a fixture in the row's own folder (an output the row may replace)
  {T}         the row's own folder
  {new}       a fresh path in the row's folder (an output that does not exist yet)

The input is `kind:fixture`: file (the fixture's path), stdin (`-`, its bytes on standard
input), fifo (a named pipe a thread writes its bytes into while the command reads), fileurl
(`file://` URL), zipurl (`zip://a.log::file://...`, the fixture is the archive), glob (a
glob that matches it), folder (its folder), and a few fixed ones: missing, devnull, devzero,
httpdead (an http URL where nothing listens), longname.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cli_helpers import USER_EXIT_CODES, assert_one_line_error, cli, digest, free_port
from hostile_fixtures import Fixtures

# what `unchanged` holds by default: every fixture the row names
INPUTS = ("@inputs",)


@dataclass(frozen=True)
class Row:
    command: str
    input: str  # kind:fixture
    exit: int
    says: str  # the first words of the message after `error: ` ("" when it exits 0)
    unchanged: tuple[str, ...] = INPUTS
    needs: tuple[str, ...] = field(default=())  # modules the row needs (torch): skipped without them

    @property
    def id(self) -> str:
        return f"{self.command.split(' ')[0]}|{self.input}|{self.command}"[:150]


def rows(command: str, table: list[tuple], needs: tuple[str, ...] = ()) -> list[Row]:
    """Rows of one command from (input, exit, says[, unchanged]) tuples."""
    return [Row(command, *t, needs=needs) for t in table]


@pytest.fixture(scope="session")
def fx(tmp_path_factory) -> Fixtures:
    return Fixtures(tmp_path_factory.mktemp("hostile-fixtures"))


@contextlib.contextmanager
def _stdin(data: bytes):
    old = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.BytesIO(data)), encoding="utf-8")  # as a pipe: it can peek
    try:
        yield
    finally:
        sys.stdin = old


@contextlib.contextmanager
def _fifo_writer(path: Path, data: bytes):
    """A named pipe at `path` and a thread that writes `data` into it once a reader opens it
    (and gives up when the command never does)."""
    os.mkfifo(path)
    stop = threading.Event()

    def write() -> None:
        fd = None
        while not stop.is_set():
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError:  # ENXIO: no reader yet
                stop.wait(0.01)
        if fd is None:
            return
        os.set_blocking(fd, True)
        try:
            os.write(fd, data) if len(data) < 65536 else [os.write(fd, data[i : i + 65536]) for i in range(0, len(data), 65536)]
        except OSError:  # the reader stopped reading (refused the input): a broken pipe
            pass
        finally:
            os.close(fd)

    t = threading.Thread(target=write, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(timeout=30)


# inputs that are no fixture: (kind) -> the argument, made from the row's folder
_FIXED = {
    "missing": lambda tmp: str(tmp / "no-such-file"),
    "missingdir": lambda tmp: str(tmp / "no" / "such" / "folder" / "x"),
    "devnull": lambda tmp: "/dev/null",
    "devzero": lambda tmp: "/dev/zero",
    "httpdead": lambda tmp: f"http://127.0.0.1:{free_port()}/x.log",
    "longname": lambda tmp: str(tmp / ("n" * 300)),
}
# a fixture as a URL of it: (kind) -> the argument
_URLS = {
    "fileurl": "file://{}",
    "zipurl": "zip://a.log::file://{}",
    "zipglob": "zip://*.log::file://{}",
    "tarurl": "tar://a.log::file://{}",
}


def present(kind: str, name: str, fx: Fixtures, tmp: Path) -> tuple[str, bytes | None, Path | None, list[Path]]:
    """(the argument, stdin bytes, a FIFO to feed, the input's own files)."""
    if kind in _FIXED:
        return _FIXED[kind](tmp), None, None, []
    if kind == "value":
        return name, None, None, []
    src = fx.path(name)
    if kind in _URLS:
        return _URLS[kind].format(src), None, None, [src]
    if kind == "copy":  # a copy the command may write into (a state folder)
        dst = tmp / ("copy-" + name)
        shutil.copytree(src, dst, symlinks=True) if src.is_dir() else shutil.copy(src, dst)
        return str(dst), None, None, [dst]
    if kind in ("file", "folder"):
        return str(src), None, None, [src]
    if kind == "stdin":
        return "-", src.read_bytes(), None, [src]
    if kind == "fifo":
        return str(tmp / "pipe"), None, tmp / "pipe", [src]
    if kind == "glob":
        return str(src.parent / (src.name[:-1] + "?")), None, None, [src]
    raise AssertionError(f"unknown input kind {kind}")


def _files(paths: list[Path]) -> list[Path]:
    out = []
    for p in paths:
        if p.is_dir() and not p.is_symlink():
            out += sorted(q for q in p.rglob("*") if q.is_file())
        else:
            out.append(p)
    return out


def run_row(row: Row, fx: Fixtures, tmp: Path) -> None:
    for module in row.needs:
        pytest.importorskip(module)
    kind, _, name = row.input.partition(":") if ":" in row.input else ("file", "", row.input)
    arg, stdin, fifo, own = present(kind, name, fx, tmp)
    paths: dict[str, list[Path]] = {"{in}": own}
    args = []
    for word in row.command.split(" "):
        for tag in ("{F:", "{C:"):
            while tag in word:
                i = word.index(tag)
                j = word.index("}", i)
                fname = word[i + 3 : j]
                if tag == "{F:":
                    p = fx.path(fname)
                else:
                    p = tmp / ("copy-" + fname)
                    if not p.exists():
                        src = fx.path(fname)
                        shutil.copytree(src, p) if src.is_dir() else shutil.copy(src, p)
                paths[word[i : j + 1]] = [p]
                word = word[:i] + str(p) + word[j + 1 :]
        args.append(word.replace("{in}", arg).replace("{T}", str(tmp)).replace("{new}", str(tmp / "new-output")))
    unchanged = paths if row.unchanged == INPUTS else {u: paths[u] for u in row.unchanged}
    watched = _files([p for ps in unchanged.values() for p in ps])
    before = digest(watched)
    with contextlib.ExitStack() as stack:
        if stdin is not None:
            stack.enter_context(_stdin(stdin))
        if fifo is not None:
            stack.enter_context(_fifo_writer(fifo, fx.path(name).read_bytes()))
        r = cli(args)
    errors = [ln[len("error: ") :] for ln in r.err.splitlines() if ln.startswith("error: ")]
    actual = errors[0] if errors else ""
    if os.environ.get("HOSTILE_RECORD"):  # writing a table: note what it does
        with open(os.environ["HOSTILE_RECORD"], "a") as fh:
            fh.write(repr((row.command, row.input, r.code, actual[:200], str(fx.root), str(tmp))) + "\n")
    assert r.code in USER_EXIT_CODES, (r.code, r.err[-1500:])
    assert_one_line_error(r)
    says = row.says.replace("{fx}", str(fx.root)).replace("{T}", str(tmp))
    assert r.code == row.exit, f"exit {r.code}, expected {row.exit}: {r.err[-800:]}"
    assert actual.startswith(says), f"says {actual!r}, expected it to start with {says!r}"
    assert digest(watched) == before, "an input changed"
