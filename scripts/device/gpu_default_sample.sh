#!/usr/bin/env bash
# Sample the default-size posterior with the best kernel on one accelerator, within a time budget.
#
#   OUT=<results dir> BUDGET=<seconds> bash scripts/device/gpu_default_sample.sh [extra Hydra overrides]
#
# Made for the borrowed GPU machine (jax and numpyro there, no Hydra or zarr: the wheels in .whl/
# are installed first when .whl/ exists; see docs/benchmarks.md). Stages, each logged to $OUT:
#   1. fli-mock of the default config (Planck18, seed 0), unless MOCK names one made beforehand;
#   2. START=map (the default): fli-map's joint MAP of the field and theta (MAP_STEPS L-BFGS steps,
#      no Laplace; MAP_OVERRIDES, e.g. a larger simulation.halo, which the posterior does not
#      depend on), where the chains start; START=prior starts them from the prior, which at this
#      size sends theta to the prior's edges (docs/benchmarks.md, "The default size on one GPU");
#   3. fli-sample, unadjusted MCLMC (the default energy-error target), CHAINS vectorised chains
#      from that start: WARMUP warm-up transitions and FIRST draws, so a first speed is measured;
#   4. the same run extended (resumed in place, compiled programs from the persistent cache) by as
#      many whole chunks as the budget still holds at stage 3's speed, less a margin;
#   5. the run's light files (draws, statistics, spectra, the mock's figures) and each chain's
#      running field means packed into $OUT; the thinned fields and the orbax checkpoints stay
#      behind (too large to bring back).
# Every number is the run's own (nuts.json, the chunk logs); fli-diagnose reads the packs here.
set -uo pipefail
T0=$(date +%s)
: "${OUT:?set OUT to a results directory}"
BUDGET=${BUDGET:-520}          # seconds from this script's start to the end of sampling
CHAINS=${CHAINS:-2}
WARMUP=${WARMUP:-400}
FIRST=${FIRST:-100}
CHUNK=${CHUNK:-50}
START=${START:-map}
MAP_STEPS=${MAP_STEPS:-200}
MAP_OVERRIDES=${MAP_OVERRIDES:-}
WORK=${WORK:-/tmp/fli_gpu}
mkdir -p "$OUT" "$WORK"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 FLI_COMPILATION_CACHE=$WORK/jax_cache
elapsed() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
python3 -c "import jax, numpyro, sys; print(sys.version.split()[0], 'jax', jax.__version__, 'numpyro', numpyro.__version__, jax.devices())"

if [ -n "${MOCK:-}" ]; then  # a mock made elsewhere (fli-mock with the same overrides), carried along
  mkdir -p "$WORK/mock" && cp -r "$MOCK"/. "$WORK/mock/"
else
  echo "== [$(elapsed) s] mock"
  python3 -m fli.cli.mock run_dir="$WORK/mock" progress=false "$@" > "$OUT/mock.log" 2>&1 \
    || { tail -n 30 "$OUT/mock.log"; exit 1; }
  tail -n 3 "$OUT/mock.log"
fi

INIT=()
if [ "$START" = map ]; then
  echo "== [$(elapsed) s] joint MAP: $MAP_STEPS steps"
  # shellcheck disable=SC2086  # MAP_OVERRIDES: space-separated Hydra overrides
  timeout $(( BUDGET - $(elapsed) )) python3 -m fli.cli.map mock="$WORK/mock" run_dir="$WORK/map" progress=false \
    inference.map.laplace=false inference.map.steps="$MAP_STEPS" "$@" $MAP_OVERRIDES > "$OUT/map.log" 2>&1 \
    || { echo "fli-map failed"; tail -n 30 "$OUT/map.log"; exit 1; }
  tail -n 2 "$OUT/map.log"
  INIT=(init="$WORK/map")
elif [ "$START" != prior ]; then
  echo "START=$START: give map or prior"; exit 2
fi
SAMPLE=(python3 -m fli.cli.sample mock="$WORK/mock" run_dir="$WORK/run" progress=false inference.kernel=mclmc
        inference.chains_per_run="$CHAINS" inference.num_warmup="$WARMUP" inference.chunk="$CHUNK"
        inference.field_thin="$CHUNK" "${INIT[@]}" "$@")
echo "== [$(elapsed) s] sample: $WARMUP warm-up + $FIRST draws"
timeout $(( BUDGET - $(elapsed) )) "${SAMPLE[@]}" inference.num_samples="$FIRST" > "$OUT/sample1.log" 2>&1
rc1=$?
tail -n 4 "$OUT/sample1.log"
if [ $rc1 -eq 0 ]; then
  # seconds a chunk takes at stage 3's speed (nuts.json: sampling time, compiling excluded), 15 % spare
  PER_CHUNK=$(python3 -c "import json, sys; r = json.load(open(sys.argv[1])); print(int(r['seconds_sampling'] / r['draws'] * int(sys.argv[2]) * 1.15) + 1)" "$WORK/run/nuts.json" "$CHUNK")
  LEFT=$(( BUDGET - $(elapsed) - 60 ))  # 60 s: start-up, the mock's reading and the restore
  MORE=$(( LEFT > 0 ? LEFT / PER_CHUNK * CHUNK : 0 ))
  echo "== [$(elapsed) s] ~$PER_CHUNK s a chunk; extending by $MORE draws"
  if [ "$MORE" -gt 0 ]; then
    timeout $(( BUDGET - $(elapsed) )) "${SAMPLE[@]}" inference.num_samples=$(( FIRST + MORE )) > "$OUT/sample2.log" 2>&1
    echo "extension exit $?"; tail -n 4 "$OUT/sample2.log"
  fi
else
  echo "first stage exit $rc1"; tail -n 20 "$OUT/sample1.log"
fi
echo "== [$(elapsed) s] pack"
# the light files in one pack; each chain's running field means in its own (files come back under 16 MiB)
[ "$START" = map ] && MAPS=(map/map.json map/config.yaml) || MAPS=()
tar czf "$OUT/run_light.tgz" -C "$WORK" --exclude='*.zarr' --exclude='checkpoints' run "${MAPS[@]}" mock/config.yaml \
  mock/fli-run.json mock/summary.json mock/kappa_cl.png mock/kappa_maps.png mock/matter_power.png
for c in "$WORK"/run/chain_*; do
  tar czf "$OUT/running_$(basename "$c").tgz" -C "$WORK" "run/$(basename "$c")/running.zarr"
done
ls -la "$OUT"
echo "== [$(elapsed) s] done"
