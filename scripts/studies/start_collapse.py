#!/usr/bin/env python
"""Where a chain starts, and whether its parameters run to the prior's edges.

For each start (``inference.init_theta`` x ``inference.init_redraw``, or ``init=prior``) and
each seed, runs ``fli-sample`` from the given fli-map run and counts, per chain, the draws
(warm-up included) spent at a prior's lower edge: sigma8 < 0.51 or Omega_c < 0.151 (the
priors' bounds are 0.5 and 0.15; a chain there has given up fitting the data with the field
and shrunk the model instead, docs/nuts.md "Large fields"). It also reports the post-warm-up
mean of sigma8 per chain.

    python -m scripts.studies.start_collapse --mock /tmp/u/mock --map /tmp/u/map --out /tmp/u/starts \\
        --seeds 0 1 2 --json docs/bench/start_collapse.json -- experiment=tiny \\
        simulation.forward=linear survey.sigma_e=0.05 inference.kernel=mclmc inference.chains_per_run=2 \\
        inference.num_warmup=200 inference.num_samples=200
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

STARTS = {  # name -> overrides
    "muse, redraw wiener": ["inference.init_theta=muse", "inference.init_redraw=wiener"],
    "muse, no redraw": ["inference.init_theta=muse", "inference.init_redraw=none"],
    "joint MAP, redraw wiener": ["inference.init_theta=map", "inference.init_redraw=wiener"],
    "joint MAP, no redraw": ["inference.init_theta=map", "inference.init_redraw=none"],
    "prior": [],
}
EDGE = {"sigma8": 0.51, "Omega_c": 0.151}


def at_edge(run: Path) -> dict:
    """Per chain: draws at a lower edge, the last such draw, and the post-warm-up mean of sigma8."""
    from fli.infer.sample.run_store import read_chunks  # noqa: PLC0415

    chains = sorted(run.glob("chain_*")) or [run]
    out = []
    for c in chains:
        d = read_chunks(c)["draws"]
        edge = np.zeros(d["sigma8"].shape, bool)
        for k, v in EDGE.items():
            edge |= np.asarray(d[k]) < v
        post = ~np.asarray(d["warmup"], bool)
        out.append({"edge_draws": int(edge.sum()), "last_edge_draw": int(np.nonzero(edge)[0][-1]) if edge.any()
                    else None, "draws": int(edge.size), "sigma8_post_mean": float(np.mean(d["sigma8"][post]))})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mock", required=True)
    ap.add_argument("--map", required=True, help="a fli-map run with a MUSE estimate")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--starts", nargs="+", default=list(STARTS), choices=list(STARTS))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    rows = []
    for name in a.starts:
        for seed in a.seeds:
            run = a.out / f"{name.replace(', ', '_').replace(' ', '-')}_seed{seed}"
            init = ["init=prior"] if name == "prior" else [f"init={a.map}"]
            cmd = [sys.executable, "-m", "fli.cli.sample", *a.overrides, *init, *STARTS[name], f"mock={a.mock}",
                   f"run_dir={run}", f"seed={seed}"]
            p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
            chains = at_edge(run)
            rows.append({"start": name, "seed": seed, "chains": chains})
            print(f"{name:>26} seed {seed}: draws at an edge {[c['edge_draws'] for c in chains]} of "
                  f"{chains[0]['draws']}; post-warm-up sigma8 {[round(c['sigma8_post_mean'], 3) for c in chains]}",
                  flush=True)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"overrides": a.overrides, "mock": a.mock, "map": a.map, "edge": EDGE,
                                      "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
