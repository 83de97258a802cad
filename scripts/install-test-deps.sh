#!/usr/bin/env bash
# Installs bcgtune with everything its test suite exercises into the virtual environment
# named by $VIRTUAL_ENV, with uv ($UV, default `uv`):
#  - the package (editable) with its test and lint extras (the test extra holds fsspec,
#    aiohttp and dask[distributed]: URL logs over a local HTTP server and a Dask LocalCluster);
#  - torch 2.13.0 CPU (the engine's eager path and calibration logic run on CPU);
#  - sglang 0.5.23 WITHOUT its declared dependencies (they pull CUDA torch and GPU kernels),
#    plus the short list of packages its import needs, so tests check flags against SGLang's
#    real argument parser, resolve launches with its own code and import its prefill runner;
#  - transformers, tokenizers and datasets at the versions sglang 0.5.23 pins: the live
#    tests run the real `python -m sglang.benchmark.serving` client against a stand-in server.
# Where a local wheel folder exists (/opt/wheels holds the CPU build of torch on this
# project's machines) it is searched first.
set -euo pipefail
UV=${UV:-uv}
FIND=()
[ -d /opt/wheels ] && FIND=(--find-links /opt/wheels)
TORCH="torch==2.13.0"
"$UV" pip install -q "${FIND[@]}" -e ".[test,lint]" "$TORCH"
"$UV" pip install -q --no-deps "sglang==0.5.23"
# What `from sglang.srt.server_args import ServerArgs` needs at import on a CPU machine, and
# srt/arg_groups (its resolution hooks import srt/connector -> safetensors).
"$UV" pip install -q "${FIND[@]}" "$TORCH" numpy triton msgspec pydantic aiohttp requests pyzmq orjson psutil \
    pybase64 starlette tqdm packaging pillow IPython safetensors \
    "transformers==5.19.0" "tokenizers==0.23.2" datasets
# bcgtune asks SGLang itself (bcgtune/adapters/sglang/probe.py): its resolution pipeline and
# its prefill runner module import these CPU packages beyond the parser's list (versions as
# sglang 0.5.23 pins them where it does). Two are installed without their dependencies so
# they cannot replace torch or transformers. The GPU-only packages (torchvision's CUDA build,
# sgl_kernel, flashinfer, ...) are not installed: the probe puts inert placeholders in their
# place.
"$UV" pip install -q "${FIND[@]}" "$TORCH" loguru gguf einops "sentencepiece==0.2.1" "openai==2.8.0" partial_json_parser
"$UV" pip install -q --no-deps "compressed-tensors==0.18.0" "apache-tvm-ffi==0.1.11"
