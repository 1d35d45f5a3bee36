#!/usr/bin/env python
"""How many optimiser steps MUSE's finite-difference H needs: H with fewer steps per fit, against
the full budget, on one mock, side by side in one process.

MUSE's H (fli/infer/muse/estimator.py, ``finite_difference_h``) refits each simulation's field at
``theta +- fd_step e_j``, starting from that simulation's MAP at theta, and takes the central
difference of the scores. On the tiny PM mock it is two thirds of MUSE's gradient evaluations
(docs/muse_studies.md), because each fit runs to ``map_steps``. Here the data's and the simulations' fits
at ``theta`` run once with ``map_steps``; then H is taken with each ``--steps`` budget from those
same starting fields. Reported per budget: H, its Monte Carlo standard error over the
simulations, the difference from the largest budget's H in those errors, MUSE's sds
``sqrt(diag((H^T J^-1 H + I)^-1))`` with J from the same scores, and the gradient evaluations.
theta is the prior's median unless ``--theta`` names another (e.g. a run's ``muse.theta_z``);
``--fd-steps`` takes H with each finite-difference step too, every budget at every step.

    nice -n 19 python -m scripts.studies.muse_h_steps --mock /tmp/hs/mock --steps 300 100 50 \\
        --json docs/bench/muse_h_steps_tiny.json -- experiment=tiny survey.sigma_e=0.05 \\
        inference.map.muse.n_sims=16 inference.map.muse.map_steps=300
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from pathlib import Path

import numpy as np

from scripts.studies.study import emit  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mock", required=True, help="a fli-mock run directory")
    ap.add_argument("--steps", type=int, nargs="+", default=[300, 100, 50], help="H's step budgets, largest first")
    ap.add_argument("--theta", type=float, nargs="+", help="the standardised theta to take H at (map.json's "
                    "muse.theta_z); default: the prior's median, where MUSE starts")
    ap.add_argument("--fd-steps", type=float, nargs="+", help="H's central-difference steps (standardised); "
                    "default: inference.map.muse.fd_step")
    ap.add_argument("--json", type=Path)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)

    from fli.cli.common import _setup_process  # noqa: PLC0415
    from fli.cli.compose import compose  # noqa: PLC0415
    from fli.infer.posterior.setup import prepare  # noqa: PLC0415
    from fli.infer.muse.estimator import Muse  # noqa: PLC0415
    from fli.infer.muse.result import covariance  # noqa: PLC0415

    log = logging.getLogger("fli")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    cfg, _ = compose([*a.overrides, f"mock={a.mock}"])
    _setup_process(cfg)  # as the commands do: x64 for simulation.dtype=float64
    _, post, data = prepare(cfg, log, compare_truth=False)
    settings = cfg.inference.map.muse
    m = Muse(post, data, settings, cfg.inference.map, seed=cfg.seed, log=log)
    theta = np.zeros(post.prior.n) if a.theta is None else np.asarray(a.theta, np.float64)
    if theta.shape != (post.prior.n,):
        raise SystemExit(f"--theta: {post.prior.n} values, one per sampled parameter ({', '.join(post.names)})")
    t0 = time.perf_counter()
    g_d, g_s = m.scores("at", theta, m._progress("the scores at theta", settings.n_sims))
    jm = np.cov(g_s.T).reshape(len(theta), len(theta))
    out = {"mock": str(a.mock), "overrides": a.overrides, "theta_z": theta.tolist(), "n_sims": settings.n_sims,
           "scores_grad_evals": m.grad_evals, "scores_seconds": time.perf_counter() - t0, "J": jm.tolist(),
           "g_data": g_d.tolist(), "g_sims": g_s.tolist(), "by_steps": {}}
    ref = None
    fds = a.fd_steps or [settings.fd_step]
    for fd, steps in ((fd, steps) for fd in fds for steps in a.steps):
        m.h_steps = steps  # inference.map.muse.h_steps: the same compiled solver, another budget
        m.cfg = dataclasses.replace(settings, fd_step=fd)
        e0, t0 = m.grad_evals, time.perf_counter()
        label = str(steps) if len(fds) == 1 else f"{steps}@fd{fd:g}"
        cols = m.finite_difference_h(f"h{label}", theta,  # [sim, score component, column]
                                     m._progress(f"H with {label} steps", len(theta) * settings.n_sims, h=True))
        h, se = cols.mean(0), cols.std(0, ddof=1) / np.sqrt(cols.shape[0])
        row = {"H": h.tolist(), "H_se": se.tolist(), "grad_evals": m.grad_evals - e0,
               "seconds": time.perf_counter() - t0, "muse_sd_z": np.sqrt(np.diag(covariance(h, jm))).tolist(),
               "columns": cols.tolist()}  # per simulation, so that another run's budgets pair with these
        if ref is None:
            ref = cols
        else:  # the paired difference: the same simulations, so most of their scatter cancels
            d = cols - ref
            row["diff_from_first"] = d.mean(0).tolist()
            row["diff_over_its_se"] = (d.mean(0) / (d.std(0, ddof=1) / np.sqrt(d.shape[0]))).tolist()
            row["diff_over_H_se"] = (d.mean(0) / se).tolist()
        row["fd_step"] = fd
        out["by_steps"][label] = row
        log.info("H with %s steps: %s (se %s), MUSE sd_z %s, %d gradient evaluations", label,
                 np.round(h, 3).tolist(), np.round(se, 3).tolist(), np.round(row["muse_sd_z"], 4).tolist(),
                 row["grad_evals"])
    emit(out, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
