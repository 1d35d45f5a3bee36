#!/usr/bin/env bash
# fli-diagnose of the MCLMC reference (draws so far: a finished chunk at a time), then MUSE at the defaults
# (docs/bench/muse_tsc_pair0_default/map.json) against it. Usage: compare.sh [tag]
. /work/venv/bin/activate
export FLI_COMPILATION_CACHE=/work/studies/jax_cache
D=/work/studies/mclmc_tsc; M=$(cat /work/studies/nuts_tsc/overrides.txt); T=${1:-}
cd /work/main
rm -rf $D/diag$T
nice -n 5 fli-diagnose runs=[$D/chains] mock=/work/studies/nuts_tsc/mock run_dir=$D/diag$T > $D/diag$T.log 2>&1
[ -f $D/diag$T/diagnostics.json ] || { tail -5 $D/diag$T.log; exit 1; }  # exit 4 is a failing verdict, not an error
nice -n 5 python scripts/muse_vs_chains.py --muse docs/bench/muse_tsc_pair0_default/map.json --chains $D/diag$T/diagnostics.json \
  --draws $D/diag$T/chains.nc --json docs/bench/muse_vs_mclmc_pm_tsc_default.json --figure docs/bench/muse_vs_mclmc_pm_tsc_default.png \
  --note "pair 0's tiny TSC mock (the NUTS reference's mock and model); MUSE at the defaults; unadjusted MCLMC at the default target 5e-6, 4 vectorised chains from the prior, 400 warm-up transitions" -- $M
