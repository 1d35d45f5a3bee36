#!/usr/bin/env bash
# Run the MUSE calibration's mocks on the borrowed TPU machine (tool `device`), within a budget.
#
#   OUT=<results dir> BUDGET=<seconds> FIRST=<first mock> MOCKS=<end> KEEP=<records dir> \
#       [DRIVERS=<n>] bash scripts/device/tpu_muse_calibration.sh [extra Hydra overrides]
#
# scripts/device/tpu_env.sh installs fli's dependencies there first (carried wheels, see its header).
# Then scripts/studies/muse_calibration.py runs mocks FIRST..MOCKS-1 with the TSC study's overrides
# until BUDGET seconds from this script's start: SIGTERM then stops each driver, which stops its
# fli-map and copies the running mock's finished fits to KEEP/partial_<i>/ (the next call, or
# this machine's drivers, resume from them). KEEP, the logs and the compilation cache come back
# packed in $OUT.
#
# DRIVERS unset or 0: one driver, its commands one at a time on the chip (the driver itself keeps
# to the CPU: one process at a time can hold the chip). The chip is no faster than one CPU core
# on tiny (docs/muse_studies.md, "The second TPU loan"), so DRIVERS=n instead runs n drivers on
# the machine's CPU cores 1..n, one mock each at a time, the chip unused: n cores' worth of mocks.
# Mocks made elsewhere (so that their fingerprints match the partial records kept there) are
# taken from .tpu-study/mock_<i>/ (ignored; carried) where present.
set -uo pipefail
T0=$(date +%s)
: "${OUT:?set OUT to a results directory}"
BUDGET=${BUDGET:-500}
FIRST=${FIRST:-0}
MOCKS=${MOCKS:-10}
DRIVERS=${DRIVERS:-0}
KEEP=${KEEP:-$PWD/docs/bench/muse_calibration_pm_tsc_tpu}
STUDY=${STUDY:-/tmp/fli_study}
mkdir -p "$OUT" "$KEEP" "$STUDY"
for m in .tpu-study/mock_*; do [ -d "$m" ] && cp -r "$m" "$STUDY/"; done
TPU_T0=$T0
. scripts/device/tpu_env.sh
LEFT=$(( BUDGET - ( $(date +%s) - T0 ) ))
echo "driver budget ${LEFT} s"
STUDY_ARGS=(--first "$FIRST" --mocks "$MOCKS" --out "$STUDY" --keep "$KEEP" --save-every 60 -- experiment=tiny
  survey.sigma_e=0.05 simulation.assignment=tsc inference.map.muse.n_sims=16 "$@")
if [ "$DRIVERS" -gt 0 ]; then
  for k in $(seq 1 "$DRIVERS"); do
    JAX_PLATFORMS=cpu timeout -s TERM "$LEFT" python -m scripts.studies.muse_calibration --core "$k" "${STUDY_ARGS[@]}" \
      > "$STUDY/driver_$k.log" 2>&1 &
    sleep 2  # each driver claims its mock before the next looks
  done
  wait
  tail -n 3 "$STUDY"/driver_*.log
else
  JAX_PLATFORMS=cpu STUDY_JAX_PLATFORMS=tpu,cpu timeout -s TERM "$LEFT" python -m scripts.studies.muse_calibration \
    --core "0-$(( $(nproc) - 1 ))" "${STUDY_ARGS[@]}" 2>&1 | tee "$OUT/driver.log"
fi
tar czf "$OUT/keep.tgz" -C "$KEEP" .
tar czf "$OUT/logs.tgz" -C "$STUDY" $(cd "$STUDY" && ls *.log 2>/dev/null)
tpu_pack_cache "$OUT"
echo "done after $(( $(date +%s) - T0 )) s"
