"""A Dask scheduler address, checked before Dask is imported (importing it takes seconds):
its form, then what answers there, each failure one line in seconds.

A Dask scheduler speaks first: on a new TCP connection it sends its handshake at once (a
frame: an 8-byte little-endian length, then that many bytes, opening with an 8-byte frame
count; distributed/comm/tcp.py, TCP.read/write, and distributed/comm/core.py, connect(),
which reads the peer's handshake before writing its own). So a peer that sends nothing for a
few seconds, or sends bytes of another shape, is no scheduler: the check says what it found
(nothing listening, an HTTP server, silence, other bytes) instead of letting Dask's client
wait on it or read a made-up frame length as a size to allocate."""

from __future__ import annotations

import socket
import struct

from bcgtune.errors import ExternalError, InputError

DEFAULT_PORT = 8786
CONNECT_TIMEOUT_S = 10.0
# A scheduler's handshake comes at once; after this much silence the peer is asked (an HTTP
# request) what it is, and its first bytes are awaited for REPLY_TIMEOUT_S more: a scheduler
# slowed by a busy machine still answers with its handshake then.
SILENCE_S = 3.0
REPLY_TIMEOUT_S = 10.0
# protocols Dask's client connects over; inproc:// lives inside one Python process
_SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")
# a scheduler's first frame is its handshake: a few hundred bytes, a handful of frames
_MAX_HANDSHAKE_BYTES = 1 << 20
_MAX_HANDSHAKE_FRAMES = 64


def parse_address(address: str, where: str = "--cluster") -> tuple[str, str, int]:
    """(protocol, host, port) of a scheduler address such as tcp://host:8786 (the port
    defaults to Dask's 8786); a malformed one is bad input."""
    value = address.strip()
    if "://" not in value:
        raise InputError(f"give 'local', 'local:N' or a scheduler address such as tcp://host:8786, got {value[:60]!r}", where)
    scheme, rest = value.split("://", 1)
    scheme = scheme.lower()
    if scheme == "inproc":
        raise InputError("an inproc:// scheduler lives inside one Python process: give tcp://host:port", where)
    if scheme not in _SCHEMES:
        raise InputError(f"unknown scheduler protocol {scheme[:20]!r}: give {', '.join(s + '://' for s in _SCHEMES)}", where)
    hostport = rest.split("/", 1)[0]
    if hostport.startswith("["):  # [IPv6]:port
        host, _, tail = hostport[1:].partition("]")
        port_text = tail[1:] if tail.startswith(":") else ""
    else:
        host, _, port_text = hostport.rpartition(":") if ":" in hostport else (hostport, "", "")
    if not host:
        raise InputError(f"no host in the scheduler address {value[:60]!r}: give {scheme}://host:port", where)
    if port_text and not (port_text.isdigit() and 1 <= int(port_text) <= 65535):
        raise InputError(f"port must be 1..65535, got {port_text[:20]!r}", where)
    return scheme, host, int(port_text) if port_text else DEFAULT_PORT


def _found(data: bytes) -> str:
    if data.startswith(b"HTTP/"):
        status = data.split(b"\n", 1)[0].strip().decode("latin-1")[:60]
        return f"an HTTP server answers there ({status})"
    if data.startswith(b"SSH-"):
        return "an SSH server answers there"
    shown = data[:16]
    return f"it sent {len(data)} bytes that are not Dask's protocol (starting {shown!r})"


def _looks_like_handshake(data: bytes) -> bool:
    if len(data) < 16:
        return False
    total, frames = struct.unpack("<QQ", data[:16])
    return 8 <= total <= _MAX_HANDSHAKE_BYTES and 1 <= frames <= _MAX_HANDSHAKE_FRAMES and 8 + 8 * frames <= total


def check_scheduler(address: str, where: str = "--cluster") -> str:
    """The address to give Dask (the default port filled in), after checking that something
    listens there and, for tcp://, that it opens with a scheduler's handshake. Errors: a
    malformed address is bad input (InputError), the rest outside failures (ExternalError)
    naming what was found there."""
    scheme, host, port = parse_address(address, where)
    shown = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    target = f"{scheme}://{shown}"
    try:
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
    except socket.gaierror as exc:
        raise ExternalError(f"cannot resolve the scheduler's host: {exc.strerror or exc}", target) from None
    except ConnectionRefusedError:
        raise ExternalError("nothing listens there (connection refused): is the Dask scheduler running?", target) from None
    except TimeoutError:
        raise ExternalError(f"no answer to a connection in {CONNECT_TIMEOUT_S:.0f} s", target) from None
    except OSError as exc:
        raise ExternalError(f"cannot connect: {exc.strerror or exc}", target) from None
    with sock:
        if scheme != "tcp":  # tls, websockets and ucx open with their own handshakes: reachable is what we check
            return target
        data = _read_some(sock, 16, SILENCE_S)
        if data is None:  # silent: a server waiting for a request; ask it what it is
            try:
                sock.sendall(b"HEAD / HTTP/1.0\r\nHost: " + host.encode("ascii", "replace") + b"\r\n\r\n")
            except OSError:
                pass
            data = _read_some(sock, 16, REPLY_TIMEOUT_S)
            if data is None:
                raise ExternalError(
                    f"not a Dask scheduler: something accepts connections there but sent nothing in "
                    f"{SILENCE_S + REPLY_TIMEOUT_S:.0f} s (a scheduler speaks first; its default port is {DEFAULT_PORT})",
                    target,
                )
        if not data:
            raise ExternalError("not a Dask scheduler: it closed the connection without a word", target)
        if data.startswith(b"HTTP/"):  # the rest of its status line
            data += _read_some(sock, 48, 0.5) or b""
        if not _looks_like_handshake(data):
            raise ExternalError(f"not a Dask scheduler: {_found(data)}", target)
    return target


def _read_some(sock: socket.socket, n: int, timeout: float) -> bytes | None:
    """Up to `n` bytes (fewer when the peer stops or closes), b"" when it closed at once,
    None when it sent nothing within `timeout` seconds."""
    import time

    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    buf = b""
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        sock.settimeout(left)
        try:
            chunk = sock.recv(n - len(buf))
        except TimeoutError:
            break
        except OSError:
            break
        if not chunk:
            break
        buf += chunk
    if not buf:
        try:
            sock.settimeout(0.0)
            closed = sock.recv(1) == b""
        except (BlockingIOError, TimeoutError):
            closed = False
        except OSError:
            closed = True
        return b"" if closed else None
    return buf
