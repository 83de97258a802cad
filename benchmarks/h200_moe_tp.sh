#!/usr/bin/env bash
# The shapes a TP-N MoE server runs, on one GPU (device tool, repository root); results under $OUT (./out):
#   BUDGET=150 bash benchmarks/h200_moe_tp.sh      # everything on one GPU (BUDGET: each tune's device seconds)
#   PARTS="30b tp4" bash benchmarks/h200_moe_tp.sh  # some of it (parts: 30b tp4 8b plot)
# On the default workload's trace (benchmarks/data/default_workload.json, as h200_tune.sh):
#   30b   `bcgtune tune` of qwen3-30b-a3b at TP 1 (benchmarks/h200_tune.sh: the tune plans its
#         sampling to fit BUDGET device seconds, default 600; give BUDGET=240 to fit one call
#         beside the other parts): the tuned list against SGLang's ladder, measured in trace order;
#   tp4   the same for one rank of qwen3-30b-a3b at TP 4 (--tp 4: 8 query heads, 1 KV head, every
#         expert 192 wide), its 97 all-reduces per forward modelled on this one GPU (the stated ring
#         curve, or ALL_REDUCE_CURVE=FILE: nccl-tests' all_reduce_perf output of the TP-4 host);
#   8b    a calibration of dense qwen3-8b on the same grid (no tune), for the curves;
#   plot  the time curves of the three calibrations side by side (benchmarks/plot_time_curves.py:
#         curves_moe_tp.png where matplotlib is installed, curves_moe_tp.csv always).
#   tp2   (not in the default PARTS: a host with 2 GPUs or more) one rank of qwen3-30b-a3b at TP 2
#         calibrated with real all-reduces (NCCL, one process per GPU), and modelled from the curve
#         measured here (benchmarks/allreduce_curve.py) and from the stated one; their curves plotted
#         side by side (curves_tp2.png / .csv).
# On one GPU a TP rank's all-reduces are modelled, and the calibration says so.
# Knobs: TRACE, MAX_BS (8192), ROUTING (skewed), ALL_REDUCE_CURVE, PARTS, MODEL_MOE, MODEL_DENSE, HIDDEN
# (the MoE model's hidden size, for the measured curve), AR_DEVICE (cuda), and h200_tune.sh's knobs.
set -euo pipefail
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
export OUT
TRACE=${TRACE:-benchmarks/data/default_workload.json}; export TRACE
MODEL_MOE=${MODEL_MOE:-qwen3-30b-a3b}
MODEL_DENSE=${MODEL_DENSE:-qwen3-8b}
PARTS=${PARTS:-30b tp4 8b plot}
ROUTING=${ROUTING:-skewed}
CURVE=()
[ -n "${ALL_REDUCE_CURVE:-}" ] && CURVE=(--all-reduce-curve "$ALL_REDUCE_CURVE")
SECONDS=0
has() { [[ " $PARTS " == *" $1 "* ]]; }
if has 30b; then
    echo "== $MODEL_MOE at TP 1"
    MODEL="$MODEL_MOE" NAME=moe_tp1 ENGINE="--routing $ROUTING" bash benchmarks/h200_tune.sh
fi
if has tp4; then
    echo "== one rank of $MODEL_MOE at TP 4 (all-reduces modelled)"
    MODEL="$MODEL_MOE" NAME=moe_tp4 ENGINE="--routing $ROUTING --tp 4 --all-reduce modelled ${CURVE[*]}" \
        bash benchmarks/h200_tune.sh
fi
if has 8b; then
    echo "== $MODEL_DENSE calibrated on the same grid"
    python3 -m bcgtune calibrate --model "$MODEL_DENSE" --sizes-from "$TRACE" --grid "${GRID:-512}" --mix-every "${MIX_EVERY:-64}" \
        --repeats "${CAL_REPEATS:-3}" --warmup "${CAL_WARMUP:-1}" --no-memory --no-model-check \
        --chunked-prefill-size "${MAX_BS:-8192}" -o "$OUT/cal_dense.json" 2> "$OUT/cal_dense.log" \
        || { tail -20 "$OUT/cal_dense.log"; exit 1; }
    tail -3 "$OUT/cal_dense.log"
fi
if has tp2; then
    echo "== one rank of $MODEL_MOE at TP 2: real all-reduces against modelled ones"
    python3 benchmarks/allreduce_curve.py --ranks 2 --hidden "${HIDDEN:-2048}" --device "${AR_DEVICE:-cuda}" -o "$OUT/ar_tp2.json"
    cal() {
        python3 -m bcgtune calibrate --model "$MODEL_MOE" --routing "$ROUTING" --tp 2 "$@" --sizes-from "$TRACE" \
            --grid "${GRID:-512}" --mix-every "${MIX_EVERY:-64}" --repeats "${CAL_REPEATS:-3}" --warmup "${CAL_WARMUP:-1}" \
            --no-memory --no-model-check --chunked-prefill-size "${MAX_BS:-8192}"
    }
    cal --all-reduce real -o "$OUT/cal_tp2_real.json" 2> "$OUT/cal_tp2_real.log" || { tail -20 "$OUT/cal_tp2_real.log"; exit 1; }
    cal --all-reduce modelled --all-reduce-curve "$OUT/ar_tp2.json" -o "$OUT/cal_tp2_measured_curve.json" 2> "$OUT/cal_tp2_mc.log"
    cal --all-reduce modelled -o "$OUT/cal_tp2_stated_curve.json" 2> "$OUT/cal_tp2_sc.log"
    python3 benchmarks/plot_time_curves.py "real=$OUT/cal_tp2_real.json" "measured-curve=$OUT/cal_tp2_measured_curve.json" \
        "stated-curve=$OUT/cal_tp2_stated_curve.json" -o "$OUT/curves_tp2.png"
fi
if has plot; then
    args=()
    [ -f "$OUT/cal_dense.json" ] && args+=("dense=$OUT/cal_dense.json")
    [ -f "$OUT/tune_state_moe_tp1/calibration.json" ] && args+=("moe-tp1=$OUT/tune_state_moe_tp1/calibration.json")
    [ -f "$OUT/tune_state_moe_tp4/calibration.json" ] && args+=("moe-tp4-rank=$OUT/tune_state_moe_tp4/calibration.json")
    if [ ${#args[@]} -gt 0 ]; then
        python3 benchmarks/plot_time_curves.py "${args[@]}" -o "$OUT/curves_moe_tp.png"
    fi
fi
echo "moe_tp: ${SECONDS} s in all"
