#!/usr/bin/env bash
# One node of the demo job: `probe launch` + torchrun (gloo, static rendezvous) + demo_train.py.
# The containers in compose.yaml and the container-free CI test (tests/e2e/test_two_node.py) both
# run this script. Settings (environment):
#   NODE_RANK (0)  NNODES (2)  NPROC (2)  MASTER_ADDR (127.0.0.1)  MASTER_PORT (29500)
#   PROBE_PORT (9700): base port of this node's agents (rank r listens on PROBE_PORT + LOCAL_RANK)
#   PROBE_TOKEN_FILE: file holding the token every request must carry (optional)
#   DEMO_PROGRAM (docker/demo_train.py next to this script); extra arguments go to the program.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
args=(--port "${PROBE_PORT:-9700}")
if [ -n "${PROBE_TOKEN_FILE:-}" ]; then
    args+=(--token-file "$PROBE_TOKEN_FILE")
fi
exec probe launch "${args[@]}" -- \
    python -m torch.distributed.run \
    --nnodes="${NNODES:-2}" --nproc-per-node="${NPROC:-2}" --node-rank="${NODE_RANK:-0}" \
    --master-addr="${MASTER_ADDR:-127.0.0.1}" --master-port="${MASTER_PORT:-29500}" \
    "${DEMO_PROGRAM:-$HERE/demo_train.py}" "$@"
