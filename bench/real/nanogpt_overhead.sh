#!/usr/bin/env bash
# The agent's cost on the adapted build-nanogpt script (nanogpt_cpu.py), both arms agent-loaded:
# PROBE_TRACE=off against ARM (default: the default tracing; `on`: every module, every step),
# runs interleaved, each the median of the `dt:` the script itself prints (steps 21-200).
#   bash bench/real/nanogpt_overhead.sh OUTDIR [PAIRS] [on]
set -euo pipefail
out=$1; pairs=${2:-4}; arm=${3:-default}
cd "$out"
for i in $(seq "$pairs"); do
  for a in off "$arm"; do
    if [ "$a" = off ]; then t=(PROBE_TRACE=off); elif [ "$a" = default ]; then t=(); else t=(PROBE_TRACE="$a"); fi
    env PROBE=1 "${t[@]}" PROBE_RUN_DIR="$out/run" MAX_STEPS=200 \
      torchrun --nproc_per_node 2 --master_port 29612 train_gpt2_cpu.py > "$out/dt_${a}_$i.log" 2>&1
    med=$(grep -oP 'dt: \K[0-9.]+' "$out/dt_${a}_$i.log" | tail -n +21 | sort -n \
          | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')
    echo "pair $i $a median_ms $med load $(cut -d' ' -f1 /proc/loadavg)"
  done
done
