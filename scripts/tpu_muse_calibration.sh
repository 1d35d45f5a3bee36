#!/usr/bin/env bash
# Run the MUSE calibration's mocks on the borrowed TPU machine (tool `device`), within a budget.
#
#   OUT=<results dir> BUDGET=<seconds> FIRST=<first mock> MOCKS=<end> KEEP=<records dir> \
#       bash scripts/tpu_muse_calibration.sh [extra Hydra overrides]
#
# That machine has JAX 0.10.2 but none of fli's other dependencies, and no network. So the
# wheels in .whl-tpu/ (ignored; carried) are installed first: made here with
#   pip download --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl-tpu <the venv's pins>
# (antlr4-python3-runtime by pip wheel: it has no wheel), less the heavy ones (tensorstore,
# pandas, matplotlib, ...), which come from the machine's own package index.
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
pipi() {
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --disable-pip-version-check --no-deps --no-compile \
    --no-cache-dir --upgrade "$@"
}
pipi --no-index --target /tmp/site .whl-tpu/*.whl || { echo "wheel install failed"; exit 1; }
for n in tensorstore pandas matplotlib pillow fonttools h5py kiwisolver contourpy pyyaml msgpack protobuf psutil \
    simplejson uvloop; do
  pipi --only-binary=:all: --index-url file:///opt/pypi/simple --target "/tmp/idx_$n" "$n" || echo "index: no $n"
  PYTHONPATH_IDX=${PYTHONPATH_IDX:-}:/tmp/idx_$n
done
export PYTHONPATH=${PYTHONPATH:-}:/tmp/site${PYTHONPATH_IDX}:$PWD
export JAX_DEFAULT_MATMUL_PRECISION=highest  # float32 products at full precision, as on a CPU
export JAX_LOG_COMPILES=1  # compile times in the logs: TPU compiles are long
# fli's persistent compilation cache, brought back packed and carried in again (.tpu-cache/, ignored):
# on 2026-12-06 one fli-map's first program took over 3 min to compile on the chip (docs/muse.md)
export FLI_COMPILATION_CACHE=/tmp/fli_jax_cache
mkdir -p "$FLI_COMPILATION_CACHE"
[ -f .tpu-cache/jax_cache.tgz ] && tar xzf .tpu-cache/jax_cache.tgz -C "$FLI_COMPILATION_CACHE"
echo "installed after $(( $(date +%s) - T0 )) s"
python3 -c "import jax, platform; print(jax.__version__, jax.devices(), platform.libc_ver())
import fli.cli.map, fli.cli.mock, zarr, hydra, optax, orbax.checkpoint, matplotlib; print('imports ok')" || exit 1
LEFT=$(( BUDGET - ( $(date +%s) - T0 ) ))
echo "driver budget ${LEFT} s"
JAX_PLATFORMS=cpu STUDY_JAX_PLATFORMS=tpu,cpu timeout -s TERM "$LEFT" python3 scripts/muse_calibration.py \
  --core "0-$(( $(nproc) - 1 ))" --first "$FIRST" --mocks "$MOCKS" \
  --out "$STUDY" --keep "$KEEP" --save-every 60 -- experiment=tiny survey.sigma_e=0.05 simulation.assignment=tsc \
  inference.map.muse.n_sims=16 "$@" 2>&1 | tee "$OUT/driver.log"
tar czf "$OUT/keep.tgz" -C "$KEEP" .
tar czf "$OUT/logs.tgz" -C "$STUDY" $(cd "$STUDY" && ls *.log 2>/dev/null)
tar czf "$OUT/jax_cache.tgz" -C "$FLI_COMPILATION_CACHE" .
echo "done after $(( $(date +%s) - T0 )) s"
