#!/usr/bin/env bash
# DeepStack validation on one GPU (device tool, repository root); results under $OUT (./out):
#   bash benchmarks/h200_deepstack_validate.sh
# Runs `bcgtune validate --images` on a model with DeepStack three times: as it is (must pass,
# DeepStack read by replay on every image batch), then the two negative controls
# (--inject-fault drop-deepstack, stale-deepstack), each of which must fail (exit 1) naming
# DeepStack. Prints each run's wall time and verdict; exits 0 only when all three behave.
# Knobs: MODEL (qwen3-vl-8b), BUCKETS ('512 1024 2048'), REQUESTS (1,4), RUNNER (breakable),
# DEVICE (auto), EXTRA (more validate options, e.g. --sizes-per-bucket 2).
set -uo pipefail
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
MODEL=${MODEL:-qwen3-vl-8b}
BUCKETS=${BUCKETS:-512 1024 2048}
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'hip', torch.version.hip)"
status=0
for FAULT in none drop-deepstack stale-deepstack; do
  name=validate_${MODEL}_${FAULT}
  SECONDS=0
  # shellcheck disable=SC2086
  python3 -m bcgtune validate --model "$MODEL" --images --buckets "$BUCKETS" --requests "${REQUESTS:-1,4}" \
      --runner "${RUNNER:-breakable}" --device "${DEVICE:-auto}" --inject-fault "$FAULT" ${EXTRA:-} \
      -o "$OUT/$name.json" > "$OUT/$name.txt" 2> "$OUT/$name.log"
  rc=$?
  verdict=$(grep '^error:' "$OUT/$name.log" | tail -1)
  echo "$FAULT: exit $rc, ${SECONDS} s ${verdict:+($verdict)}"
  grep -A3 '^side inputs' "$OUT/$name.txt" | sed 's/^/  /'
  if [ "$FAULT" = none ]; then
    [ "$rc" = 0 ] || status=1
  elif [ "$rc" != 1 ] || ! grep -q 'DeepStack' <<<"$verdict"; then
    echo "  the negative control $FAULT did not fail naming DeepStack"; status=1
  fi
done
exit $status
