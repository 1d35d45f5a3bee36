"""MUSE's reported estimate: the mean of the Gaussian posterior given the MUSE score
(fli.infer.muse.result.posterior_given_score), against the root of F.

The references are independent of the formula: the posterior by importance sampling of the
prior, and the pulls of draws from the prior and the score's linear-Gaussian model itself. No
fits: the score s = g(theta, d) - <g(theta, x_i)> is drawn from the model MUSE assumes for it at
the point it was taken, ``N(H (t - theta0), J)``, with an H and J like tiny TSC PM's (Omega_c's
score there scatters more than it responds: H 0.33, J 0.57-1.2; sigma8's H and J are equal
within their errors)."""

from __future__ import annotations

import numpy as np
import pytest

from fli.infer.muse.result import covariance, posterior_given_score

H = np.array([[0.33, -0.14], [-0.27, 7.1]])
J = np.array([[1.2, -0.15], [-0.15, 7.3]])
THETA0 = np.array([-0.5, 0.2])  # where the score was taken (the iteration's last point)


def _draws(rng, n, h=H, j=J, theta0=THETA0):
    """Truths from the standard-normal prior and their scores at theta0; with common random
    numbers the score at any theta is s + H (theta0 - theta), so the root of s(theta) - theta is
    (H + I)^-1 (s + H theta0)."""
    t = rng.standard_normal((n, 2))
    s = (t - theta0) @ h.T + rng.multivariate_normal(np.zeros(2), j, n)
    return t, s


def test_the_mean_is_the_posteriors_given_the_score_by_importance_sampling():
    """One score; the posterior of t given it, by weighting 400,000 prior draws with the score's
    likelihood N(s; H (t - theta0), J). Its mean's Monte Carlo error is about 0.002 (effective
    sample over 10^4): 0.01 is 5 of those. The covariance is MUSE's own, (H^T J^-1 H + I)^-1."""
    rng = np.random.default_rng(1)
    s = np.array([-1.1, 2.3])
    mean, _ = posterior_given_score(H, J, s, THETA0, n_sims=32)
    t = rng.standard_normal((400_000, 2))
    r = s - (t - THETA0) @ H.T
    logw = -0.5 * np.einsum("ni,ij,nj->n", r, np.linalg.inv(J), r)
    w = np.exp(logw - logw.max())
    w /= w.sum()
    assert 1.0 / np.sum(w ** 2) > 1e4
    ref_mean = w @ t
    ref_cov = (t - ref_mean).T @ ((t - ref_mean) * w[:, None])
    np.testing.assert_allclose(mean, ref_mean, atol=0.01)
    np.testing.assert_allclose(covariance(H, J), ref_cov, atol=0.01)


def test_its_pulls_over_the_prior_are_standard_normal_and_the_roots_are_not():
    """Truths drawn from the prior: (t - mean) / sd must be N(0, 1) for each parameter, as issue
    21's calibration demands; 20,000 draws give the sd to 0.005, so 0.03 is 6 of those. The root
    of F, with the same reported sd, over-disperses where J exceeds H: Omega_c's pull sd is then
    sqrt((1 + J) / (1 + H)^2) / sd = 1.16 here (diagonal terms), which the test requires above
    1.1; sigma8's, where J = H, stays near 1."""
    rng = np.random.default_rng(2)
    t, s = _draws(rng, 20_000)
    sd = np.sqrt(np.diag(covariance(H, J)))
    means = np.array([posterior_given_score(H, J, si, THETA0, 32)[0] for si in s])
    roots = np.linalg.solve(H + np.eye(2), (s + THETA0 @ H.T).T).T
    pull, pull_root = (t - means) / sd, (t - roots) / sd
    np.testing.assert_allclose(pull.mean(0), 0.0, atol=0.03)
    np.testing.assert_allclose(pull.std(0), 1.0, atol=0.03)
    assert pull_root[:, 0].std() > 1.1, pull_root.std(0)
    assert abs(pull_root[:, 1].std() - 1.0) < 0.05, pull_root.std(0)


def test_where_j_equals_h_the_mean_is_the_newton_step_onto_the_root():
    """J = H symmetric (the linear forward's marginal score): the posterior's mean given the score
    at theta0 is theta0 + (H + I)^-1 (s - theta0), the step MUSE's Newton iteration takes with
    the expected matrix, to round-off."""
    h = np.array([[1.4, 0.6], [0.6, 16.0]])
    s = np.array([0.3, -1.7])
    mean, _ = posterior_given_score(h, h, s, THETA0, 32)
    np.testing.assert_allclose(mean, THETA0 + np.linalg.solve(h + np.eye(2), s - THETA0), rtol=1e-12)


@pytest.mark.parametrize("n_sims", [8, 32])
def test_the_monte_carlo_covariance_is_the_means_scatter_over_the_simulations(n_sims):
    """The score's simulation term is the mean of n_sims scores of covariance J: redrawing only
    that term moves the estimate with the returned covariance. 4,000 redraws give each variance
    to about 2.2 %; the tolerance is 10 %."""
    rng = np.random.default_rng(3)
    s0 = np.array([-0.8, 1.5])
    _, mc = posterior_given_score(H, J, s0, THETA0, n_sims)
    noise = rng.multivariate_normal(np.zeros(2), J, (4000, n_sims)).mean(1)
    est = np.array([posterior_given_score(H, J, s0 + e, THETA0, n_sims)[0] for e in noise])
    np.testing.assert_allclose(np.cov(est.T), mc, rtol=0.1, atol=0.1 * np.abs(mc).max())


