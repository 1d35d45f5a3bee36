#!/usr/bin/env bash
# fli-diagnose of the longer MCLMC reference's runs (their whole chunks so far), then MUSE with 128 simulations
# (docs/bench/muse_tsc_pair0_128/map.json) against it. Usage: compare.sh [tag]
. /work/venv/bin/activate
export FLI_COMPILATION_CACHE=/work/studies/jax_cache
D=/work/studies/mclmc_pair0; M=$(cat /work/studies/pair0_128/overrides.txt); T=${1:-}
RUNS=$(ls -d $D/chains_s*/ | sed "s|/\$||" | paste -sd, -)
cd /work/main
rm -rf $D/diag$T
nice -n 5 fli-diagnose "runs=[$RUNS]" mock=/work/studies/pair0_128/mock run_dir=$D/diag$T > $D/diag$T.log 2>&1
[ -f $D/diag$T/diagnostics.json ] || { tail -5 $D/diag$T.log; exit 1; }  # exit 4 is a failing verdict, not an error
nice -n 5 python scripts/muse_vs_chains.py --muse docs/bench/muse_tsc_pair0_128/map.json --chains $D/diag$T/diagnostics.json ${OLD:+--chains $OLD} \
  --draws $D/diag$T/chains.nc --json $D/compare$T.json --figure $D/compare$T.png \
  --note "pair 0's tiny TSC mock (made again at 0eac51e); MUSE with 128 simulations, J over 128; unadjusted MCLMC at the default target 5e-6, runs of 4 vectorised chains from the prior (seeds 1, 2), 400 warm-up transitions each" -- $M
