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

# The time objective (suggest-buckets, and drift's time verdict): a list with fewer graphs
# than the best, or a deployed list, counts as good as the best only when the upper end of
# the 95% paired interval of its time minus the best's is within this % of the best's
# predicted time. 0.5% is below the gains the tuned list measured over SGLang's ladder on an
# H200 (0.5-2.5%, benchmarks/RESULTS.md) and near the paired half-widths a 10-round
# calibration gave there (0.4-0.5% of the total).
DEFAULT_TOLERANCE_PCT = 0.5
