"""Planning: choosing and pricing bucket lists. The exact optimizer (`optimizer`), the
replay and padding metrics of a list on a trace (`replay`), calibrations of measured
prefill times (`calibration`, `calibration_extend`), predictions with 95% intervals
(`predict`, `stats`), the recommendation a user reads (`recommend`), the plan that puts
them side by side (`bucket_plan`) and the drift of a deployed list (`drift`). Imports the
core's shared modules, `core.trace` and `core.sglang`."""
