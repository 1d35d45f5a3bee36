"""The MUSE estimate's statistics: its covariance from H and J, the Monte Carlo error of that
covariance (a bootstrap over the simulations), and the estimate in physical units (its latent
Gaussian pushed through the prior transform). fli.infer.muse.estimator makes the estimate.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from fli.infer.posterior.model import Posterior
from fli.infer.posterior.priors import gaussian_pushforward, gaussian_quantiles

CENTRAL68_LOW = 0.15865525393145707  # Phi(-1): a central 68 % interval's lower quantile
H_RESOLVED = 2.0  # a diagonal of H counts as measured above this many of its standard errors


def covariance(h: np.ndarray, j: np.ndarray) -> np.ndarray:
    """``(H^T J^-1 H + I)^-1``: the likelihood's ``H^-1 J H^-T`` with the standard-normal prior."""
    h, j = np.asarray(h, np.float64), np.asarray(j, np.float64)
    try:
        jinv_h = np.linalg.solve(j, h)
    except np.linalg.LinAlgError:
        raise FloatingPointError(f"MUSE: the simulations' scores have a singular covariance J = {j.tolist()}: "
                                 f"raise inference.map.muse.n_sims, or check that every sampled parameter "
                                 f"changes the model") from None
    prec = h.T @ jinv_h + np.eye(h.shape[0])
    prec = 0.5 * (prec + prec.T)
    # a J that is singular to round-off (few distinct simulations) solves without an error but
    # leaves H^T J^-1 H + I indefinite
    refuse = FloatingPointError(f"MUSE: H^T J^-1 H + I is not positive definite (H = {h.tolist()}, "
                                f"J = {j.tolist()}): raise inference.map.muse.n_sims")
    if not np.all(np.isfinite(prec)) or np.linalg.eigvalsh(prec).min() <= 0:
        raise refuse
    try:  # positive to eigvalsh yet singular to LU: a bootstrap resample of 5 simulations gave one
        return np.linalg.inv(prec)
    except np.linalg.LinAlgError:
        raise refuse from None


def posterior_given_score(h: np.ndarray, j: np.ndarray, s: np.ndarray, theta: np.ndarray,
                          n_sims: int) -> tuple[np.ndarray, np.ndarray]:
    """The mean of theta's Gaussian posterior given the MUSE score, and its Monte Carlo covariance.

    ``s = g(theta, d) - <g(theta, x_i)>`` is taken at ``theta`` (prior not included). Linearised
    there, ``s`` given the true ``t`` is ``N(H (t - theta), J)``: its mean moves as H and it
    scatters as J over data sets. With the standard-normal prior of t, the posterior has
    precision ``P = H^T J^-1 H + I`` (the inverse of :func:`covariance`, MUSE's reported
    covariance) and mean ``P^-1 H^T J^-1 (s + H theta)``: that mean is what this returns.

    Where ``J = H`` (the marginal likelihood's own score, as on the linear forward) the mean is
    the root of ``s(theta) - theta``, Millea & Seljak's estimate with the prior (a Newton step
    with ``H + I`` lands on it). Where ``J`` exceeds ``H`` (the score at the field's MAP carries
    less information than its scatter; on tiny TSC PM, Omega_c's H is 0.33 and its J 0.57-1.2)
    the root moves ``(H + I)^-1 s`` from the prior's median while the posterior given s moves
    only ``P^-1 H^T J^-1 s``: the root then lies too far from the prior for the width reported
    beside it, and its pulls over mocks drawn from the prior have an sd above 1.

    The Monte Carlo covariance is that of the simulations' mean score (``J / n_sims``)
    carried through: ``P^-1 H^T J^-1 H P^-1 / n_sims``. The noise of H and J themselves is
    in :meth:`MuseResult.theta_bootstrap_sd`.
    """
    h, j = np.asarray(h, np.float64), np.asarray(j, np.float64)
    cov = covariance(h, j)
    w = np.linalg.solve(j, h).T  # H^T J^-1 (J symmetric)
    mean = cov @ w @ (np.asarray(s, np.float64) + h @ np.asarray(theta, np.float64))
    return mean, cov @ w @ h @ cov / n_sims


def estimates_of_record(muse: dict) -> dict[str, np.ndarray]:
    """Both estimates, ``{"root": ..., "posterior": ...}`` (standardised latents), from a map.json
    ``muse`` block, whichever ``estimate`` wrote it: blocks written before the posterior's mean
    existed hold the root as ``theta_z``. The posterior's mean is taken as the run took it, from
    the last iteration's point and F (``s = F + theta``) with the block's H and J."""
    last = muse["history"][-1]
    theta = np.asarray(last["theta_z"], np.float64)
    s = np.asarray(last["F"], np.float64) + theta
    post, _ = posterior_given_score(np.asarray(muse["H"]), np.asarray(muse["J"]), s, theta,
                                    muse["settings"]["n_sims"])
    root = muse.get("theta_root_z") or muse["theta_z"]
    return {"root": np.asarray(root, np.float64), "posterior": post}


