"""Defaults and closed sets that the command line declares in its options. This module imports
nothing, so `bcgtune COMMAND --help` can show them without loading numpy or pydantic; the
modules that apply them (replay.py, plan.py, drift.py) import them from here."""

# SGLang's replay rule (srt/model_executor/runner/prefill_cuda_graph_runner.py,
# _MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR): a batch of n tokens replays in bucket b iff b <= 2n.
DEFAULT_PADDING_FACTOR = 2.0

# What suggest-buckets minimizes, and where the time objective's buckets come from.
OBJECTIVES = ("padding", "time")
CANDIDATE_SETS = ("auto", "trace", "calibration")

# drift: re-tune when today's optimum is better by more than this (points or % of time).
DEFAULT_THRESHOLD_PCT = 2.0
