#!/usr/bin/env bash
# Issue 40's closing check: `probe doctor` on build-nanogpt's train_gpt2.py (2 ranks, gloo, CPU)
# with a loss spike, a stall and a NaN, nothing logged to the agent (nanogpt_numerics.py says
# what each fault is). Writes OUTDIR/FAULT/doctor.txt and the script's own log beside it.
#   bash bench/real/nanogpt_numerics.sh UPSTREAM/train_gpt2.py OUTDIR [FAULT...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
upstream=$(realpath "$1"); out=$(realpath -m "$2"); shift 2
faults=("${@:-spike stall nan}")
py=${PYTHON:-python}
probe() { PROBE_RUN_DIR="$dir/run" "$py" -m probe_cli "$@"; }
step_now() { probe --rank 0 query "SELECT coalesce(max(step), 0) FROM python.steps" 2>/dev/null \
               | tail -1 | tr -dc 0-9; }
wait_step() {  # until rank 0 has finished step $1 (or the job ended)
  until [ "$(step_now || echo 0)" -ge "$1" ] 2>/dev/null; do
    kill -0 "$job" 2>/dev/null || { echo "the job ended early: $dir/train.log" >&2; return 1; }
    sleep 2
  done
}
for fault in ${faults[*]}; do
  dir="$out/$fault"; rm -rf "$dir"; mkdir -p "$dir"
  "$py" "$here/nanogpt_numerics.py" "$upstream" "$dir" "$fault" --at 120
  (cd "$dir" && PROBE=1 PROBE_RUN_DIR="$dir/run" MAX_STEPS=100000 \
     exec "$py" -m torch.distributed.run --nproc_per_node 2 --rdzv-backend=c10d \
     --rdzv-endpoint=localhost:0 train_gpt2_cpu.py > "$dir/train.log" 2>&1) &
  job=$!
  case $fault in
    spike) wait_step 160 ;;
    stall) wait_step 200 ;;
    nan)
      wait_step 100
      # rank 1's copy of one embedding row turns NaN (a corrupted weight) at a step boundary
      probe --rank 1 eval --next-step \
        "raw_model.transformer.wte.weight.data[7] = float('nan')" | tee "$dir/eval.txt"
      wait_step 130 ;;
  esac
  set +e
  probe doctor > "$dir/doctor.txt" 2>&1; echo "exit $?" >> "$dir/doctor.txt"
  probe numerics > "$dir/numerics.txt" 2>&1; echo "exit $?" >> "$dir/numerics.txt"
  set -e
  echo "== $fault: $dir/doctor.txt"; cat "$dir/doctor.txt"
  pkill -TERM -P "$job" 2>/dev/null || true; kill "$job" 2>/dev/null || true; wait "$job" || true
done
