#!/usr/bin/env bash
# Several processes on one machine (CPU devices, gloo collectives): a real test of the
# multi-node path. usage: scripts/launch/local.sh NPROC DEVICES_PER_PROC [fli-mock overrides...]
set -euo pipefail
n=${1:?number of processes}; d=${2:?devices per process}; shift 2
port=$(( 20000 + RANDOM % 20000 ))
run_dir=${RUN_DIR:-outputs/mock/local-$(date +%Y%m%d-%H%M%S)}
pids=()
for ((i = 0; i < n; i++)); do
  fli-mock "$@" run_dir="$run_dir" distributed.coordinator=127.0.0.1:$port \
    distributed.num_processes=$n distributed.process_id=$i distributed.local_device_count=$d &
  pids+=($!)
done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
