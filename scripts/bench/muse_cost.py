#!/usr/bin/env python
"""What one MUSE estimate costs at a config's size: one field fit timed, an iteration projected.

A MUSE iteration is ``N + 1`` field fits (the data and N simulations), and ``2 n N`` more where
H is taken (n sampled parameters, central differences); each fit is up to
``inference.map.muse.map_steps`` optimiser steps. At the default size one iteration is days of
2 cores, so this times the parts and multiplies:

* the posterior's gradient in the field alone (``jax.grad`` of U at fixed theta), ``--repeats``
  times after its compilation;
* one field fit of ``--steps`` steps of fli-map's optimiser (fli.infer.muse.field_fit.FieldSolver) on a
  simulation at the prior's median, from zero: seconds per gradient evaluation inside the
  compiled loop, and gradient evaluations per step (L-BFGS's line search);
* the projection: evaluations per fit = ``--evals-per-fit``, or the timed fit's evaluations per
  step x ``map_steps`` (PM fits end at their step budget, docs/muse_studies.md); fits per estimate =
  ``--iterations`` x (N + 1) + ``--h-takes`` x 2 n N (the tiny PM mock: 4 iterations, H at the
  first and the last point, 449 evaluations per fit of 300 steps: L-BFGS's line search takes
  one evaluation a step at first and more later, so a short timed fit undercounts them).

``--reproject`` recomputes the projection of an existing ``--json`` with other settings, timing
nothing.

    python -m scripts.bench.muse_cost --steps 20 --evals-per-fit 449 --json docs/bench/muse_cost_default.json -- \\
        inference.map.muse.n_sims=16 inference.map.muse.map_steps=300
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10, help="optimiser steps of the timed fit")
    ap.add_argument("--repeats", type=int, default=3, help="timed gradients")
    ap.add_argument("--iterations", type=int, default=4, help="Newton iterations of the projected estimate")
    ap.add_argument("--h-takes", type=int, default=2, help="iterations of the projection that take H")
    ap.add_argument("--evals-per-fit", type=float, help="gradient evaluations per fit (default: measured x map_steps)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--reproject", action="store_true", help="read --json, recompute its projection, time nothing")
    ap.add_argument("overrides", nargs="*", help="config overrides (after --)")
    a = ap.parse_args(argv)

    if a.reproject:
        out = json.loads(a.json.read_text())
        out["projection"] = project(out["fit"]["evals_per_step"], out["fit"]["seconds_per_eval"],
                                    out["projection"]["n_sims"], out["projection"]["map_steps"], out["n_params"], a)
        return report(out, a)
    import jax  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from fli.infer.muse.field_fit import FieldSolver  # noqa: PLC0415
    from fli.infer.posterior.model import Latents  # noqa: PLC0415

    cfg, post, theta, data = posterior_at_median(a.overrides)
    mc = cfg.inference.map.muse
    g = post.fwd.grid
    s0 = post.zeros().s
    print(f"{'x'.join(map(str, g.shape))} field ({post.dim} latents), {post.fwd.kind} forward, "
          f"{jax.device_count()} device(s)", flush=True)

    grad = jax.jit(jax.grad(lambda s: post.potential(Latents(theta, s), data)))
    t0 = time.perf_counter()
    jax.block_until_ready(grad(s0))
    t_compile_grad = time.perf_counter() - t0
    times = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(grad(s0))
        times.append(time.perf_counter() - t0)
    t_grad = float(np.median(times))
    print(f"gradient: compiled in {t_compile_grad:.1f} s, {t_grad:.2f} s (median of {a.repeats})", flush=True)

    solver = FieldSolver(post, cfg.inference.map, a.steps, 0.0)
    t0 = time.perf_counter()
    solver(theta, s0, data)  # compiles, and runs once
    t_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    _, steps, gn, evals = solver(theta, s0, data)
    t_fit = time.perf_counter() - t0
    per_eval, per_step = t_fit / evals, evals / steps
    print(f"fit: {steps} steps, {evals} gradient evaluations, {t_fit:.1f} s ({per_eval:.2f} s each; "
          f"compile and first run {t_first:.1f} s); gradient RMS {gn:.3g}", flush=True)

    out = {
        "config": a.overrides, "shape": list(g.shape), "latents": post.dim, "n_params": post.prior.n,
        "forward": post.fwd.kind, "devices": jax.device_count(), "gradient_s": t_grad,
        "gradient_compile_s": t_compile_grad,
        "fit": {"steps": steps, "grad_evals": evals, "seconds": t_fit, "seconds_per_eval": per_eval,
                "evals_per_step": per_step, "grad_rms": gn, "compile_and_first_run_s": t_first},
        "fit_eval_over_gradient": per_eval / t_grad,
        "projection": project(per_step, per_eval, mc.n_sims, mc.map_steps, post.prior.n, a),
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }
    return report(out, a)


def posterior_at_median(overrides: list[str]):
    """``(cfg, posterior, theta, data)`` of a config composed as the commands compose it (their
    process set-up and compilation cache included): theta at the prior's median, and data drawn
    from the model there (seed 0) with the survey's noise."""
    from types import SimpleNamespace  # noqa: PLC0415

    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from fli.cli.common import _setup_process  # noqa: PLC0415
    from fli.cli.compose import compose  # noqa: PLC0415
    from fli.infer.posterior.model import build_posterior, make_data  # noqa: PLC0415
    from fli.infer.muse.estimator import make_simulator  # noqa: PLC0415
    from fli.sim.sharding import make_mesh  # noqa: PLC0415
    from fli.lensing.survey import noise_sigma  # noqa: PLC0415

    cfg, _ = compose(overrides)
    _setup_process(cfg)  # the commands' compilation cache: a second machine given it skips the compiles
    post = build_posterior(cfg, mesh=make_mesh(cfg.distributed.pdims))
    sigma = noise_sigma(cfg.survey, cfg.lensing.fov_deg, cfg.lensing.npix)
    shape = (len(sigma), cfg.lensing.npix, cfg.lensing.npix)
    template = make_data(SimpleNamespace(kappa_obs=np.zeros(shape), noise_sigma=sigma, mask=None), post.fwd)
    theta = jnp.zeros((post.prior.n,), post.fwd.grid.jdtype)
    return cfg, post, theta, make_simulator(post)(theta, jax.random.key(0), template)