def _result(rng, n_sims, j_sims, h_sd, data_score, theta0=THETA0):
    """A MuseResult as a run would leave it at its last point, its simulations drawn afresh:
    each simulation's finite-difference columns of H scatter by ``h_sd`` about H, and the
    scores by J about zero."""
    from fli.infer.muse.result import MuseResult

    h_cols = H + h_sd * rng.standard_normal((n_sims, 2, 2))
    scores = rng.multivariate_normal(np.zeros(2), J, j_sims)
    h, j = h_cols.mean(0), np.cov(scores.T)
    s = data_score - scores[:n_sims].mean(0)
    est, mc = posterior_given_score(h, j, s, theta0, n_sims)
    hist = [{"theta_z": theta0.tolist(), "F": (s - theta0).tolist(), "newton_matrix": (h + np.eye(2)).tolist()}]
    return MuseResult(("Omega_c", "sigma8"), est, covariance(h, j), h, j, mc, scores, data_score, h_cols, hist,
                      True, 0, 0.0, estimate="posterior")


def test_the_bootstrap_of_the_estimate_carries_h_and_js_noise_as_fresh_simulations_do():
    """One data score; 300 independent sets of simulations (16 for the mean and H, 64 for J,
    H's columns scattering as pair 0's tiny TSC run's did: 4 H_se a simulation). The estimate's sd
    over the sets is what theta_bootstrap_sd must report from one set: its median over 40 sets
    within 30 % (the sd over 300 sets is good to 4 %, one set's bootstrap to 10-20 %; measured
    0.113 against 0.122 for Omega_c). The mean score's noise alone (mc_cov_z) misses part of it
    (measured 0.068): Omega_c's estimate rests on H^T J^-1."""
    rng = np.random.default_rng(4)
    g_d = np.array([-1.4, 2.2])
    h_sd = np.array([[0.22, 0.63], [0.78, 1.27]])
    est = np.array([_result(rng, 16, 64, h_sd, g_d).theta_z for _ in range(300)])
    truth_sd = est.std(0, ddof=1)
    runs = [_result(rng, 16, 64, h_sd, g_d) for _ in range(40)]
    boot = np.median([r.theta_bootstrap_sd(n_boot=200, seed=i) for i, r in enumerate(runs)], axis=0)
    np.testing.assert_allclose(boot, truth_sd, rtol=0.3)
    mc = np.median([np.sqrt(np.diag(r.mc_cov_z)) for r in runs], axis=0)
    assert mc[0] < 0.8 * truth_sd[0], (mc, truth_sd)


def test_the_physical_block_gives_s8_and_omega_m_their_68_percent_interval_from_the_latent_gaussian():
    """map.json's ``interval68`` for the derived S8 and Omega_m (drawn in estimates.png), against
    an independent reference: the pushforward's CDF integrated on a 2D grid of the latent Gaussian
    (601 x 601 points over +-6 sd in its eigenbasis, so the grid's error is far below the draws'),
    its 16th and 84th percentiles found by interpolation. The draws put an end within 0.004 of
    the parameter's sd (priors.gaussian_quantiles); 0.02 sd is 5 of those. The sampled
    parameters' ends are the transform of theta_z +- sd_z, exact; the Omega_m interval, Omega_c's
    shifted by the fixed Omega_b, checks the two routes against each other."""
    import dataclasses

    import jax.numpy as jnp
    from scipy import stats

    from fli.cli.compose import compose
    from fli.infer.posterior.model import build_posterior
    from fli.sim.sharding import make_mesh
    from tests.helpers.posterior import SMALL

    cfg, _ = compose([*SMALL, "simulation.forward=linear", "distributed.pdims=[1,1]"])
    post = build_posterior(cfg, mesh=make_mesh((1, 1)))
    r = _result(np.random.default_rng(2), 16, 64, np.zeros((2, 2)), np.array([-1.4, 2.2]))
    # correlated (0.75), as Omega_c and sigma8 are along S8's degeneracy, so that S8's interval
    # rests on the covariance's off-diagonal: with it dropped the ends move by 0.24 and 0.32 sd
    r = dataclasses.replace(r, cov_z=np.array([[0.6, 0.2], [0.2, 0.12]]))
    phys = r.physical(post)
    iv, sd = phys["interval68"], phys["sd"]
    assert set(iv) == {"Omega_c", "sigma8", "Omega_m", "S8"}

    w, v = np.linalg.eigh(r.cov_z)
    u = np.linspace(-6, 6, 601)
    grid = np.stack(np.meshgrid(u, u, indexing="ij"), -1).reshape(-1, 2)
    weight = stats.norm.pdf(grid).prod(1)
    z = r.theta_z + (grid * np.sqrt(w)) @ v.T
    vals = {k: np.asarray(x, np.float64) for k, x in post.params(jnp.asarray(z.T, jnp.float32)).items()}
    for k in ("S8", "Omega_m", "Omega_c", "sigma8"):
        x = vals[k].reshape(-1)
        order = np.argsort(x)
        cdf = np.cumsum(weight[order]) / weight.sum()
        ref = np.interp([stats.norm.cdf(-1), stats.norm.cdf(1)], cdf, x[order])
        np.testing.assert_allclose(iv[k], ref, atol=0.02 * sd[k], err_msg=k)
    ob = phys["median"]["Omega_m"] - phys["median"]["Omega_c"]
    np.testing.assert_allclose(np.asarray(iv["Omega_m"]) - ob, iv["Omega_c"], atol=0.02 * sd["Omega_m"])
