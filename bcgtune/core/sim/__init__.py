"""The simulation: SGLang's scheduler (`scheduler`, and `scheduler_lockstep` under DP
attention) played against a benchmark client's requests, the workload that describes
both (`workload`), how many tokens an image adds (`image_tokens`) and what a simulation
reports (`summary`). Imports the core's shared modules, `core.trace` and `core.sglang`."""
