#!/usr/bin/env bash
# Prefill-graph benchmark on one GPU (device tool, repository root); results under $OUT (./out):
#   bash benchmarks/h200_default_workload.sh
# 1. calibrate the model on the runner (RUNNER, default breakable): segments on a bucket grid
#    over the trace's range, eager and break time on the trace's (tokens, requests) batches
#    (every MIX_EVERY-th distinct batch; the full runner: eager and replay per grid size)
# 2. suggest-buckets --objective time (at most K buckets) picks among the grid's measured sizes
# 3. gpu_replay: eager / SGLang ladder / that list / oracle / EXTRA lists on the same runner,
#    each list's predicted total next to its measured one
# With AA=N (A/A mode): step 3 replays eager, the ladder, the optimum, the recommended list (when
# it differs) and the EXTRA lists in N independent passes, every list in the same interleaved
# rounds of a pass, and prints each list's predicted total +- its interval beside each pass's
# measured total, how many passes fall inside, and the recommended list's difference from the
# ladder (predicted, paired; measured per pass; mean and SE over passes). MEMORY=0: calibrate
# without the graph-memory measurement (saves device time; the memory column is then empty).
# Knobs: TRACE (the default workload with request counts), MODEL, RUNNER, CAL=FILE (skip 1),
# GRID (64), MIX_EVERY (1), CAL_REPEATS (10), CAL_WARMUP (3), REPEATS (5), WARMUP (1), EVERY (1: replay
# every Kth distinct batch), NO_ORACLE=1, MAX_BS (8192: the ladder's max, the chunked prefill
# size), EXTRA="name=l,i,s,t ..." (more lists, e.g. padding optima), K (12: the time optimum's
# most buckets), CAL_ONLY=1 (stop after the calibration), GRID_ONLY=1 (calibrate the grid
# alone; by default the calibration also measures every bucket of the lists replayed: the
# ladder, EXTRA and the oracle's sizes, so each list is predicted from measured sizes).
set -euo pipefail
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
TRACE=${TRACE:-benchmarks/data/default_workload.json}
MODEL=${MODEL:-qwen3-0.6b}
RUNNER=${RUNNER:-breakable}
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'hip', torch.version.hip)"
if [ -z "${CAL:-}" ]; then
  CAL=$OUT/cal_${RUNNER}_${MODEL}.json
  SECONDS=0
  ADD=()
  if [ -z "${GRID_ONLY:-}" ]; then
    ADD=(--sizes "$(python3 - "$TRACE" "${EVERY:-1}" "${MAX_BS:-8192}" "${NO_ORACLE:-}" ${EXTRA:-} <<'PY'
import sys
from bcgtune.core.sglang.ladder import sglang_default_ladder
from bcgtune.core.trace.mix import batch_mix
from bcgtune.core.sglang.replay import parse_bucket_list
from bcgtune.files.trace_file import load_trace
trace, every, max_bs, no_oracle, *extra = sys.argv[1:]
mix = batch_mix(load_trace(trace)).sample(int(every))
lo, hi = int(mix.tokens.min()), int(max_bs)
sizes = {b for b in sglang_default_ladder(hi) if lo <= b}
for spec in extra:
    sizes |= set(parse_bucket_list(spec.partition("=")[2], "EXTRA"))
if not no_oracle:
    sizes |= set(mix.tokens.tolist())
print(",".join(str(b) for b in sorted(s for s in sizes if s <= hi)))
PY
)")
  fi
  python3 -m bcgtune calibrate --model "$MODEL" --runner "$RUNNER" --sizes-from "$TRACE" --grid "${GRID:-64}" "${ADD[@]}" \
      --mix-every "${MIX_EVERY:-1}" --repeats "${CAL_REPEATS:-10}" --warmup "${CAL_WARMUP:-3}" \
      --chunked-prefill-size "${MAX_BS:-8192}" $([ "${MEMORY:-1}" = 0 ] && echo --no-memory) \
      -o "$CAL" > "$OUT/calibrate_${MODEL}.txt" 2> "$OUT/calibrate_${MODEL}.log" || { tail -5 "$OUT/calibrate_${MODEL}.log"; exit 1; }
  echo "calibrate: $(head -1 "$OUT/calibrate_${MODEL}.log"), ${SECONDS} s"
  [ -n "${CAL_ONLY:-}" ] && exit 0
fi
ALSO=(); CMP=()
for x in ${EXTRA:-}; do ALSO+=(--also "$x"); CMP+=(--compare "$x"); done
python3 -m bcgtune suggest-buckets "$TRACE" --objective time --calibration "$CAL" --max-buckets "${K:-12}" \
    --chunked-prefill-size "${MAX_BS:-8192}" --no-baselines "${CMP[@]}" > "$OUT/suggest_${MODEL}.txt"
python3 -m bcgtune suggest-buckets "$TRACE" --objective time --calibration "$CAL" --max-buckets "${K:-12}" \
    --chunked-prefill-size "${MAX_BS:-8192}" --no-baselines --json > "$OUT/suggest_${MODEL}.json"
B=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["optimal"]["buckets"])))' "$OUT/suggest_${MODEL}.json")
R=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["recommended"]["buckets"])))' "$OUT/suggest_${MODEL}.json")
echo "optimum: $B"
echo "recommended: $R"
SECONDS=0
if [ -n "${AA:-}" ]; then
  python3 benchmarks/gpu_replay.py "$TRACE" --model "$MODEL" --runner "$RUNNER" --buckets "$B" --recommended "$R" "${ALSO[@]}" \
      --max-bs "${MAX_BS:-8192}" --every "${EVERY:-1}" --warmup "${WARMUP:-1}" --repeats "${REPEATS:-5}" --no-oracle \
      --aa "$AA" --calibration "$CAL" --out-json "$OUT/gpu_replay_aa_${MODEL}.json" 2>&1 | tee "$OUT/gpu_replay_aa_${MODEL}.txt"
  echo "gpu_replay: ${SECONDS} s"
  exit 0
fi
python3 benchmarks/gpu_replay.py "$TRACE" --model "$MODEL" --runner "$RUNNER" --buckets "$B" "${ALSO[@]}" \
    --max-bs "${MAX_BS:-8192}" --every "${EVERY:-1}" --warmup "${WARMUP:-1}" --repeats "${REPEATS:-5}" ${NO_ORACLE:+--no-oracle} \
    --calibration "$CAL" --out-json "$OUT/gpu_replay_${MODEL}.json" 2>&1 | tee "$OUT/gpu_replay_${MODEL}.txt"
echo "gpu_replay: ${SECONDS} s"
