#!/usr/bin/env python
"""How MUSE's Monte Carlo error falls with the number of simulations, and whether it is told right.

One mock (``fli-mock`` run directory). For each ``N`` in ``--n-sims`` and each of ``--repeats``
simulation seeds, MUSE runs on it (fli.infer.muse.estimator, in this process: one compilation serves all).
Reported per N and parameter (standardised latents, where MUSE's Gaussian lives):

* the scatter of the estimate over the seeds, against the Monte Carlo sd MUSE reports
  (``mc_cov_z``, averaged over the seeds): their ratio should be near 1;
* the scatter of MUSE's sd over the seeds, against its bootstrap sd (``bootstrap_sd``);
* the mean of MUSE's sd itself (it should not drift with N);
* gradient evaluations and seconds per run.

Resumable: each (N, seed) result is a JSON file in ``--out``; one already there is read, not rerun.

    nice -n 19 python -m scripts.studies.muse_mc_error --mock /work/studies/muse_mc/mock --out /work/studies/muse_mc \\
        --n-sims 8 16 32 64 --repeats 4 --json docs/bench/muse_mc_error.json -- \\
        experiment=tiny simulation.forward=linear survey.sigma_e=0.05
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

from scripts.studies.study import emit  # noqa: E402


def _one(post, data, cfg, n: int, seed: int, path: Path) -> dict:
    from fli.infer.muse.estimator import Muse  # noqa: PLC0415

    if path.exists():
        return json.loads(path.read_text())
    settings = dataclasses.replace(cfg.inference.map.muse, n_sims=n)
    t0 = time.perf_counter()
    r = Muse(post, data, settings, cfg.inference.map, seed=seed).run(np.zeros(post.prior.n))
    out = {"n_sims": n, "seed": seed, "theta_z": r.theta_z.tolist(), "sd_z": r.sd_z.tolist(),
           "mc_sd_z": np.sqrt(np.diag(r.mc_cov_z)).tolist(), "bootstrap_sd_of_sd_z": r.bootstrap_sd().tolist(),
           "converged": r.converged, "iterations": len(r.history), "grad_evals": r.grad_evals,
           "seconds": time.perf_counter() - t0}
    path.write_text(json.dumps(out, indent=1))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mock", type=Path, required=True, help="a fli-mock run directory")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n-sims", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--json", type=Path)
    ap.add_argument("overrides", nargs="*", help="config overrides (after --)")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from fli.cli.compose import compose  # noqa: PLC0415
    from fli.infer.posterior.setup import prepare  # noqa: PLC0415

    cfg, _ = compose([*a.overrides, f"mock={a.mock}"])
    _, post, data = prepare(cfg, logging.getLogger("fli"), compare_truth=False)
    a.out.mkdir(parents=True, exist_ok=True)
    table = {}
    for n in a.n_sims:
        runs = []
        for seed in range(a.repeats):
            runs.append(_one(post, data, cfg, n, seed, a.out / f"n{n}_seed{seed}.json"))
            print(f"[{time.strftime('%H:%M:%S')}] N={n} seed {seed}: {runs[-1]['seconds']:.0f} s", flush=True)
        th = np.array([r["theta_z"] for r in runs])
        sd = np.array([r["sd_z"] for r in runs])
        table[n] = {"scatter_of_estimate": th.std(0, ddof=1).tolist(),
                    "reported_mc_sd": np.mean([r["mc_sd_z"] for r in runs], 0).tolist(),
                    "scatter_of_sd": sd.std(0, ddof=1).tolist(),
                    "reported_bootstrap_sd_of_sd": np.mean([r["bootstrap_sd_of_sd_z"] for r in runs], 0).tolist(),
                    "mean_sd": sd.mean(0).tolist(), "grad_evals": float(np.mean([r["grad_evals"] for r in runs])),
                    "seconds": float(np.mean([r["seconds"] for r in runs])),
                    "all_converged": all(r["converged"] for r in runs)}
    res = {"mock": str(a.mock), "overrides": a.overrides, "repeats": a.repeats, "params": list(post.names),
           "by_n_sims": table}
    emit(res, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