def project(per_step: float, per_eval: float, n_sims: int, map_steps: int, n: int, a) -> dict:
    fits_it, fits_h = n_sims + 1, 2 * n * n_sims
    evals_fit = a.evals_per_fit if a.evals_per_fit else per_step * map_steps
    fits = a.iterations * fits_it + a.h_takes * fits_h
    return {"n_sims": n_sims, "map_steps": map_steps, "evals_per_fit": evals_fit,
            "evals_per_fit_from": "--evals-per-fit" if a.evals_per_fit else "the timed fit",
            "fits_per_iteration": fits_it, "fits_per_h": fits_h, "fit_h": evals_fit * per_eval / 3600,
            "iteration_without_h_h": fits_it * evals_fit * per_eval / 3600,
            "iteration_with_h_h": (fits_it + fits_h) * evals_fit * per_eval / 3600,
            "iterations": a.iterations, "h_takes": a.h_takes, "fits": fits,
            "grad_evals": fits * evals_fit, "total_h": fits * evals_fit * per_eval / 3600}


def report(out: dict, a) -> int:
    p = out["projection"]
    print(f"projected: one fit {p['fit_h']:.2f} h, one iteration {p['iteration_without_h_h']:.1f} h "
          f"({p['iteration_with_h_h']:.1f} h with H), the estimate {p['total_h']:.1f} h ({p['grad_evals']:.3g} "
          f"gradient evaluations, {p['fits']} fits of {p['evals_per_fit']:.0f}) on {out['devices']} device(s) "
          f"in one process; peak RSS {out['peak_rss_gib']:.1f} GiB")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
