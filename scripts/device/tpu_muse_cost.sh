#!/usr/bin/env bash
# Time MUSE's parts on the borrowed TPU machine (tool `device`): scripts/bench/muse_cost.py at the tiny
# TSC study's config and at the default size, each within EACH seconds, so that the CPU figures
# (docs/bench/muse_cost_default.json, docs/muse.md) get an accelerator's beside them.
#
#   OUT=<results dir> EACH=<seconds> [SIZES="default tiny"] bash scripts/device/tpu_muse_cost.sh
#
# scripts/device/tpu_env.sh installs fli's dependencies first (carried wheels, see its header). Comes
# back in $OUT: muse_cost_<size>_tpu.json and .log each, and the compilation cache packed, to
# carry into the next call (.tpu-cache/jax_cache.tgz): the first compile on the chip is long.
set -uo pipefail
: "${OUT:?set OUT to a results directory}"
EACH=${EACH:-240}
mkdir -p "$OUT"
. scripts/device/tpu_env.sh
run() {  # run <size> <overrides...>
  local size=$1
  shift
  timeout "$EACH" python -m scripts.bench.muse_cost --steps 20 --json "$OUT/muse_cost_${size}_tpu.json" -- "$@" 2>&1 \
    | grep -v "Finished tracing\|Compiling jit\|jaxpr to MLIR" | tee "$OUT/muse_cost_${size}.log"
}
for size in ${SIZES:-default tiny}; do
  case $size in
    tiny) run tiny experiment=tiny survey.sigma_e=0.05 simulation.assignment=tsc inference.map.muse.n_sims=16 ;;
    default) run default inference.map.muse.n_sims=16 inference.map.muse.map_steps=300 ;;
    *) echo "SIZES: unknown size '$size' (valid: default, tiny)"; exit 2 ;;
  esac
done
tpu_pack_cache "$OUT"
echo "done after $(( $(date +%s) - TPU_T0 )) s"
