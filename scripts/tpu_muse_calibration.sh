#!/usr/bin/env bash
# Run the MUSE calibration's mocks on the borrowed TPU machine (tool `device`), within a budget.
#
#   OUT=<results dir> BUDGET=<seconds> FIRST=<first mock> MOCKS=<end> KEEP=<records dir> \
#       bash scripts/tpu_muse_calibration.sh [extra Hydra overrides]
#
# scripts/tpu_env.sh installs fli's dependencies there first (carried wheels, see its header).
# Then scripts/muse_calibration.py runs mocks FIRST..MOCKS-1 with the TSC study's overrides, one
# at a time on the chip, until BUDGET seconds from this script's start: SIGTERM then stops the
# driver, which stops fli-map and copies the running mock's finished fits to KEEP/partial_<i>/
# (the next call resumes from them). The driver itself keeps to the CPU: one process at a time
# can hold the chip. KEEP, the logs and the compilation cache come back packed in $OUT.
set -uo pipefail
T0=$(date +%s)
: "${OUT:?set OUT to a results directory}"
BUDGET=${BUDGET:-500}
FIRST=${FIRST:-0}
MOCKS=${MOCKS:-10}
KEEP=${KEEP:-$PWD/docs/bench/muse_calibration_pm_tsc_tpu}
STUDY=${STUDY:-/tmp/fli_study}
mkdir -p "$OUT" "$KEEP" "$STUDY"
TPU_T0=$T0
. scripts/tpu_env.sh
LEFT=$(( BUDGET - ( $(date +%s) - T0 ) ))
echo "driver budget ${LEFT} s"
JAX_PLATFORMS=cpu STUDY_JAX_PLATFORMS=tpu,cpu timeout -s TERM "$LEFT" python3 scripts/muse_calibration.py \
  --core "0-$(( $(nproc) - 1 ))" --first "$FIRST" --mocks "$MOCKS" \
  --out "$STUDY" --keep "$KEEP" --save-every 60 -- experiment=tiny survey.sigma_e=0.05 simulation.assignment=tsc \
  inference.map.muse.n_sims=16 "$@" 2>&1 | tee "$OUT/driver.log"
tar czf "$OUT/keep.tgz" -C "$KEEP" .
tar czf "$OUT/logs.tgz" -C "$STUDY" $(cd "$STUDY" && ls *.log 2>/dev/null)
tpu_pack_cache "$OUT"
echo "done after $(( $(date +%s) - T0 )) s"
