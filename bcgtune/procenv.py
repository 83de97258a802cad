"""Settings bcgtune gives its own process through the environment, and the environment of
the processes it starts (an SGLang server, SGLang's own checks) without them.

numpy's OpenBLAS starts one thread per core when numpy is imported, and they spin for a
while: CPU spent for nothing by commands whose numpy work is not linear algebra (reading
logs, pricing bucket lists). Those commands run with one BLAS thread; a server they start
gets the environment as the user set it."""

from __future__ import annotations

import os

# the commands whose process runs with one BLAS thread (none imports torch)
ONE_BLAS_THREAD_COMMANDS = frozenset({"trace", "trace merge", "suggest-buckets", "drift"})
_BLAS_VARS = ("OPENBLAS_NUM_THREADS",)
_set_here: dict[str, str] = {}


def one_blas_thread() -> None:
    """One OpenBLAS thread in this process, unless the user chose a number; must run before
    numpy is imported to take effect."""
    for var in _BLAS_VARS:
        if var not in os.environ:
            os.environ[var] = _set_here[var] = "1"


def child_environ() -> dict[str, str]:
    """This process's environment without what one_blas_thread set (a value the user has
    set since, or set to something else, is kept)."""
    env = dict(os.environ)
    for var, value in _set_here.items():
        if env.get(var) == value:
            del env[var]
    return env
