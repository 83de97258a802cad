"""Measurements against live servers: A/B statistics of interleaved launches
(`abstats`), the result of `bcgtune bench` (`bench_result`), the verdict of
`validate --server` (`server_validation`) and when a replay agrees with eager
(`accuracy`). Imports the core's shared modules, `core.trace`, `core.sglang` and
`core.plan`."""
