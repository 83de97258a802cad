#!/usr/bin/env bash
# `bcgtune tune` on the default workload on one GPU (device tool, repository root); results under $OUT (./out):
#   MODEL=qwen3-8b bash benchmarks/h200_tune.sh
# The trace is the simulated default workload with request counts and batch order
# (benchmarks/data/default_workload.json: `bcgtune trace --simulate --workload mi355x-multimodal-pr
# --chunked-prefill-size 8192`, 1,275 batches, 595 distinct sizes), as h200_default_workload.sh uses.
# One tune with nothing but the model, the chunk and the device seconds it may take (BUDGET,
# default the tune's own 600 s): the tune plans its grid, rounds, model check and proof to fit
# (the plan is printed first), then runs them. Any knob given overrides the plan: GRID,
# MIX_EVERY, CAL_REPEATS, CAL_WARMUP, CHECK (model-check batches), PROOF (proof batches),
# PROOF_REPEATS, MEASURE_ROUNDS, PASSES, K (max buckets), MEMORY=0|1; also TRACE, MODEL,
# MAX_BS (8192: the chunked prefill size), STATE (the state folder: give an existing one to
# resume a killed run), PLOT=1 (needs matplotlib), ENGINE (more engine options, e.g. "--tp 4"),
# NAME (the outputs' name, default $MODEL).
# WHOLE=1 then replays the whole trace in order under the recommended list and the ladder
# (benchmarks/whole_trace_check.py; WHOLE_PASSES 2, WHOLE_REPEATS 2, WHOLE_WARMUP 1) and says whether the
# measured gain falls inside the tune's whole-trace interval. WHOLE=only runs just that, on
# an earlier call's $OUT/tune_$NAME.json (give OUT a folder kept between calls).
# Writes $OUT/tune_$NAME.json (every step's figures), .txt (the table), .log (progress, each
# step's wall time), tuned_$NAME.toml (a copy of the h200 profile with the list and its [tuned]
# record), whole_$NAME.json/.txt (WHOLE).
set -euo pipefail
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
TRACE=${TRACE:-benchmarks/data/default_workload.json}
MODEL=${MODEL:-qwen3-0.6b}
NAME=${NAME:-$MODEL}
STATE=${STATE:-$OUT/tune_state_$NAME}
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'hip', torch.version.hip)"
opt() { [ -n "$2" ] && echo "$1 $2"; return 0; }
if [ "${WHOLE:-}" != only ]; then
# the list and [tuned] go into a copy of the h200 profile, whose model's config is not on the GPU
# machine: --unchecked writes it, and the file records that SGLang did not check its launch
[ -f "$OUT/tuned_$NAME.toml" ] || cp profiles/h200.toml "$OUT/tuned_$NAME.toml"
SECONDS=0
# shellcheck disable=SC2086  # ENGINE holds several options
python3 -m bcgtune tune "$TRACE" --model "$MODEL" ${ENGINE:-} --state-dir "$STATE" --chunked-prefill-size "${MAX_BS:-8192}" \
    $(opt --budget "${BUDGET:-}") $(opt --grid "${GRID:-}") $(opt --mix-every "${MIX_EVERY:-}") $(opt --repeats "${CAL_REPEATS:-}") \
    $(opt --warmup "${CAL_WARMUP:-}") $(opt --check-batches "${CHECK:-}") $(opt --proof-batches "${PROOF:-}") \
    $(opt --proof-repeats "${PROOF_REPEATS:-}") $(opt --passes "${PASSES:-}") $(opt --measure-rounds "${MEASURE_ROUNDS:-}") \
    $(opt --max-buckets "${K:-}") $([ "${MEMORY:-}" = 0 ] && echo --no-memory) $([ "${MEMORY:-}" = 1 ] && echo --memory) \
    --write-profile "$OUT/tuned_$NAME.toml" --unchecked \
    $([ -n "${PLOT:-}" ] && echo --plot "$OUT/tune_$NAME.png") \
    --json > "$OUT/tune_$NAME.json" 2> "$OUT/tune_$NAME.log" || { tail -20 "$OUT/tune_$NAME.log"; exit 1; }
grep -E '^\[' "$OUT/tune_$NAME.log" || true
python3 - "$OUT/tune_$NAME.json" > "$OUT/tune_$NAME.txt" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
p = d["steps"]["proof"]
def iv(x, unit=1e3):
    return f"{x['center'] / unit:.3f}" + (f" ± {x['half'] / unit:.3f}" if x.get("half") is not None else "")
print(f"recommended: {d['buckets']}")
for k, s in d["steps"].items():
    print(f"step {k}: {s['wall_s']:.1f} s")
b = d.get("budget") or {}
print(f"budget: {b.get('limit_s')} s, predicted {b.get('predicted_s')} s, spent {b.get('spent_s')} s")
print(f"proof: {p['batches']} of {p['of']} batches ({(p.get('sample') or {}).get('strata_by', '?')}), {p['passes']} passes x {p['repeats']} rounds on {p['device']}")
t = p["trace_estimate"]
print(f"gain over the ladder on the whole trace: {t['gain_pct']:.2f}% ± {t['half_pct']:.2f} (95%; measured on {t['sampled_batches']} of {t['trace_batches']} batches)")
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
cat "$OUT/tune_$NAME.txt"
echo "tune: ${SECONDS} s in all"
fi
if [ -n "${WHOLE:-}" ]; then
  SECONDS=0
  # shellcheck disable=SC2086
  python3 benchmarks/whole_trace_check.py "$OUT/tune_$NAME.json" "$TRACE" --model "$MODEL" --chunked-prefill-size "${MAX_BS:-8192}" \
      --passes "${WHOLE_PASSES:-2}" --repeats "${WHOLE_REPEATS:-2}" --warmup "${WHOLE_WARMUP:-1}" --out-json "$OUT/whole_$NAME.json" | tee "$OUT/whole_$NAME.txt"
  echo "whole-trace replay: ${SECONDS} s"
fi