@dataclasses.dataclass
class MuseResult:
    """The MUSE estimate in the standardised latents and what it was made of.

    Attributes:
        names: the sampled parameters.
        theta_z: ``[n]`` the estimate; cov_z: ``[n, n]`` its covariance (prior included).
            With ``estimate`` "posterior" (the default) theta_z is the mean of the Gaussian
            posterior given the MUSE score (:func:`posterior_given_score`); with "root", the
            root of ``F``.
        theta_root_z: ``[n]`` the root of ``F(theta) = g(theta, d) - <g(theta, x_i)> - theta``
            (Newton's last step); ``inference.map.muse.start`` there resumes the iteration.
        h, j: ``[n, n]`` the last H (finite differences) and J (scores' covariance).
        mc_cov_z: ``[n, n]`` the Monte Carlo covariance of ``theta_z`` from the n_sims
            simulations of its last mean score.
        estimate: "posterior" or "root", which of the two theta_z is.
        sim_scores: ``[N, n]`` the simulations' scores at the last evaluation (``j_sims`` of them);
            data_score ``[n]``.
        h_columns: ``[N, n, n]`` each simulation's finite-difference columns of H (for the bootstrap).
        history: one dict per iteration (theta, step, F, seconds, gradient evaluations).
        converged: whether the last Newton step was below ``tol`` times the MUSE sd.
        grad_evals: the gradient evaluations of every fit the estimate used, by any process
            and before any resume; grad_evals_here: those this process made in this run.
        preconditioner: the fits' preconditioner (rank, its own gradient evaluations and
            seconds, its largest and smallest eigenvalue), None where the fits were plain.
    """

    names: tuple[str, ...]
    theta_z: np.ndarray
    cov_z: np.ndarray
    h: np.ndarray
    j: np.ndarray
    mc_cov_z: np.ndarray
    sim_scores: np.ndarray
    data_score: np.ndarray
    h_columns: np.ndarray
    history: list
    converged: bool
    grad_evals: int
    seconds: float
    grad_evals_here: int = 0
    theta_root_z: np.ndarray | None = None
    estimate: str = "root"
    preconditioner: dict | None = None

    @property
    def sd_z(self) -> np.ndarray:
        return np.sqrt(np.diag(self.cov_z))

    @property
    def h_se(self) -> np.ndarray:
        """``[n, n]`` H's Monte Carlo standard error: the simulations' finite-difference
        columns' sd over ``sqrt(N)``."""
        return self.h_columns.std(0, ddof=1) / math.sqrt(self.h_columns.shape[0])

    def unresolved(self, k: float = H_RESOLVED) -> list[str]:
        """The parameters whose diagonal of H is not above ``k`` of its standard errors: the
        simulations do not resolve how that parameter moves their scores, so its sd falls back
        towards the prior's and Newton's steps in it lean on Broyden's update. Seen on tiny PM
        with fits that end at their step budget: H's Omega_c diagonal -0.38 +- 0.4 (docs/muse_studies.md)."""
        d, se = np.diag(self.h), np.diag(self.h_se)
        return [n for n, v, e in zip(self.names, d, se, strict=True) if not v > k * e]

    def _resampled(self, make, n_boot: int, seed: int) -> np.ndarray | None:
        """``[n_boot, ...]`` of ``make(ih, ij)`` over resamplings of the simulations: ``ih``
        indexes the first n_sims (those with H's columns and in the mean score), ``ij`` the
        j_sims scores behind J. Where the two sets are one (j_sims = n_sims) one draw serves both
        and each simulation stays paired; otherwise each is resampled on its own (the pairing of
        the first n_sims within J's is dropped, a small part of the error). A resample whose J is
        singular (few distinct simulations) raises FloatingPointError in ``make`` and is drawn
        again; None where nearly every one is, rather than looping."""
        rng = np.random.default_rng(seed)
        nh, n = self.h_columns.shape[0], self.sim_scores.shape[0]
        out, singular = [], 0
        while len(out) < n_boot:
            ih = rng.integers(0, nh, nh)
            ij = ih if n == nh else rng.integers(0, n, n)
            try:
                out.append(make(ih, ij))
            except FloatingPointError:
                singular += 1
                if singular > 10 * n_boot:
                    return None
        return np.asarray(out)

    def _j_of(self, ij: np.ndarray) -> np.ndarray:
        k = len(self.names)
        return np.cov(self.sim_scores[ij].T).reshape(k, k)  # np.cov is 0-d for one parameter

    def bootstrap_sd(self, n_boot: int = 200, seed: int = 0) -> np.ndarray:
        """The Monte Carlo sd of each of ``sd_z`` over resamplings of the simulations (their
        scores for J, their finite-difference columns for H). NaN where nearly every resample
        leaves J singular."""
        out = self._resampled(lambda ih, ij: np.sqrt(np.diag(covariance(self.h_columns[ih].mean(0), self._j_of(ij)))),
                              n_boot, seed)
        return np.full(len(self.names), np.nan) if out is None else np.std(out, axis=0, ddof=1)

    def theta_bootstrap_sd(self, n_boot: int = 200, seed: int = 0) -> np.ndarray:
        """The Monte Carlo sd of each of ``theta_z``: :meth:`theta_bootstrap_cov`'s diagonal."""
        return np.sqrt(np.diag(self.theta_bootstrap_cov(n_boot, seed)))

    def theta_bootstrap_cov(self, n_boot: int = 200, seed: int = 0) -> np.ndarray:
        """The Monte Carlo covariance of ``theta_z`` over resamplings of the simulations: the
        estimate made again at the last point from each resample's mean score and H (the first
        n_sims simulations, paired) and J (its j_sims). Beside ``mc_cov_z``, which carries the
        mean score's noise alone, this carries H's and J's too: the posterior's mean depends on
        them through ``H^T J^-1``, most where a parameter's H is small. NaN where nearly every
        resample leaves J singular (a handful of simulations)."""
        theta = np.asarray(self.history[-1]["theta_z"], np.float64)
        b = np.asarray(self.history[-1]["newton_matrix"], np.float64)
        nh, k = self.h_columns.shape[0], len(self.names)

        def make(ih, ij):
            s = self.data_score - self.sim_scores[:nh][ih].mean(0)
            if self.estimate == "root":
                return theta + np.linalg.solve(b, s - theta)
            return posterior_given_score(self.h_columns[ih].mean(0), self._j_of(ij), s, theta, nh)[0]

        out = self._resampled(make, n_boot, seed)
        return np.full((k, k), np.nan) if out is None else np.cov(out.T).reshape(k, k)

    def physical(self, post: Posterior, mc_cov: np.ndarray | None = None) -> dict:
        """``{"value", "sd", "cov", "median", "interval68", "mc_sd", "names"}`` of the sampled
        parameters and Omega_m, S8, from MUSE's Gaussian in the standardised latents.

        ``value``, ``sd`` and ``cov`` are the moments of that Gaussian pushed through the prior
        transform (:func:`fli.infer.posterior.priors.gaussian_pushforward`), not the delta method: where
        the latent width is a fair part of the prior's (Omega_c on tiny, sd_z 0.5-0.8), the
        delta method at the estimate overstates a uniform prior's width by up to 1.38x.
        ``median`` is the estimate itself through the transform (``root_median`` the root of F
        through it, where the estimate is the posterior's mean), and ``interval68`` the
        Gaussian's central 68 % interval through it: exact for the sampled parameters, each a
        monotone function of its own latent; for the derived Omega_m and S8 the 16th and 84th
        percentiles of the pushforward (:func:`fli.infer.posterior.priors.gaussian_quantiles`, to 0.004
        of their sd). ``mc_sd``, the estimate's Monte Carlo error, is
        ``mc_cov`` (default ``mc_cov_z``, the mean score's part) through the transform to first
        order (delta method), the error being small.
        """
        dt = post.fwd.grid.jdtype
        th = jnp.asarray(self.theta_z, dt)
        stack = lambda t: jnp.stack(list(post.params(t).values()))
        median = {k: float(v) for k, v in post.params(th).items()}
        names = list(median)
        batch = jax.jit(jax.vmap(lambda t: stack(jnp.asarray(t, dt))))
        mean, cov = gaussian_pushforward(self.theta_z, self.cov_z, batch)
        jac = np.asarray(jax.jacfwd(stack)(th), np.float64)
        mc = jac @ (self.mc_cov_z if mc_cov is None else mc_cov) @ jac.T
        sd = lambda c: {k: float(math.sqrt(max(c[i, i], 0.0))) for i, k in enumerate(names)}
        lo, hi = (np.asarray(post.prior(jnp.asarray(self.theta_z + sign * self.sd_z, dt)), np.float64)
                  for sign in (-1, 1))
        interval = {k: [float(lo[i]), float(hi[i])] for i, k in enumerate(post.names)}
        derived = [i for i, k in enumerate(names) if k not in interval]
        if derived:  # Omega_m, S8: functions of several latents, their quantiles from draws
            q = gaussian_quantiles(self.theta_z, self.cov_z, batch, [CENTRAL68_LOW, 1 - CENTRAL68_LOW])
            interval.update({names[i]: [float(q[0, i]), float(q[1, i])] for i in derived})
        root = None if self.theta_root_z is None else {
            k: float(v) for k, v in post.params(jnp.asarray(self.theta_root_z, dt)).items()}
        return {"names": names, "value": {k: float(mean[i]) for i, k in enumerate(names)}, "sd": sd(cov),
                "cov": cov.tolist(), "median": median, "root_median": root, "mc_sd": sd(mc),
                "interval68": interval}
