#!/bin/bash
# pair 0's TSC mock, MUSE at the defaults (n_sims 32, j_sims null = 128), seed 0, one process on core 0, started at the 16-simulation run root (docs/bench/muse_tsc_pair0_map.json)
M="$(cat /work/studies/nuts_tsc/overrides.txt)"
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
export PYTHONPATH=/work/studies/wt_pair0
cd /work/studies/wt_pair0
exec nice -n 19 taskset -c 0 /work/venv/bin/python -m fli.cli.map $M mock=/work/studies/nuts_tsc/mock \
  run_dir=/work/studies/pair0_default/run_start inference.map.estimator=muse inference.map.muse.start=[-0.8353,-0.0230]
