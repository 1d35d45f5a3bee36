#!/usr/bin/env python
"""MUSE's field fits with and without the field preconditioner, side by side in one process.

For a mock (``--mock``, a fli-mock run directory) and the config overrides after ``--``, at the
prior's median and at ``--theta`` (standardised latents), the field's MAP is fitted from zero
on ``--sims`` simulations (MUSE's own keys, ``fli.infer.muse.estimator``) by
:class:`fli.infer.muse.field_fit.FieldSolver`: plain, then preconditioned at each ``--ranks`` value
(:func:`fli.infer.muse.field_fit.field_preconditioner`, taken at the prior's median and s = 0 as
fli-map does). Reported per fit: steps, gradient evaluations (the optimiser's, line search
included: the machine-independent figure), seconds (after each program's compile, timed apart
with a one-step fit), the field gradient's RMS at the stop, and the RMS difference of the
preconditioned MAP from the plain one (both stop at the same gradient criterion, so it should
be of the order of the tolerance). The preconditioner's own cost is reported apart.

    python -m scripts.bench.field_fit --mock <tiny TSC mock> \\
        --json docs/bench/field_fit_precondition_tiny_tsc.json \\
        -- experiment=tiny survey.sigma_e=0.05 simulation.assignment=tsc
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mock", type=Path, required=True, help="a fli-mock run directory (its data)")
    ap.add_argument("--ranks", default="16,32,64", help="preconditioner ranks, comma-separated")
    ap.add_argument("--sims", type=int, default=4, help="simulations fitted at each theta")
    ap.add_argument("--theta", default="0.5,-0.5",
                    help="a second theta (standardised), comma-separated; 'none': the prior's median alone")
    ap.add_argument("--seed", type=int, default=0, help="the simulations' seed (fli-map's seed)")
    ap.add_argument("--json", type=Path, help="write the results here too")
    ap.add_argument("overrides", nargs="*", help="config overrides (after --)")
    a = ap.parse_args(argv)

    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from fli.cli.common import setup_logging  # noqa: PLC0415
    from fli.cli.compose import compose  # noqa: PLC0415
    from fli.store.files import write_json  # noqa: PLC0415
    from fli.infer.muse.field_fit import FieldSolver, field_preconditioner  # noqa: PLC0415
    from fli.infer.posterior.setup import prepare  # noqa: PLC0415
    from fli.infer.muse.estimator import MUSE_STREAM, make_simulator  # noqa: PLC0415

    log = setup_logging()  # fli's INFO lines (the posterior's build, the preconditioner's) and this script's
    cfg, _ = compose([*a.overrides, f"mock={a.mock}", "compilation_cache=null"])
    _, post, data = prepare(cfg, log, compare_truth=False)
    muse = cfg.inference.map.muse
    solver = FieldSolver(post, cfg.inference.map, muse.map_steps, muse.gtol)
    simulate = make_simulator(post)
    key = jax.random.fold_in(jax.random.key(a.seed), MUSE_STREAM)
    dt = post.fwd.grid.jdtype
    zero = post.zeros().s
    thetas = {"median": np.zeros(post.prior.n)}
    if a.theta != "none":
        thetas["theta"] = np.array([float(v) for v in a.theta.split(",")])
    cases = [(f"{tn} sim{i}", jnp.asarray(th, dt), simulate(jnp.asarray(th, dt), jax.random.fold_in(key, i), data))
             for tn, th in thetas.items() for i in range(a.sims)]

    def fit(th, d, pre):
        log.info("fitting (at most %d steps, one program: no line until it ends)", muse.map_steps)
        t0 = time.perf_counter()
        s, k, gn, ev = solver(th, zero, d, pre=pre)
        jax.block_until_ready(s)
        return s, {"steps": k, "evals": ev, "grad_rms": gn, "seconds": time.perf_counter() - t0}

    out = {"overrides": a.overrides, "mock": str(a.mock), "gtol": muse.gtol, "map_steps": muse.map_steps,
           "compile": {}, "preconditioner": {}, "fits": {}}
    t0 = time.perf_counter()  # compiled by a one-step fit: the step budget is an argument of the same program
    solver(cases[0][1], zero, cases[0][2], 1)
    out["compile"]["plain"] = time.perf_counter() - t0
    log.info("plain fit compiled in %.1f s", out["compile"]["plain"])
    plain = {}
    for name, th, d in cases:
        plain[name], out["fits"].setdefault(name, {})["plain"] = fit(th, d, None)
        print(name, "plain", out["fits"][name]["plain"], flush=True)
    for rank in (int(r) for r in a.ranks.split(",")):
        pre, info = field_preconditioner(post, data, thetas["median"], rank, log)
        out["preconditioner"][str(rank)] = {k: info[k] for k in ("rank", "grad_evals", "seconds")} | {
            "eigenvalue_first": info["eigenvalues"][0], "eigenvalue_last": info["eigenvalues"][-1]}
        t0 = time.perf_counter()  # each rank is its own program (the vectors' shape): compiled before the timed fits
        solver(cases[0][1], zero, cases[0][2], 1, pre=pre)
        out["compile"][f"rank{rank}"] = time.perf_counter() - t0
        for name, th, d in cases:
            s, rec = fit(th, d, pre)
            rec["rms_from_plain"] = float(jnp.sqrt(jnp.mean((s - plain[name]) ** 2)))
            out["fits"][name][f"rank{rank}"] = rec
            print(name, f"rank {rank}", rec, flush=True)
    kinds = ["plain", *(f"rank{r}" for r in a.ranks.split(","))]
    out["summary"] = {k: {"evals_mean": float(np.mean([f[k]["evals"] for f in out["fits"].values()])),
                          "seconds_mean": float(np.mean([f[k]["seconds"] for f in out["fits"].values()]))}
                      for k in kinds}
    for k in kinds[1:]:
        out["summary"][k]["evals_ratio_to_plain"] = (out["summary"][k]["evals_mean"]
                                                    / out["summary"]["plain"]["evals_mean"])
        out["summary"][k]["seconds_ratio_to_plain"] = (out["summary"][k]["seconds_mean"]
                                                      / out["summary"]["plain"]["seconds_mean"])
    print(json.dumps(out["summary"], indent=1))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        write_json(a.json, out)  # written aside and renamed: never half a record
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
