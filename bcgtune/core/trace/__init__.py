"""Traces: a workload's prefill forward sizes (`PrefillTrace`), what a log trace reports
(`summary`), the server configurations a trace mixes (`groups`), merging traces
(`merge`), batch mixes of tokens and requests (`mix`) and the steps of SGLang's DP
attention (`step_grouping`, `dp_steps`). Imports the core's shared modules and
`core.sglang` (the replay rule and the ladder a step is priced with)."""
