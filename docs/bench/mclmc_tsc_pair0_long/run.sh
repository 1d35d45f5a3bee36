#!/usr/bin/env bash
# Pair 0's longer MCLMC reference (S8 ESS ~500 wanted): unadjusted MCLMC at 5e-6, 4 vectorised chains from
# the prior per run, one niced core per run. Resumable/extendable. Usage: run.sh <seed> <core> [num_samples]
. /work/venv/bin/activate
export FLI_COMPILATION_CACHE=/work/studies/jax_cache XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
D=/work/studies/mclmc_pair0
M=$(cat /work/studies/pair0_128/overrides.txt)
cd /work/main
exec nice -n 19 taskset -c $2 fli-sample $M mock=/work/studies/pair0_128/mock seed=$1 inference.kernel=mclmc \
  inference.chains_per_run=4 inference.num_warmup=400 inference.num_samples=${3:-8000} inference.chunk=100 \
  inference.field_thin=100 progress=false run_dir=$D/chains_s$1 >> $D/chains_s$1.log 2>&1
