"""bcgtune: tune and check the prefill CUDA graphs of an LLM server (SGLang first)."""

__version__ = "0.1.0"
