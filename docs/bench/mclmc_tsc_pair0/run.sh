#!/usr/bin/env bash
# The PM agreement check's reference: unadjusted MCLMC at the default target (5e-6) on pair 0's tiny TSC mock
# (the NUTS reference's mock and model: /work/studies/nuts_tsc). 4 vectorised chains from the prior, one niced core.
# Resumable and extendable: run again (with a larger N to extend). Usage: run.sh [num_samples] [core]
. /work/venv/bin/activate
export FLI_COMPILATION_CACHE=/work/studies/jax_cache XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
D=/work/studies/mclmc_tsc
M=$(cat /work/studies/nuts_tsc/overrides.txt)
cd /work/main
exec nice -n 19 taskset -c ${2:-0} fli-sample $M mock=/work/studies/nuts_tsc/mock seed=0 inference.kernel=mclmc \
  inference.chains_per_run=4 inference.num_warmup=400 inference.num_samples=${1:-4000} inference.chunk=100 \
  inference.field_thin=100 run_dir=$D/chains >> $D/chains.log 2>&1
