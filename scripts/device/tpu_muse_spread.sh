#!/usr/bin/env bash
# Continue one MUSE run on the borrowed TPU machine's CPU cores (tool `device`), its fits spread
# over P workers that meet through files (inference.map.muse.spread=files), within a budget.
#
#   OUT=<results dir> BUDGET=<seconds> RUN=<run dir> MOCK=<mock dir> [P=12] [FROM=0] \
#       bash scripts/device/tpu_muse_spread.sh <the run's fli-map overrides>
#
# FROM=k > 0: only workers k..P-1 run here (no fli-map); workers 0..k-1 run elsewhere (fli-map
# and fli-muse-worker on the machine that lent the run directory, already started with
# inference.map.muse.workers=P), and the score files of workers k..P-1 that come back are copied
# into its run directory, where the waiting workers read them.
#
# RUN and MOCK are carried (under .tpu-study/, ignored). RUN is a fli-map MUSE run started on
# this machine in one process and stopped once its first fits began: its joint MAP is at its
# end, its Laplace block in laplace.json and the fits' preconditioner in
# muse_preconditioner.zarr, so no worker compiles or runs any of them again and each call's
# start is the fit programs' compile. fli-map resumes as worker 0 and fli-muse-worker runs
# workers 1..P-1, each appending its fits to its own score file. At BUDGET seconds from this
# script's start SIGTERM stops them all, losing only the fits under way. RUN comes back packed
# in $OUT/run.tgz: unpack it over the carried copy for the next call (with the same P, so that
# every simulation stays with the worker that holds its last fit).
#
# Why files and not spread=processes: the machine's sandbox has no sockets (AF_INET: "Address
# family not supported by protocol"), so jax.distributed cannot start there. Why its CPU cores:
# the chip is no faster than one CPU core on tiny (docs/muse_studies.md, "The second TPU loan").
set -uo pipefail
T0=$(date +%s)
: "${OUT:?set OUT to a results directory}" "${RUN:?set RUN to the carried run directory}" "${MOCK:?set MOCK}"
BUDGET=${BUDGET:-540}
P=${P:-12}
mkdir -p "$OUT"
TPU_T0=$T0
. scripts/device/tpu_env.sh
LEFT=$(( BUDGET - ( $(date +%s) - T0 ) ))
echo "fli-map and $(( P - 1 )) workers, ${LEFT} s left; fits so far: $(cat "$RUN"/muse_scores*.jsonl 2>/dev/null | wc -l)"
export JAX_PLATFORMS=cpu PYTHONUNBUFFERED=1 JAX_LOG_COMPILES=0
# one XLA thread pool per process would put P x 13 threads on 13 cores
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
FROM=${FROM:-0}
if [ "$FROM" -eq 0 ]; then
  timeout -s TERM "$LEFT" python3 -m fli.cli.map "$@" mock="$MOCK" run_dir="$RUN" inference.map.muse.spread=files \
    "inference.map.muse.workers=$P" progress=false > "$OUT/worker_0.log" 2>&1 &
  # the workers read the run's config.yaml: wait until fli-map has written this start's (spread=files)
  for _ in $(seq 1 120); do grep -q "spread: files" "$RUN/config.yaml" 2>/dev/null && break; sleep 1; done
  FROM=1
fi
for k in $(seq "$FROM" $(( P - 1 ))); do
  timeout -s TERM "$LEFT" python3 -m fli.cli.muse_worker "$RUN" "$k" --mock "$MOCK" > "$OUT/worker_$k.log" 2>&1 &
done
wait
echo "fits now: $(cat "$RUN"/muse_scores*.jsonl 2>/dev/null | wc -l)"
[ -f "$OUT/worker_0.log" ] && tail -n 12 "$OUT/worker_0.log"
for k in $(seq "$FROM" $(( P - 1 ))); do echo "worker $k: $(tail -n 1 "$OUT/worker_$k.log" | cut -c1-160)"; done
tar czf "$OUT/run.tgz" -C "$RUN" .
echo "done after $(( $(date +%s) - T0 )) s"
