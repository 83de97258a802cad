"""How much a calibration measures by default: rounds and model-check batches. A module of
plain numbers (no numpy), so that the command line's help can state them without importing
what measures."""

from __future__ import annotations

# (untimed, timed) calibration rounds when not given. On a GPU the rounds beat clock, power
# and host noise. Without one (padded-eager: the static-buffer forward run eagerly on the
# CPU) the times describe no GPU: the run checks the pipeline, and one round runs every call.
GPU_ROUNDS = (3, 10)
CPU_ROUNDS = (0, 1)
CPU_TUNE_ROUNDS = (0, 2)  # a CPU dry run of tune: two timed rounds, so every step has an interval
DEFAULT_CHECK_BATCHES = 200  # trace batches replayed per list by the model check (every Nth in trace order)
# `bcgtune tune --budget`: device seconds for the whole tune when not given
TUNE_BUDGET_S = 600.0  # on a GPU and on the simulated device
TUNE_BUDGET_CPU_S = 120.0  # a dry run on the CPU (its times describe no GPU)
