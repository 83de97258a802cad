"""This machine: its Python, torch and sglang (`environment`), the GPUs a profile can name
(`hardware`), a model's config.json found locally without downloading (`model_config`), and
what answers at a Dask scheduler's address (`dask_scheduler`, checked before Dask loads)."""
