"""Test-session settings. OpenMP threads sleep at barriers instead of spinning: the tests run
on every core (pytest-xdist), so each worker's torch threads would otherwise spin while
another worker holds the core they wait for (torch reads this when it loads, so here, before
any test module imports it)."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
