#!/usr/bin/env bash
# Installs bcgtune with everything its test suite exercises into the active Python:
#  - the package with its test and plot extras;
#  - torch 2.13.0 CPU (the engine's eager path and calibration logic run on CPU);
#  - sglang 0.5.23 WITHOUT its declared dependencies (they pull CUDA torch and GPU
#    kernels), plus the short list of packages its ServerArgs import needs, so tests can
#    check flags against SGLang's real argument parser (see shared/docs/sglang-facts.md).
set -euo pipefail
python -m pip install -q -e ".[test]"
python -m pip install -q "torch==2.13.0"
python -m pip install -q --no-deps "sglang==0.5.23"
# Checked in a fresh venv (torch 2.13.0 CPU): with these, `from sglang.srt.server_args import
# ServerArgs` imports and builds its parser; numpy is listed because sglang/srt/utils/common.py
# imports it (bcgtune depends on it too, but this line should not rely on that).
python -m pip install -q numpy triton msgspec pydantic aiohttp requests pyzmq orjson psutil pybase64 \
    starlette tqdm packaging pillow IPython
# tests/test_ladder.py compares with SGLang's own ladder function; its module
# (srt/arg_groups/cuda_graph_hook.py) imports srt/connector, which imports safetensors.
python -m pip install -q safetensors
# Live tests (issue 6) run the real benchmark client, `python -m sglang.benchmark.serving`,
# against a stand-in server. At import it needs transformers and tokenizers (the versions
# sglang 0.5.23 pins) and datasets; tests/standin/bench_client.py pre-registers the one
# GPU-bound module it imports (torchvision/tvm_ffi have no CPU builds on PyPI).
python -m pip install -q "transformers==5.19.0" "tokenizers==0.23.2" datasets
# bcgtune asks SGLang itself (bcgtune/adapters/sglang_probe.py): its resolution pipeline
# (srt/arg_groups/) and its prefill runner module import these CPU packages beyond the
# parser's list (versions as sglang 0.5.23 pins them where it does). Two are installed
# without their dependencies so they cannot replace torch or transformers. The GPU-only
# packages (torchvision's CUDA build, sgl_kernel, flashinfer, ...) are not installed: the
# probe puts inert placeholders in their place.
python -m pip install -q loguru gguf einops "sentencepiece==0.2.1" "openai==2.8.0" partial_json_parser
python -m pip install -q --no-deps "compressed-tensors==0.18.0" "apache-tvm-ffi==0.1.11"
