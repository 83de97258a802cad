#!/usr/bin/env bash
# SGLang on the GPU machine, without network: SGLang's source (installed without its declared
# dependencies, as the test setup installs it) and the wheels its import needs are carried in
# .whl-sglang/ (sglang-src.tar.xz: the sglang package folder and its dist-info; *.whl: built for
# the machine's Python). Then, timed one by one:
#  1. the GPU test comparing SGLang's own breakable-graph classes with bcgtune's (same outputs);
#  2. doctor on a profile (first answer: SGLang asked; repeat: its cached answer), with the
#     model's config from tests/data/models (no hub access), and with the patched and the
#     unpatched runner file;
#  3. serve --dry-run of the same profile (the flags checked by SGLang's own parser);
#  4. suggest-buckets --write-profile with --ask-sglang (SGLang's capture for the profile's launch priced).
# Usage: OUT=DIR bash benchmarks/h200_sglang_doctor.sh   (writes DIR/*.json, prints timings)
# .whl-sglang is made on a machine with network, from the test environment (.venv, made by
# scripts/install-test-deps.sh), for the GPU machine's Python (3.12 here):
#   SP=.venv/lib/python3.11/site-packages
#   tar -C $SP --exclude=__pycache__ -cJf .whl-sglang/sglang-src.tar.xz sglang sglang-0.5.23.dist-info
#   pip download -q --no-deps --python-version 3.12 --platform manylinux2014_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --only-binary=:all: -d .whl-sglang \
#     msgspec orjson pybase64 pyzmq loguru gguf einops sentencepiece==0.2.1 openai==2.8.0 partial_json_parser \
#     compressed-tensors==0.18.0 apache-tvm-ffi==0.1.11 jiter distro ipython jedi parso decorator traitlets \
#     matplotlib-inline pexpect ptyprocess prompt_toolkit wcwidth pygments stack_data executing asttokens \
#     pure_eval ipython_pygments_lexers starlette anyio sniffio idna httpx httpcore h11 certifi aiohttp \
#     aiohappyeyeballs aiosignal attrs frozenlist multidict propcache yarl requests charset_normalizer \
#     urllib3 psutil pillow safetensors tqdm packaging dill cloudpickle narwhals python-dateutil six xxhash \
#     multiprocess
# (no package twice across .whl and .whl-sglang: pip refuses the whole install then). The
# device's own torch, transformers and numpy are used.
set -u
OUT=${OUT:?give OUT=DIR}
SITE=${SITE:-/tmp/site}
MODEL=${MODEL:-tests/data/models/qwen3-moe-tiny}
mkdir -p "$OUT" "$SITE"
pip install -q --no-index --no-deps --target "$SITE" .whl/*.whl .whl-sglang/*.whl 2>&1 | grep -v "root" | tail -3
tar -C "$SITE" -xJf .whl-sglang/sglang-src.tar.xz
export PYTHONPATH=$PWD:$SITE BCGTUNE_CACHE_DIR=$OUT/cache
timed() {  # NAME COMMAND...: run, print exit code and wall time
    local name=$1 t0 rc
    shift
    t0=$(date +%s.%N)
    "$@"
    rc=$?
    echo "== $name: exit $rc, $(python3 -c "import time; print(f'{time.time() - $t0:.1f}')") s"
}
python3 -c "import sglang, torch; print('sglang', sglang.__version__, '| torch', torch.__version__)"
python3 -c "from sglang.srt.server_args import ServerArgs; print('SGLang server_args imports')" 2>&1 | tail -1
timed "SGLang's breakable classes vs bcgtune's" \
    python3 -m pytest -q -n 0 -p no:cacheprovider tests/test_engine_breakable_gpu.py -k sglang_capture_classes
sed "s#^model = .*#model = \"$PWD/$MODEL\"#" profiles/h200.toml > "$OUT/h200-local.toml"
P=$OUT/h200-local.toml
timed "doctor, first (SGLang asked)" sh -c "python3 -m bcgtune doctor --profile $P --json > $OUT/doctor1.json"
timed "doctor, repeated (cached)" sh -c "python3 -m bcgtune doctor --profile $P --json > $OUT/doctor2.json"
for r in patched_as_proposed never_true_condition; do
    timed "doctor, runner $r" sh -c \
        "python3 -m bcgtune doctor --profile $P --runner-source tests/data/runner/$r.py --json > $OUT/doctor-$r.json"
done
timed "serve --dry-run" sh -c "python3 -m bcgtune serve --profile $P --dry-run > $OUT/serve.txt 2>&1"
timed "trace --simulate" python3 -m bcgtune trace --simulate --num-prompts 200 -o "$OUT/t.json" -q
timed "suggest-buckets --ask-sglang" sh -c \
    "python3 -m bcgtune suggest-buckets $OUT/t.json --write-profile $OUT/tuned.toml --base-profile $P -k 8 --ask-sglang > $OUT/suggest.txt 2>&1"
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
for name in ("doctor1", "doctor2", "doctor-patched_as_proposed", "doctor-never_true_condition"):
    try:
        d = json.load(open(f"{out}/{name}.json"))
    except Exception as exc:  # noqa: BLE001
        print(name, "unreadable:", exc)
        continue
    print(name, "outcome:", d.get("outcome"), "(exit 0 ok, 1 blocking, 5 not checked) ok:", d.get("ok"), "|", "; ".join(f"{f['severity']} {f['code']}" for f in d.get("findings", [])))
PY
head -3 "$OUT/serve.txt"; head -2 "$OUT/suggest.txt"; tail -2 "$OUT/suggest.txt"
