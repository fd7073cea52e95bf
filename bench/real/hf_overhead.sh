#!/usr/bin/env bash
# The agent's cost on the adapted HF run_clm.py (hf_run_clm_cpu.py: the Trainer on 2 gloo ranks),
# both arms agent-loaded: PROBE_TRACE=off against ARM (default: the default tracing; `on`: every
# module, every step), runs interleaved, each the median of the `step_s:` wall times the
# adapter's TrainerCallback prints (both ranks, optimizer steps 21-STEPS).
#   bash bench/real/hf_overhead.sh OUTDIR [PAIRS] [ARM] [STEPS]
set -euo pipefail
out=$1; pairs=${2:-4}; arm=${3:-default}; steps=${4:-200}
cd "$out"
for i in $(seq "$pairs"); do
  for a in off "$arm"; do
    if [ "$a" = off ]; then t=(PROBE_TRACE=off); elif [ "$a" = default ]; then t=(); else t=(PROBE_TRACE="$a"); fi
    l0=$(cut -d' ' -f1 /proc/loadavg)
    # shellcheck disable=SC2046  # args.txt is the adapter's word list
    env PROBE=1 "${t[@]}" PROBE_RUN_DIR="$out/run" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
      torchrun --nproc_per_node 2 --rdzv-backend=c10d --rdzv-endpoint=localhost:0 \
      run_clm_cpu.py $(cat args.txt) --max_steps "$steps" > "$out/step_${a}_$i.log" 2>&1
    med=$(grep -oP 'step_s: \K[0-9]+ [0-9.]+' "$out/step_${a}_$i.log" | awk '$1 > 20 {print $2}' \
          | sort -n | awk '{v[NR]=$1} END {printf "%.2f", 1000 * v[int((NR+1)/2)]}')
    echo "pair $i $a median_ms $med load $l0 -> $(cut -d' ' -f1 /proc/loadavg)"
  done
done
