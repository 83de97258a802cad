"""Every test runs with its own bcgtune cache folder (never the user's) and with SGLang
never started by bcgtune (BCGTUNE_SGLANG_PROBE=off): ordinary tests answer from bcgtune's
model of SGLang's rules in milliseconds. Tests of asking SGLang itself use the
`sglang_probe` fixture, which turns it back on."""

from __future__ import annotations

import os
import tempfile

import pytest

# set at import, before any test module imports bcgtune, and inherited by the commands
# tests run in child processes
os.environ["BCGTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="bcgtune-test-cache-")
os.environ["BCGTUNE_SGLANG_PROBE"] = "off"


@pytest.fixture
def sglang_probe(monkeypatch, tmp_path):
    """SGLang may be started (in a child process), with an empty answer cache of the test's
    own; skips where sglang is not installed."""
    from bcgtune.adapters.sglang_resolve import sglang_installed

    if not sglang_installed():
        pytest.skip("sglang not installed")
    monkeypatch.delenv("BCGTUNE_SGLANG_PROBE", raising=False)
    monkeypatch.setenv("BCGTUNE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"
