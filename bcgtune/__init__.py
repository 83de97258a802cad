"""bcgtune: tune and check the prefill CUDA graphs of an LLM server (SGLang first).

The library API (bcgtune/api.py) is importable from here; its modules load on first use, so
`import bcgtune` and `bcgtune --help` stay light."""

__version__ = "0.1.0"

_API = (
    "PrefillTrace",
    "BucketPlan",
    "ListMetrics",
    "DriftReport",
    "Calibration",
    "load_trace",
    "save_trace",
    "trace_from_logs",
    "trace_from_sizes",
    "merge_traces",
    "trace_summary",
    "simulate_workload",
    "suggest_buckets",
    "evaluate",
    "drift",
    "load_calibration",
)
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        from bcgtune import api

        return getattr(api, name)
    raise AttributeError(f"module 'bcgtune' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
