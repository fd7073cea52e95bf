#!/usr/bin/env bash
# Demo: a 2-rank CPU training job (DDP over gloo) with the probe agent in every rank, probed by
# the CLI the way an on-call engineer would. Installs into .venv first (see docker/setup.sh).
#   DEMO_PORT   base port of the agents (default 9700; rank r listens on DEMO_PORT + r)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${PROBE_DEMO_SKIP_SETUP:-0}" != "1" ]; then
    bash docker/setup.sh
fi
# shellcheck disable=SC1091
. .venv/bin/activate
PORT=${DEMO_PORT:-9700}
WORK=$(mktemp -d /tmp/probe-demo.XXXXXX)
STOP="$WORK/stop"

cleanup() {
    if [ -n "${UI:-}" ]; then kill -TERM "$UI" 2>/dev/null || true; wait "$UI" 2>/dev/null || true; fi
    touch "$STOP"
    if [ -n "${JOB:-}" ] && kill -0 "$JOB" 2>/dev/null; then
        for _ in $(seq 50); do kill -0 "$JOB" 2>/dev/null || break; sleep 0.2; done
        kill -TERM -- "-$JOB" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

echo "==> starting: probe launch --port $PORT -- torchrun --nproc-per-node=2 docker/demo_train.py"
PROBE_RUN_DIR="$WORK/run" setsid probe launch --port "$PORT" -- \
    python -m torch.distributed.run --nproc-per-node=2 --rdzv-backend=c10d \
    --rdzv-endpoint=localhost:0 docker/demo_train.py --stop-file "$STOP" \
    >"$WORK/job.log" 2>&1 &
JOB=$!

echo "==> waiting for both ranks to answer"
for _ in $(seq 300); do
    if probe -t "127.0.0.1:$PORT" --timeout 2 --json eval "trainer.current_step" 2>/dev/null \
        | python -c 'import json,sys; b=json.load(sys.stdin); sys.exit(0 if len(b)==2 and all(r["ok"] and int(r["result"]) >= 30 for r in b) else 1)'; then
        break
    fi
    sleep 0.2
done

echo "==> starting the dashboard: probe -t 127.0.0.1:$PORT ui --port ${DEMO_UI_PORT:-8700}"
probe -t "127.0.0.1:$PORT" ui --port "${DEMO_UI_PORT:-8700}" >"$WORK/ui.log" 2>&1 &
UI=$!
for _ in $(seq 50); do grep -q "dashboard at" "$WORK/ui.log" 2>/dev/null && break; sleep 0.1; done
sed -n 's/^probe ui: //p' "$WORK/ui.log"

run() { echo; echo "\$ $*"; "$@" || echo "(exit code $?)"; }
run probe -t "127.0.0.1:$PORT" info
run probe -t "127.0.0.1:$PORT" backtrace
run probe -t "127.0.0.1:$PORT" query "SELECT func, file, lineno, depth FROM python.backtrace WHERE is_main ORDER BY depth LIMIT 5"
run probe -t "127.0.0.1:$PORT" eval "trainer.current_step, round(trainer.loss, 3), optimizer.param_groups[0]['lr']"
run probe -t "127.0.0.1:$PORT" eval "train_loader.num_workers"
run probe -t "127.0.0.1:$PORT" steps
run probe -t "127.0.0.1:$PORT" slow
run probe -t "127.0.0.1:$PORT" straggler
run probe -t "127.0.0.1:$PORT" hang
echo
echo "==> done; stopping the job"
