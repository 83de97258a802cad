#!/usr/bin/env bash
# `bcgtune tune` on the default workload on one GPU (device tool, repository root); results under $OUT (./out):
#   MODEL=qwen3-8b bash benchmarks/h200_tune.sh
# The trace is the simulated default workload with request counts and batch order
# (benchmarks/data/default_workload.json: `bcgtune trace --simulate --workload mi355x-multimodal-pr
# --chunked-prefill-size 8192`, 1,275 batches, 595 distinct sizes), as h200_default_workload.sh uses.
# One tune: calibrate on the trace with the model check, the time optimum, the sizes it wants
# measured, validation, and a proof run of PASSES independent passes (the recommended list,
# SGLang's ladder and eager, every list in the same interleaved rounds of a pass).
# Sampling, chosen to keep the 8B under ~8 minutes on one H200 (the 0.6B takes less):
#   qwen3-8b:   --grid 256 --mix-every 32, 5 rounds after 2 warm-up, no graph-memory curve in the
#               calibration (the proof run still measures the list's memory); the model check
#               replays every 20th batch (64 of 1,275) in trace order; the proof run every 27th
#               (48); 3 timed rounds per pass after 1 warm-up; at most 2 measuring rounds
#   qwen3-0.6b: --grid 128 --mix-every 8, 8 rounds after 3 warm-up; the model check every 11th
#               batch (116; it replays eager too, twice the time of a graph list on this
#               launch-bound shape); the proof run every 8th (160); 5 rounds per pass; 3 measuring
#               rounds: about 9 minutes, inside one 10-minute device call
# Knobs (override the preset): TRACE, MODEL, PASSES (3), GRID, MIX_EVERY, CAL_REPEATS, CAL_WARMUP,
# CHECK (model-check batches), PROOF (proof batches), PROOF_REPEATS, MEASURE_ROUNDS, K (12),
# MAX_BS (8192: the chunked prefill size), MEMORY=0|1 (the calibration's graph-memory curve; 8B preset 0),
# STATE (the state folder: give an existing one to resume a killed run), PLOT=1 (needs matplotlib).
# Writes $OUT/tune_$MODEL.json (every step's figures), .txt (the table), .log (progress, each
# step's wall time), tuned_$MODEL.toml (a copy of the h200 profile with the list and its [tuned] record).
set -euo pipefail
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
TRACE=${TRACE:-benchmarks/data/default_workload.json}
MODEL=${MODEL:-qwen3-0.6b}
case "$MODEL" in
  qwen3-8b) D_GRID=256 D_MIX=32 D_REP=5 D_WARM=2 D_CHECK=64 D_PROOF=48 D_PREP=3 D_MEAS=2 D_MEM=0 ;;
  *)        D_GRID=128 D_MIX=8  D_REP=8 D_WARM=3 D_CHECK=120 D_PROOF=160 D_PREP=5 D_MEAS=3 D_MEM=1 ;;
esac
STATE=${STATE:-$OUT/tune_state_$MODEL}
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'hip', torch.version.hip)"
echo "sampling: grid ${GRID:-$D_GRID}, every ${MIX_EVERY:-$D_MIX}th distinct batch calibrated, ${CAL_REPEATS:-$D_REP} rounds;" \
     "model check on at most ${CHECK:-$D_CHECK} trace batches, proof on at most ${PROOF:-$D_PROOF} (every Nth, in trace order)," \
     "${PASSES:-3} passes of ${PROOF_REPEATS:-$D_PREP} rounds"
# the list and [tuned] go into a copy of the h200 profile, whose model's config is not on the GPU
# machine: --unchecked writes it, and the file records that SGLang did not check its launch
[ -f "$OUT/tuned_$MODEL.toml" ] || cp profiles/h200.toml "$OUT/tuned_$MODEL.toml"
SECONDS=0
python3 -m bcgtune tune "$TRACE" --model "$MODEL" --state-dir "$STATE" --chunked-prefill-size "${MAX_BS:-8192}" \
    --grid "${GRID:-$D_GRID}" --mix-every "${MIX_EVERY:-$D_MIX}" --repeats "${CAL_REPEATS:-$D_REP}" --warmup "${CAL_WARMUP:-$D_WARM}" \
    --check-batches "${CHECK:-$D_CHECK}" --proof-batches "${PROOF:-$D_PROOF}" --proof-repeats "${PROOF_REPEATS:-$D_PREP}" \
    --passes "${PASSES:-3}" --measure-rounds "${MEASURE_ROUNDS:-$D_MEAS}" --max-buckets "${K:-12}" \
    $([ "${MEMORY:-$D_MEM}" = 0 ] && echo --no-memory) \
    --write-profile "$OUT/tuned_$MODEL.toml" --unchecked \
    $([ -n "${PLOT:-}" ] && echo --plot "$OUT/tune_$MODEL.png") \
    --json > "$OUT/tune_$MODEL.json" 2> "$OUT/tune_$MODEL.log" || { tail -20 "$OUT/tune_$MODEL.log"; exit 1; }
grep -E '^\[' "$OUT/tune_$MODEL.log" || true
python3 - "$OUT/tune_$MODEL.json" > "$OUT/tune_$MODEL.txt" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
p = d["steps"]["proof"]
def iv(x, unit=1e3):
    return f"{x['center'] / unit:.3f}" + (f" ± {x['half'] / unit:.3f}" if x.get("half") is not None else "")
print(f"recommended: {d['buckets']}")
for k, s in d["steps"].items():
    print(f"step {k}: {s['wall_s']:.1f} s")
print(f"proof: {p['batches']} of {p['of']} batches (every {p['every']}), {p['passes']} passes x {p['repeats']} rounds on {p['device']}")
for name, r in p["lists"].items():
    print(f"{name:14s} {r['graphs']:3d} graphs  predicted {iv(r['predicted'])} s  measured " + ", ".join(iv(m) for m in r["measured"])
          + f" s  inside {r['inside']}/{p['passes']}")
dd = p["recommended_minus_ladder"]
print(f"recommended - ladder: predicted {iv(dd['predicted'], 1)} ms; measured " + ", ".join(iv(m, 1) for m in dd["measured"])
      + f" ms; inside {dd['inside']}/{p['passes']}")
o = p.get("recommended_minus_optimum")
if o:
    print(f"recommended - optimum: predicted {iv(o['predicted'], 1)} ms; measured " + ", ".join(iv(m, 1) for m in o["measured"])
          + f" ms; within the {o['tolerance_pct']:g}% margin ({o['margin_ms']:.1f} ms) in {o['within_margin']}/{p['passes']}"
          + f", not measurably beyond it in {o.get('not_beyond_margin', '?')}/{p['passes']}"
          + f"; batches the two run differently: {o.get('differing_batches', '?')} of the proof's, {o.get('differing_batches_in_trace', '?')} of the trace's")
PY
cat "$OUT/tune_$MODEL.txt"
echo "tune: ${SECONDS} s in all"
