#!/usr/bin/env bash
# micro PM agreement check where the data narrow the prior: 8x8x32 TSC mock, sigma_e 0.01.
# Stages (resumable: rerun): mock, muse (defaults), chain <seed>.
. /work/venv/bin/activate
export FLI_COMPILATION_CACHE=/work/studies/jax_cache XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
D=/work/studies/micro2
M=$(cat $D/overrides.txt)
cd $D
case $1 in
  mock) [ -f $D/mock/summary.json ] || nice -n 5 taskset -c 0 fli-mock $M run_dir=$D/mock > $D/mock.log 2>&1 ;;
  muse) nice -n 5 taskset -c 0 fli-map $M mock=$D/mock inference.map.estimator=muse run_dir=$D/muse > $D/muse.log 2>&1 ;;
  chain) nice -n 5 taskset -c ${4:-0} fli-nuts $M mock=$D/mock seed=$2 inference.num_warmup=300 inference.num_samples=${3:-700} \
    inference.chunk=50 inference.field_thin=50 inference.max_tree_depth=8 run_dir=$D/chain$2 > $D/chain$2.log 2>&1 ;;
esac
