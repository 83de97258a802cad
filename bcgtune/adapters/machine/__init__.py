"""This machine: its Python, torch and sglang (`environment`), the GPUs a profile can name
(`hardware`) and a model's config.json found locally without downloading (`model_config`)."""
