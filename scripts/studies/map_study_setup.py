"""The compiled pieces of scripts/studies/map_study.py: one configuration's posterior, its jitted
forward and potential, mocks made as fli-mock makes them, MAP fits with optimiser steps compiled
once and reused for every seed, and the Laplace errors at a fit.
"""

from __future__ import annotations

import dataclasses
import math
import time
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


class Setup:
    """One configuration: the posterior, its jitted helpers, compiled optimiser steps (cached)."""

    def __init__(self, overrides, pdims=(1, 1)):
        from fli.cli.compose import compose
        from fli.infer.posterior.model import build_posterior
        from fli.sim.sharding import make_mesh

        self.overrides = list(overrides)
        self.cfg, _ = compose([*overrides, f"distributed.pdims=[{pdims[0]},{pdims[1]}]"])
        self.post = build_posterior(self.cfg, mesh=make_mesh(pdims))
        post = self.post
        self.grid = post.fwd.grid
        self.dt = self.grid.jdtype
        self.pix_arcmin = post.fwd.geometry.pixel_size_arcmin
        self.fov = post.fwd.geometry.fov_deg
        self.mcfg = self.cfg.inference.map
        self.fwd_j = jax.jit(lambda c, s: post.fwd(c, s)[0])
        self.predict_j = jax.jit(lambda lat: post.predict(lat)[0])
        self.pot_j = jax.jit(lambda lat, data: post.potential_and_aux(lat, data))
        self.params_j = jax.jit(post.params)
        self._steps = {}

    # -- mocks --------------------------------------------------------------------------
    def truth_cosmo(self, truth: dict):
        return self.post.base.replace(**{k: float(v) for k, v in truth.items()})

    def mock(self, truth: dict, seed: int):
        """(white noise, noiseless kappa) of one seed at ``truth`` (the sampled parameters)."""
        from fli.sim.sharding import white_noise

        s = white_noise(seed, self.grid.shape, self.grid.mesh, dtype=self.dt)
        return s, self.fwd_j(self.truth_cosmo(truth), s)

    def sigma(self, depth: float = 1.0) -> np.ndarray:
        from fli.lensing.survey import noise_sigma

        return noise_sigma(self.cfg.survey, self.cfg.lensing.fov_deg, self.cfg.lensing.npix) / math.sqrt(depth)

    def data(self, kappa, sigma, seed: int):
        from fli.infer.posterior.model import make_data
        from fli.mock import add_shape_noise

        noisy = add_shape_noise(seed, kappa, sigma)
        return make_data(SimpleNamespace(kappa_obs=noisy.kappa, noise_sigma=noisy.sigma, mask=None), self.post.fwd)

    def theta_of(self, truth: dict):
        return jnp.asarray(self.post.theta_of(truth), self.dt)

    # -- MAP ------------------------------------------------------------------------------
    def step(self, mcfg, data, theta_fixed=None, tag="joint"):
        """The compiled step for ``(tag, optimizer)`` (compiled once, on the first data)."""
        from fli.infer.fit.optimize import init_state, make_step

        key = (tag, mcfg.optimizer, mcfg.steps if mcfg.optimizer == "adam" else 0)
        if key not in self._steps:
            t0 = time.perf_counter()
            fn, opt = make_step(self.post, mcfg, theta_fixed)
            init = self.init(theta_fixed)
            compiled = fn.lower(init, init_state(opt, init, self.post), data, jnp.asarray(0.0, self.dt)).compile()
            self._steps[key] = (compiled, opt, time.perf_counter() - t0)
            log(f"compiled step {key} in {time.perf_counter() - t0:.0f} s")
        return self._steps[key]

    def init(self, theta_fixed=None):
        from fli.infer.posterior.model import Latents

        z = self.post.zeros()
        return z if theta_fixed is None else Latents(jnp.asarray(theta_fixed, self.dt), z.s)

    def fit(self, mcfg, data, theta_fixed=None, tag="joint", exact_every_step=False):
        """Run the MAP from the prior's mode; returns (latents, history rows, exact losses, seconds)."""
        from fli.infer.fit.optimize import MapRun, init_state, run_map

        compiled, opt, _ = self.step(mcfg, data, theta_fixed, tag)
        init = self.init(theta_fixed)
        run = MapRun(init, init_state(opt, init, self.post), 0, [], jax.random.key(0))
        exact = []

        def report(r, info, dt):
            if exact_every_step:
                exact.append(float(self.pot_j(r.params, data)[0]))

        t0 = time.perf_counter()
        try:
            run = run_map(self.post, data, mcfg, run, compiled, opt, pixel_arcmin=self.pix_arcmin, report=report)
            err = None
        except FloatingPointError as e:
            err = str(e)
        return run, exact, time.perf_counter() - t0, err

    def phys(self, theta) -> dict:
        p = {k: float(v) for k, v in self.params_j(theta).items()}
        return {"Omega_c": p["Omega_c"], "sigma8": p["sigma8"], "S8": p["S8"], "Omega_m": p["Omega_m"]}

    def truth_phys(self, truth: dict) -> dict:
        from fli.infer.posterior.params import with_derived

        ob = float(self.post.base.Omega_b)
        return {"Omega_c": truth["Omega_c"], "sigma8": truth["sigma8"],
                "S8": float(with_derived({**truth, "Omega_b": ob})["S8"]), "Omega_m": truth["Omega_c"] + ob}

    # -- Laplace --------------------------------------------------------------------------
    def laplace(self, lat, data):
        """Marginal and conditional Laplace std (physical) at ``lat``: the exact Hessian by
        reverse-over-reverse HVPs (the PM forward's custom VJPs refuse forward mode), the Schur
        complement by :func:`fli.infer.fit.laplace.schur_columns`, wrapped in one jit with the data
        as an argument so that every seed reuses the compiled program (``laplace_errors``
        closes over the data, so it compiles anew for each observation)."""
        from fli.infer.fit.laplace import schur_columns, to_physical
        from fli.infer.posterior.model import Latents

        post, mcfg = self.post, self.mcfg
        if not hasattr(self, "_schur"):
            def fn(theta, s, data, kind):
                U = lambda th, ss: post.potential(Latents(th, ss), data)
                res = lambda th, ss: post.residual(Latents(th, ss), data)
                fns = (U, None) if kind == "exact" else (None, res)
                return schur_columns(*fns, theta, s, mcfg.cg_tol, mcfg.cg_maxiter, kind=kind, ad="reverse")
            self._schur = jax.jit(fn, static_argnames="kind")
        t0 = time.perf_counter()
        out = {}
        for kind in ("exact", "gauss_newton") if getattr(self, "laplace_gn", False) else ("exact",):
            try:
                sc = self._schur(lat.theta, lat.s, data, kind)
                h_tt, schur = (np.asarray(a, np.float64) for a in (sc.h_tt, sc.schur))
            except Exception as e:  # noqa: BLE001 -- report why it is unavailable
                out[kind] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
                continue
            jac = np.asarray(post.prior.jacobian(lat.theta), float)
            res = {"cg_iterations": np.asarray(sc.cg.iterations).tolist(),
                   "cg_converged": np.asarray(sc.cg.converged).tolist(),
                   "negative_curvature": np.asarray(sc.cg.negative_curvature).tolist()}
            for name, prec in (("marginal", schur), ("conditional", h_tt)):
                prec = 0.5 * (prec + prec.T)
                try:
                    np.linalg.cholesky(prec)
                    pd = True
                except np.linalg.LinAlgError:
                    pd = False
                cov = to_physical(np.linalg.inv(prec), jac)
                # S8 by the delta method: dS8/dOmega_c, dS8/dsigma8 at the point
                p = self.phys(lat.theta)
                g = np.array([0.5 * p["S8"] / p["Omega_m"], p["S8"] / p["sigma8"]])
                sd = {n: float(math.sqrt(cov[i, i])) if cov[i, i] > 0 else float("nan")
                      for i, n in enumerate(post.names)}
                v = float(g @ cov @ g)
                sd["S8"] = math.sqrt(v) if v > 0 else float("nan")
                res[name] = {"std": sd, "positive_definite": pd, "cov": cov.tolist()}
            out[kind] = res
        out["seconds"] = time.perf_counter() - t0
        return out


def lbfgs_cfg(s: Setup, steps: int, **kw):
    return dataclasses.replace(s.mcfg, optimizer="lbfgs", steps=steps, **kw)
