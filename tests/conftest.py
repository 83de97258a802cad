"""Test-session settings.

Every test runs with its own bcgtune cache folder (never the user's) and with SGLang never
started by bcgtune (BCGTUNE_SGLANG_PROBE=off): ordinary tests answer from bcgtune's model of
SGLang's rules in milliseconds. Tests of asking SGLang itself use the `sglang_probe` fixture,
which turns it back on.

OpenMP threads sleep at barriers instead of spinning: the tests run on every core
(pytest-xdist), so each worker's torch threads would otherwise spin while another worker
holds the core they wait for (torch reads this when it loads, so here, before any test
module imports it)."""

from __future__ import annotations

import os
import tempfile

import pytest

# set at import, before any test module imports bcgtune or torch, and inherited by the
# commands tests run in child processes
os.environ["BCGTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="bcgtune-test-cache-")
os.environ["BCGTUNE_SGLANG_PROBE"] = "off"
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture
def sglang_probe(monkeypatch, tmp_path):
    """SGLang may be started (in a child process), with an empty answer cache of the test's
    own; skips where sglang is not installed."""
    from bcgtune.adapters.sglang.resolve import sglang_installed

    if not sglang_installed():
        pytest.skip("sglang not installed")
    monkeypatch.delenv("BCGTUNE_SGLANG_PROBE", raising=False)
    monkeypatch.setenv("BCGTUNE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"
