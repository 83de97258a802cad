"""Pure rules and math: no I/O, no printing, no flags, no torch or sglang.

One sub-package per domain; each imports only the core's shared modules (`document`,
`schema`) and the domains its docstring names:

- `core.trace`: what a workload's prefill batches are (PrefillTrace, summaries, server
  configurations in a trace, merging, DP-attention steps);
- `core.sim`: SGLang's scheduler played against a benchmark client (workloads, images);
- `core.sglang`: SGLang's own rules, copied from its source (the ladder, what a launch
  captures, the runner's gate, the tables read from its source);
- `core.plan`: choosing and pricing bucket lists (the optimizer, calibrations,
  predictions with intervals, recommendation, drift);
- `core.bench`: the statistics and verdicts of measurements against live servers.
"""
