#!/usr/bin/env bash
# The issue-5 four-way benchmark on one GPU (device tool, repository root):
#   bash benchmarks/h200_default_workload.sh            # results under $OUT (default ./out)
# 1. calibrate the model on a 64-token bucket grid over the trace's range
# 2. suggest-buckets --objective time (K <= 12) picks among the measured sizes
# 3. gpu_replay: eager / SGLang ladder / that list / oracle (+ the earlier list for reference)
# CAL=FILE skips step 1 and uses that calibration; TRACE=FILE another trace; PREV= (empty)
# drops the reference list; GRID (64), CAL_REPEATS (10), CAL_WARMUP (3), REPEATS (5) and NO_ORACLE=1 trade
# precision for device time on big models; MAX_BS (8192) is the ladder's max (chunked prefill size).
set -euo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
TRACE=${TRACE:-benchmarks/data/default_workload.csv}
MODEL=${MODEL:-qwen3-0.6b}
PREV=${PREV-420,1138,1188,1246,1290,2304,2405,2482,2572,3589,3819,4843}  # last session's list (15-size calibration)
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'hip', torch.version.hip)"
if [ -z "${CAL:-}" ]; then
  CAL=$OUT/cal_grid_${MODEL}.json
  SECONDS=0
  python3 -m bcgtune calibrate --model "$MODEL" --sizes-from "$TRACE" --grid "${GRID:-64}" \
      --repeats "${CAL_REPEATS:-10}" --warmup "${CAL_WARMUP:-3}" \
      -o "$CAL" > "$OUT/calibrate_${MODEL}.txt" 2> "$OUT/calibrate_${MODEL}.log" || { tail -5 "$OUT/calibrate_${MODEL}.log"; exit 1; }
  echo "calibrate: $(head -1 "$OUT/calibrate_${MODEL}.log"), ${SECONDS} s"
fi
ALSO=(); CMP=()
if [ -n "$PREV" ]; then ALSO=(--also "previous=${PREV}"); CMP=(--compare "previous=${PREV}"); fi
for x in ${EXTRA:-}; do ALSO+=(--also "$x"); CMP+=(--compare "$x"); done  # EXTRA="name=l,i,s,t ..."
python3 -m bcgtune suggest-buckets "$TRACE" --objective time --calibration "$CAL" --max-buckets 12 \
    --chunked-prefill-size "${MAX_BS:-8192}" --no-baselines "${CMP[@]}" | tee "$OUT/suggest_${MODEL}.txt"
B=$(python3 -m bcgtune suggest-buckets "$TRACE" --objective time --calibration "$CAL" --max-buckets 12 \
    --chunked-prefill-size "${MAX_BS:-8192}" --no-baselines --json | python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["recommended"]["buckets"])))')
echo "buckets: $B"
python3 benchmarks/gpu_replay.py "$TRACE" --model "$MODEL" --buckets "$B" "${ALSO[@]}" --max-bs "${MAX_BS:-8192}" \
    --repeats "${REPEATS:-5}" ${NO_ORACLE:+--no-oracle} --out-json "$OUT/gpu_replay_${MODEL}.json" 2>&1 | tee "$OUT/gpu_replay_${MODEL}.txt"
