#!/bin/bash
# pair 0's TSC mock (made at 0eac51e, the chains' code), MUSE with n_sims 128 and J over 128, seed 0,
# started at the 32-simulation run's root (docs/bench/muse_tsc_pair0_default/map.json theta_root_z)
M="$(cat /work/studies/pair0_128/overrides.txt)"
export PYTHONPATH=/work/studies/wt_pair0
cd /work/studies/wt_pair0
exec nice -n 10 /work/venv/bin/python -m fli.cli.map $M mock=/work/studies/pair0_128/mock \
  run_dir=/work/studies/pair0_128/run inference.map.estimator=muse inference.map.muse.n_sims=128 \
  inference.map.muse.j_sims=128 "inference.map.muse.start=[-0.6465,0.0757]" progress=false "$@"
