r"""MUSE, the Marginal Unbiased Score Expansion (Millea & Seljak 2022, arXiv:2112.09354): theta and
its covariance from MAP fits of the field at fixed theta, free of the joint MAP's bias
(fli.infer.fit.map.JOINT_MAP_NOTE).

In the standardised latents ``theta_z`` ``[n]`` (a priori N(0, I), fli.infer.posterior.priors), with
``s_hat(theta, x)`` the field's MAP at fixed theta (:class:`~fli.infer.muse.field_fit.FieldSolver`)
and ``g(theta, x) = -d/dtheta [U(theta, s; x) - |theta|^2 / 2]`` at ``s = s_hat``, the iteration
finds the root of ``F(theta) = g(theta, d) - <g(theta, x_i)>_i - theta`` over ``N`` simulations
``x_i ~ p(x | theta)``: Newton's step ``(H + I)^-1 F``, then Broyden's update. ``H`` is the mean
score's derivative in the theta that drew the simulations (central differences,
:func:`finite_difference_h`), ``J`` the scores' covariance at the last point over ``j_sims``
simulations (4 n_sims by default), and ``Sigma = (H^T J^-1 H + I)^-1``. Simulation ``i`` draws its
white noise and shape noise from ``fold_in(key, i)`` at every theta, so that F is smooth in theta,
and its field MAP starts from its own previous one.

``inference.map.muse.estimate``: ``posterior`` (the default) reports the mean of theta's Gaussian
posterior given the score at the last point (:func:`~fli.infer.muse.result.posterior_given_score`),
calibrated also where ``J > H``; ``root`` the root of F (kept as ``theta_root_z`` either way).
Monte Carlo errors: ``MuseResult.mc_cov_z`` and :meth:`MuseResult.theta_bootstrap_sd`; physical
moments, Omega_m and S8: :meth:`~fli.infer.muse.result.MuseResult.physical`. The reasons for these
choices, with their evidence: docs/muse.md (the method and its bullets).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from fli.infer.muse.field_fit import FieldSolver
from fli.infer.posterior.model import Data, Latents, Posterior
from fli.infer.muse.result import MuseResult, covariance, posterior_given_score
from fli.lensing.born import KAPPA_SPEC
from fli.sim.sharding import replicated_to_host, white_noise

MUSE_STREAM = 0x4D555345  # "MUSE": the simulations' keys are fold_in(key(seed), MUSE_STREAM) then i


# ================================================================================ pieces


def make_score(post: Posterior):
    """Jitted ``(theta, s, data) -> g``: the joint likelihood's score in theta at fixed ``s``,
    ``-(dU/dtheta - theta)`` (U's standard-normal prior on theta taken out)."""

    def score(theta, s, data):
        return theta - jax.grad(lambda th: post.potential(Latents(th, s), data))(theta)

    return jax.jit(score)


def make_simulator(post: Posterior):
    """Jitted ``(theta, key, data) -> Data``: a draw of the observation from the model at
    ``theta``: white noise and shape noise (``data.sigma`` per bin) from ``key``, the mask and
    noise of ``data`` kept. The same key gives the same noise at every theta."""
    g = post.fwd.grid
    kappa_sharding = NamedSharding(g.mesh, KAPPA_SPEC)

    def simulate(theta, key, data):
        k_field, k_noise = jax.random.split(key)
        s = white_noise(k_field, g.shape, g.mesh, dtype=g.jdtype)
        kappa, _ = post.predict(Latents(theta, s))
        eps = jax.lax.with_sharding_constraint(jax.random.normal(k_noise, kappa.shape, kappa.dtype), kappa_sharding)
        observed = data.weight > 0
        kobs = jnp.where(observed, kappa + data.sigma.astype(kappa.dtype)[:, None, None] * eps, 0)
        return data._replace(kappa_obs=kobs)

    return jax.jit(simulate)


# inference.map.muse.j_sims = null: J over 4 n_sims simulations at the last point (docs/muse_studies.md)
J_SIMS_PER_N = 4
MAX_STEP = 1.0  # the longest Newton step, in prior sds (the standardised latents' units)


def _capped(step: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(step))
    return step if norm <= MAX_STEP else step * (MAX_STEP / norm)


def _newton_matrix(h, b, prev, theta, f) -> np.ndarray:
    """Newton's matrix, an estimate of ``-dF/dtheta`` for this data set.

    ``H + I`` is its expectation over data sets, but this data set's own derivative (its
    observed, not expected, information) can differ by a factor of 2 where the data are far
    from typical, and Newton's iteration then cycles between two points (measured: 3 of 17
    tiny linear mocks, sigma8's latent alternating between -1.68 and -1.80 for 6 iterations).
    So ``b`` starts at ``H + I`` whenever H is taken, and is then corrected by Broyden's update
    from each step's change of F (F is a smooth function of theta: the simulations keep their
    noise). A correction that would leave ``b`` singular or indefinite is not taken.
    """
    n = len(theta)
    if b is None or prev is None:
        return h + np.eye(n)
    dth, df = theta - prev[0], f - prev[1]
    dd = float(dth @ dth)
    if dd == 0:
        return b
    new = b + np.outer(-df - b @ dth, dth) / dd
    sym = 0.5 * (new + new.T)
    if not np.all(np.isfinite(new)) or np.linalg.eigvalsh(sym).min() <= 0:
        return b
    return new


# ============================================================================ the iteration


class ScoreStore:
    """Scores already computed, by name (``"it0/sim3"``), with the theta they were taken at:
    a run that stops resumes from here (:class:`fli.infer.muse.run.JsonlStore` keeps them in a
    file). This one is in memory."""

    def __init__(self):
        self._d: dict[str, dict] = {}

    def get(self, name: str, theta: np.ndarray) -> dict | None:
        rec = self._d.get(name)
        if rec is None or not np.allclose(rec["theta"], theta, rtol=0, atol=1e-6):
            return None
        return rec

    def put(self, name: str, rec: dict) -> None:
        self._d[name] = rec

    def wait(self, names: list[str], theta: np.ndarray) -> None:
        """Return once every one of ``names`` has a score at ``theta`` (fits made by other
        processes arrive through the store). In memory nothing arrives: a fit missing here is
        an error of the caller."""
        missing = [n for n in names if self.get(n, theta) is None]
        if missing:
            raise RuntimeError(f"MUSE: no score for {missing[:3]} and no other process to make it")


def kinked(fwd) -> bool:
    """Whether the forward's potential has kinks in the field: the PM forward with CIC mass
    assignment, whose derivative jumps where a particle crosses a grid point (docs/muse_studies.md, "Why
    the PM fits stall"). Field fits stall on them whatever their budget; TSC's is smooth."""
    return fwd.kind == "pm" and fwd.grid.assignment == "cic"


class Muse:
    """The MUSE iteration of one posterior and one observation (see the module docstring).

    ``settings``: ``inference.map.muse`` (n_sims, iterations, tol, fd_step, map_steps, h_steps,
    gtol);
    ``map_cfg``: ``inference.map`` (the optimiser); ``seed``: the simulations' seed; ``pre``:
    every fit's field preconditioner (:func:`fli.infer.muse.field_fit.field_preconditioner`) or None.

    ``rank`` of ``size`` workers (``inference.map.muse.spread=processes``): this one makes the
    fits it owns and takes the others' from ``store`` (:meth:`ScoreStore.wait`). The data's
    fits belong to worker 0 and simulation i's to worker ``(i + 1) % size``, at every theta
    and every finite-difference shift, so that each fit starts from its own previous MAP as in
    one process, and every worker, holding the same scores, takes the same Newton steps.
    """

    def __init__(self, post: Posterior, data: Data, settings, map_cfg, seed: int,
                 store: ScoreStore | None = None, log: logging.Logger | None = None, rank: int = 0, size: int = 1,
                 pre=None):
        if not 0 <= rank < size:
            raise ValueError(f"MUSE worker rank {rank} of {size}")
        self.rank, self.size = rank, size
        self.post, self.data, self.cfg = post, data, settings
        self.solver = FieldSolver(post, map_cfg, settings.map_steps, settings.gtol)
        self.pre = pre  # every fit's preconditioner (fli.infer.muse.field_fit), fixed before the first; None: none
        # H's refits start from each simulation's MAP at theta, a field O(fd_step) from theirs
        self.h_steps = settings.map_steps if getattr(settings, "h_steps", None) is None else settings.h_steps
        self.j_sims = J_SIMS_PER_N * settings.n_sims if getattr(settings, "j_sims", None) is None else settings.j_sims
        self.score = make_score(post)
        self.simulate = make_simulator(post)
        self.key = jax.random.fold_in(jax.random.key(seed), MUSE_STREAM)
        self.store = store if store is not None else ScoreStore()
        self.log = log or logging.getLogger("fli")
        self.zero = post.zeros().s
        self.warm: dict[str, jax.Array] = {}  # each fit's last MAP field, to start its next fit from
        self.grad_evals = 0  # this process, this run
        self.used: dict[str, int] = {}  # the gradient evaluations of every fit the estimate used, by name
        self.at_budget: list[float] = []  # gradient RMS of the fits that ended at map_steps, since the last report

    def _dtype(self, theta):
        return jnp.asarray(theta, self.post.fwd.grid.jdtype)

    def owns(self, warm: str) -> bool:
        """Whether this worker makes the fits that start from the field ``warm`` ("data", "sim<i>")."""
        k = 0 if warm == "data" else int(warm.removeprefix("sim")) + 1
        return k % self.size == self.rank

    def _fit(self, name: str, warm: str, theta_eval, data: Data | Callable[[], Data],
             keep: bool = True, max_steps: int | None = None) -> np.ndarray | None:
        """The score of one fit (``name`` in the store; ``warm`` names the field it starts from,
        ``keep`` whether its MAP replaces that field, ``max_steps`` its budget, None:
        ``map_steps``); ``data`` may be a function making it. None where another worker makes it."""
        th = np.asarray(theta_eval, np.float64)
        rec = self.store.get(name, th)
        if rec is not None:
            return np.asarray(rec["score"])
        if not self.owns(warm):
            return None
        data = data() if callable(data) else data
        s0 = self.warm.get(warm, self.zero)
        budget = self.cfg.map_steps if max_steps is None else max_steps
        s, steps, gn, ev = self.solver(self._dtype(th), s0, data, budget, pre=self.pre)
        if keep:
            self.warm[warm] = s
        g = np.asarray(replicated_to_host(self.score(self._dtype(th), s, data)), np.float64)
        self.grad_evals += ev + 1
        if not np.all(np.isfinite(g)):
            raise FloatingPointError(f"MUSE: the score of {name} is {g.tolist()} (field MAP {steps} steps, "
                                     f"gradient RMS {gn:.3g})")
        if steps >= budget and gn > self.cfg.gtol:
            self.at_budget.append(gn)
        self.store.put(name, {"theta": th.tolist(), "score": g.tolist(), "steps": steps, "grad_rms": gn,
                              "evals": ev})
        return g

    def data_field(self, theta) -> tuple[jax.Array, int]:
        """The data's field MAP at ``theta`` (standardised), from its last fit's field, and the
        gradient evaluations it took: where a chain starts from MUSE's estimate
        (:mod:`fli.infer.sample.start`)."""
        s, _, _, ev = self.solver(self._dtype(theta), self.warm.get("data", self.zero), self.data, pre=self.pre)
        self.grad_evals += int(ev)
        return s, int(ev)

    def sim_key(self, i: int):
        return jax.random.fold_in(self.key, i)

    def _gathered(self, names: list[str], theta, mine: list) -> np.ndarray:
        """The scores of ``names`` at theta: this worker's (``mine``, None where another's),
        the others' from the store once they arrive."""
        th = np.asarray(theta, np.float64)
        if any(g is None for g in mine):
            self.store.wait([n for n, g in zip(names, mine, strict=True) if g is None], th)
        recs = [self.store.get(n, th) for n in names]
        self.used.update({n: int(r.get("evals", 0)) + 1 for n, r in zip(names, recs, strict=True)})
        return np.asarray([g if g is not None else r["score"] for g, r in zip(mine, recs, strict=True)], np.float64)

    def scores(self, it: str, theta, progress: Callable | None = None, n: int | None = None):
        """``(g_data [n], g_sims [N, n])`` at theta, of the first ``n`` simulations (None: n_sims)."""
        th = self._dtype(theta)
        n = self.cfg.n_sims if n is None else n
        names = [f"{it}/data", *(f"{it}/sim{i}" for i in range(n))]
        mine = [self._fit(names[0], "data", theta, self.data)]
        for i in range(n):  # the simulations beyond n_sims (J's, at the last point) keep no field to start from
            mine.append(self._fit(names[i + 1], f"sim{i}", theta,
                                  lambda i=i: self.simulate(th, self.sim_key(i), self.data), keep=i < self.cfg.n_sims))
            if progress is not None:
                progress(i + 1)
        g = self._gathered(names, theta, mine)
        return g[0], g[1:]

    def finite_difference_h(self, it: str, theta, progress: Callable | None = None) -> np.ndarray:
        """``[N, n, n]``: each simulation's central difference of its score (at ``theta``) in
        the theta that made it, ``(g(theta, x_i(theta + eps e_j)) - g(theta, x_i(theta - eps e_j))) / 2 eps``
        in column j; each fit starts from the simulation's own MAP at theta and runs at most
        ``h_steps`` steps (``inference.map.muse.h_steps``)."""
        n, eps = len(theta), self.cfg.fd_step
        names, mine, done = [], [], 0
        for j in range(n):
            for i in range(self.cfg.n_sims):
                for sign in (1, -1):
                    tp = np.array(theta, np.float64)
                    tp[j] += sign * eps
                    # the store holds the theta of the score, which is theta, not tp: the name says the shift
                    names.append(f"{it}/h{j}{'+' if sign > 0 else '-'}/sim{i}")
                    mine.append(self._fit(names[-1], f"sim{i}", theta,
                                          lambda tp=tp, i=i: self.simulate(self._dtype(tp), self.sim_key(i),
                                                                           self.data), keep=False,
                                          max_steps=self.h_steps))
                done += 1
                if progress is not None:
                    progress(done)
        g = self._gathered(names, theta, mine).reshape(n, self.cfg.n_sims, 2, n)
        return np.transpose((g[:, :, 0] - g[:, :, 1]) / (2 * eps), (1, 2, 0))  # [sim, score component, column j]

    def run(self, theta0, on_iteration: Callable | None = None) -> MuseResult:
        """Newton's iteration from ``theta0`` (standardised) until every step is below ``tol``
        MUSE sds, or ``iterations``.

        H is taken again at every iteration whose previous step was longer than one MUSE sd
        (far from the solution H changes along the way), and kept once the steps are shorter;
        the covariance uses an H taken at the last point. Newton's matrix starts at ``H + I`` and
        follows this data set's own derivative of F by Broyden's update (:func:`_newton_matrix`).
        A step is shortened to at most :data:`MAX_STEP` prior sds (Newton's step from far out in
        a prior's tail overshoots).
        """
        t0 = time.perf_counter()
        cfg, n = self.cfg, len(theta0)
        theta = np.asarray(theta0, np.float64)
        history, h_cols, h_at, converged = [], None, None, False
        b, prev = None, None  # Newton's matrix (an estimate of -dF/dtheta) and the last (theta, F)
        for k in range(cfg.iterations):
            ti = time.perf_counter()
            g_d, g_s = self.scores(f"it{k}", theta, self._progress(f"iteration {k + 1}: simulations", cfg.n_sims))
            far = not history or max(history[-1]["step_over_sd"]) > 1.0
            if h_cols is None or far:
                h_cols = self.finite_difference_h(f"it{k}", theta,
                                                  self._progress(f"iteration {k + 1}: H by finite differences",
                                                                 n * cfg.n_sims, h=True))
                h_at = k
            h, jm = h_cols.mean(0), np.cov(g_s.T).reshape(n, n)
            f = g_d - g_s.mean(0) - theta
            b = _newton_matrix(h, b if h_at != k else None, prev, theta, f)
            step = np.linalg.solve(b, f)
            prev = (theta, f)
            cov = covariance(h, jm)
            rel = np.abs(step) / np.sqrt(np.diag(cov))
            history.append({"iteration": k + 1, "theta_z": theta.tolist(), "F": f.tolist(), "step": step.tolist(),
                            "step_over_sd": rel.tolist(), "h_from_iteration": h_at + 1, "newton_matrix": b.tolist(),
                            "seconds": time.perf_counter() - ti, "grad_evals": sum(self.used.values()),
                            "grad_evals_here": self.grad_evals})
            self.log.info("MUSE iteration %d/%d: theta_z %s, Newton step %s (%s MUSE sd)", k + 1, cfg.iterations,
                          np.round(theta, 4).tolist(), np.round(step, 4).tolist(), np.round(rel, 3).tolist())
            if on_iteration is not None:
                on_iteration(history[-1])
            if np.all(rel < cfg.tol):
                converged = True
                break
            if k + 1 < cfg.iterations:
                theta = theta + _capped(step)
        if h_at != k:  # the covariance belongs to the last point: H there
            h_cols = self.finite_difference_h(f"it{k}", theta,
                                              self._progress("H at the last point", n * cfg.n_sims, h=True))
        g_j, n_j = g_s, self.j_sims
        if n_j > cfg.n_sims:  # more simulations at the last point for J: one fit each
            what = f"J at the last point ({n_j} simulations)"
            g_j = self.scores(f"it{k}", theta, self._progress(what, n_j), n_j)[1]
        h, jm = h_cols.mean(0), np.cov(g_j.T).reshape(n, n)
        cov = covariance(h, jm)
        bi = np.linalg.inv(b)
        # the last step with the iteration's own n_sims: the root stays the root of the iteration's
        # F, so that a run started there (inference.map.muse.start) stops at once
        root = theta + _capped(bi @ (g_d - g_s.mean(0) - theta))
        if not converged:
            self.log.warning("MUSE did not converge in inference.map.muse.iterations = %d: the last Newton step was "
                             "%s MUSE sd (tol %g); raise it to continue", cfg.iterations,
                             np.round(history[-1]["step_over_sd"], 3).tolist(), cfg.tol)
        estimate = getattr(cfg, "estimate", "posterior")
        if estimate == "posterior":  # the posterior's mean given the score at the last point (its docstring)
            est, mc = posterior_given_score(h, jm, g_d - g_s.mean(0), theta, cfg.n_sims)
            self.log.info("MUSE: the posterior's mean given the score, theta_z %s; the root of F %s (%s MUSE sd "
                          "apart)", np.round(est, 4).tolist(), np.round(root, 4).tolist(),
                          np.round(np.abs(est - root) / np.sqrt(np.diag(cov)), 3).tolist())
        else:  # the root moves by b^-1 times an error of the simulations' mean score (covariance J / N)
            est, mc = root, bi @ jm @ bi.T / cfg.n_sims
        return MuseResult(tuple(self.post.names), est, cov, h, jm, mc, g_j, g_d, h_cols, history, converged,
                          sum(self.used.values()), time.perf_counter() - t0, self.grad_evals, root, estimate)

    def _remedy(self, key: str) -> str:
        """What would let the fits converge: CIC's kinks of U stall them on the PM forward
        whatever the budget (docs/muse_studies.md), TSC's smooth U does not."""
        if kinked(self.post.fwd):
            return (f"with CIC on the PM forward no {key} brings them to gtol, since U has kinks: "
                    "simulation.assignment=tsc makes U smooth so that they converge, docs/muse_studies.md")
        return f"raise {key} for a sharper one"

    def _progress(self, what: str, total: int, h: bool = False):
        key, budget = ("h_steps", self.h_steps) if h else ("map_steps", self.cfg.map_steps)
        every = max(1, total // 4)
        t0 = time.perf_counter()

        def report(done):
            if done % every == 0 or done == total:
                dt = time.perf_counter() - t0
                left = f", about {dt / done * (total - done):.0f} s left" if 0 < done < total else ""
                self.log.info("MUSE %s: %d/%d fits, %.1f s%s", what, done, total, dt, left)
            if done == total and self.at_budget:
                self.log.warning("MUSE %s: %d of the fits ended at inference.map.muse.%s = %d with the "
                                 "gradient's RMS at %.3g-%.3g > gtol %.3g (the data and the simulations are fitted "
                                 "alike, so the estimate stays unbiased; %s)", what,
                                 len(self.at_budget), key, budget, min(self.at_budget), max(self.at_budget),
                                 self.cfg.gtol, self._remedy(key))
                self.at_budget = []

        return report
