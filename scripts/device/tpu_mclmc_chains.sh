#!/usr/bin/env bash
# Extend one fli-sample run of many vectorised MCLMC chains on the borrowed TPU chip (tool `device`),
# within a budget: a reference chain for the MUSE agreement check (docs/muse_studies.md).
#
#   OUT=<results dir> BUDGET=<seconds> RUN=<run dir> MOCK=<mock dir> bash scripts/device/tpu_mclmc_chains.sh \
#       <fli-sample overrides>
#
# RUN and MOCK are carried (under .tpu-study/, ignored). fli-sample writes a chunk of draws at a
# time and resumes from the last whole one, so at BUDGET seconds from this script's start SIGTERM
# stops it, losing only the chunk under way. RUN comes back packed and cut into 15 MB pieces
# ($OUT/run.tgz.*: `cat run.tgz.* | tar xz -C <RUN>` for the next call), with the compilation cache.
#
# Why the chip, when the MUSE fits use that machine's CPU cores: one chain's gradient on tiny
# costs the chip about what it costs one CPU core (0.23 s, docs/benchmarks.md), and vectorised
# chains were expected to share the chip's step. Measured on 2026-12-07 (docs/muse_studies.md,
# "The fifth TPU loan"): they do not; a draw of 32 chains took more than 18 s on tiny TSC, more
# per chain than one CPU core here. Kept for a larger model, where the chip's step is not latency.
set -uo pipefail
T0=$(date +%s)
: "${OUT:?set OUT to a results directory}" "${RUN:?set RUN to the carried run directory}" "${MOCK:?set MOCK}"
BUDGET=${BUDGET:-540}
mkdir -p "$OUT" "$RUN"
TPU_T0=$T0
. scripts/device/tpu_env.sh
LEFT=$(( BUDGET - 25 - ( $(date +%s) - T0 ) ))  # 25 s kept for packing
echo "fli-sample for ${LEFT} s; chunks so far: $(ls "$RUN"/chain_0/draws 2>/dev/null | wc -l)"
PYTHONUNBUFFERED=1 timeout -s TERM "$LEFT" python3 -m fli.cli.sample "$@" mock="$MOCK" run_dir="$RUN" progress=false \
  > "$OUT/sample.log" 2>&1
echo "fli-sample exit $?"
grep -v "Compiling\|Finished" "$OUT/sample.log" | tail -n 20
grep -c "Compiling" "$OUT/sample.log"
tar czf - -C "$RUN" . | split -b 15M - "$OUT/run.tgz."
tpu_pack_cache "$OUT"
ls -la "$OUT"
echo "done after $(( $(date +%s) - T0 )) s"
