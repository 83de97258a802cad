#!/usr/bin/env bash
# Installs bcgtune with everything its test suite exercises into the virtual environment
# named by $VIRTUAL_ENV, with uv ($UV, default `uv`):
#  - the package (editable) with its test and lint extras;
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
# What `from sglang.srt.server_args import ServerArgs`, srt/arg_groups (which imports
# srt/connector -> safetensors) and the prefill runner module need at import on a CPU machine.
"$UV" pip install -q "${FIND[@]}" "$TORCH" numpy triton msgspec pydantic aiohttp requests pyzmq orjson psutil \
    pybase64 starlette tqdm packaging pillow IPython safetensors \
    "transformers==5.19.0" "tokenizers==0.23.2" datasets
