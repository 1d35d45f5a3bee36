# Sourced by the scripts that run on the borrowed TPU machine (tool `device`): fli's dependencies
# and settings there.
#
# That machine has JAX 0.10.2 but none of fli's other dependencies, and no network. So the
# wheels in .whl-tpu/ (ignored; carried) are installed first: made here with
#   pip download --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl-tpu <the venv's pins>
# (antlr4-python3-runtime by pip wheel: it has no wheel), less the heavy ones (tensorstore,
# pandas, matplotlib, ...), which come from the machine's own package index. Also:
# float32 products at full precision, compile times in the logs, and fli's compilation cache
# unpacked from .tpu-cache/jax_cache.tgz (ignored; carried) where a previous call packed it:
# on 2026-12-06 one fli-map's first program took over 3 min to compile on the chip
# (docs/muse.md). `tpu_pack_cache DIR` packs it into DIR/jax_cache.tgz for the next call.
TPU_T0=${TPU_T0:-$(date +%s)}
pipi() {
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --disable-pip-version-check --no-deps --no-compile \
    --no-cache-dir --upgrade "$@"
}
pipi --no-index --target /tmp/site .whl-tpu/*.whl || { echo "wheel install failed"; exit 1; }
for n in tensorstore pandas matplotlib pillow fonttools h5py kiwisolver contourpy pyyaml msgpack protobuf psutil \
    simplejson uvloop; do
  { pipi --only-binary=:all: --index-url file:///opt/pypi/simple --target "/tmp/idx_$n" "$n" || echo "index: no $n"; } &
  PYTHONPATH_IDX=${PYTHONPATH_IDX:-}:/tmp/idx_$n
done
wait  # the installs side by side, not one after another, in a call of 10 minutes
export PYTHONPATH=${PYTHONPATH:-}:/tmp/site${PYTHONPATH_IDX}:$PWD
export JAX_DEFAULT_MATMUL_PRECISION=highest
export JAX_LOG_COMPILES=1
export FLI_COMPILATION_CACHE=/tmp/fli_jax_cache
mkdir -p "$FLI_COMPILATION_CACHE"
[ -f .tpu-cache/jax_cache.tgz ] && tar xzf .tpu-cache/jax_cache.tgz -C "$FLI_COMPILATION_CACHE"
echo "installed after $(( $(date +%s) - TPU_T0 )) s"
python3 -c "import jax, platform; print(jax.__version__, jax.devices(), platform.libc_ver())
import fli.cli.map, fli.cli.mock, zarr, hydra, optax, orbax.checkpoint, matplotlib; print('imports ok')" || exit 1

tpu_pack_cache() { tar czf "$1/jax_cache.tgz" -C "$FLI_COMPILATION_CACHE" .; }
