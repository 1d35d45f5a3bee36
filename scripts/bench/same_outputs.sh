#!/usr/bin/env bash
# Short runs of every command on one tiny mock, with the fli of a given checkout, for
# scripts/bench/same_outputs.py to compare before and after a change that must not change any bits
# (a move, a rename, a refactor):
#
#   git worktree add /tmp/before <rev>
#   bash scripts/bench/same_outputs.sh /tmp/before /tmp/out/before
#   bash scripts/bench/same_outputs.sh "$PWD" /tmp/out/after
#   python -m scripts.bench.same_outputs /tmp/out/before /tmp/out/after --renamed-since <rev>
#
# fli-mock; fli-map with MUSE (4 simulations, 2 iterations); fli-sample with NUTS and with MCLMC
# from that MAP (20 + 20 draws); fli-diagnose of each chain. About 15 minutes on 2 cores.
set -euo pipefail
CODE=$(cd "$1" && pwd); OUT=$2; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd); cd "$OUT"
export PYTHONPATH=$CODE   # the checkout's fli and conf/, whatever fli pip installed
T="experiment=tiny"
S="inference.num_warmup=20 inference.num_samples=20 inference.chunk=10 inference.field_thin=10"
fli-mock $T run_dir="$OUT/mock" > mock.log 2>&1
fli-map $T mock="$OUT/mock" run_dir="$OUT/map" inference.map.steps=60 inference.map.estimator=muse \
  inference.map.muse.n_sims=4 inference.map.muse.j_sims=4 inference.map.muse.iterations=2 \
  inference.map.muse.map_steps=60 > map.log 2>&1
fli-sample $T mock="$OUT/mock" init="$OUT/map" run_dir="$OUT/nuts" $S > nuts.log 2>&1
fli-sample $T mock="$OUT/mock" init="$OUT/map" run_dir="$OUT/mclmc" inference.kernel=mclmc $S > mclmc.log 2>&1
for k in nuts mclmc; do  # a short chain fails its checks (exit 4): the outputs are what is compared
  fli-diagnose "runs=[$OUT/$k]" run_dir="$OUT/diag_$k" > "diag_$k.log" 2>&1 || [ $? -le 4 ]
done
echo "outputs in $OUT"
