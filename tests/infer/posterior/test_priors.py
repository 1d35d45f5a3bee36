"""The pushforward of a Gaussian in the standardised latents through the prior transform,
against closed forms: for ``X ~ N(mu, s^2)``, ``E[Phi(X)] = Phi(mu / sqrt(1 + s^2))`` and
``E[Phi(X1) Phi(X2)]`` is a bivariate normal CDF (scipy's, the independent reference), since
``Phi(X) = P(Y <= X)`` for a standard normal ``Y`` independent of ``X``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from fli.infer.posterior.priors import PriorTransform, gaussian_pushforward


def _exact_phi_moments(mu, cov):
    """Mean and covariance of ``Phi(X)``, ``X ~ N(mu, cov)``, in closed form."""
    n = len(mu)
    v = 1.0 + np.diag(cov)
    h = mu / np.sqrt(v)
    mean = stats.norm.cdf(h)
    second = np.empty((n, n))
    for i in range(n):
        for j in range(n):
            # E[Phi(X_i) Phi(X_j)] = P(Y_i - X_i <= 0, Y_j' - X_j <= 0), Y and Y' independent:
            # the pair has covariance cov_ij (i = j included) and variances 1 + cov_ii
            rho = cov[i, j] / np.sqrt(v[i] * v[j])
            second[i, j] = stats.multivariate_normal(mean=[0, 0], cov=[[1, rho], [rho, 1]]).cdf([h[i], h[j]])
    return mean, second - np.outer(mean, mean)


def _phi(z):
    return jax.scipy.special.ndtr(jnp.asarray(z, jnp.float64))


@pytest.mark.parametrize("mu, cov", [
    (np.array([0.0]), np.array([[1.0]])),                              # the prior itself: uniform's mean and sd
    (np.array([1.7]), np.array([[0.09]])),                             # near the upper edge, narrow
    (np.array([-0.6, 0.4]), np.array([[0.38, -0.11], [-0.11, 0.07]])),  # MUSE's on a linear mock (map_000)
    (np.array([0.3, -1.2, 0.8]), np.array([[0.5, 0.2, 0.0], [0.2, 0.8, -0.3], [0.0, -0.3, 1.5]])),
])
def test_the_pushforward_through_phi_has_the_closed_form_moments(mu, cov):
    with jax.enable_x64(True):
        mean, c = gaussian_pushforward(mu, cov, _phi)
    em, ec = _exact_phi_moments(mu, cov)
    # Gauss-Hermite with >= 27 nodes per axis on a smooth bounded integrand: 1e-6 is loose;
    # scipy's bivariate CDF is accurate to about 1e-8
    np.testing.assert_allclose(mean, em, atol=1e-6)
    np.testing.assert_allclose(c, ec, atol=1e-6)
    if len(mu) == 1 and mu[0] == 0.0:
        assert abs(np.sqrt(c[0, 0]) - 1 / np.sqrt(12)) < 1e-6  # a latent N(0, 1) is the uniform prior


def test_the_pushforward_falls_back_to_draws_in_many_dimensions():
    """Six latents with 20000 points leave 5 nodes per axis: the fixed-seed draws take over, and
    the variances carry their Monte Carlo error (relative sd sqrt(2/20000) = 1 %, before the
    bounded integrand's smaller one): 5 % is 5 of those sds."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((6, 6)) * 0.4
    cov, mu = a @ a.T + 0.2 * np.eye(6), rng.standard_normal(6) * 0.7
    with jax.enable_x64(True):
        mean, c = gaussian_pushforward(mu, cov, _phi)
    em, ec = _exact_phi_moments(mu, cov)
    np.testing.assert_allclose(mean, em, atol=0.01)  # mean's MC sd <= 0.29 / sqrt(20000) = 0.002
    np.testing.assert_allclose(np.diag(c), np.diag(ec), rtol=0.05)


def test_the_delta_method_overstates_a_uniform_priors_width_and_the_pushforward_does_not():
    """Omega_c's flaw on the PM calibration: a latent sd near 1 at the prior's median. The delta
    method gives ``(high - low) phi(0) = 0.399 (high - low)``, 1.38x the uniform's sd; the
    pushforward gives the uniform's sd itself."""
    pt = PriorTransform(("Omega_c",), ("uniform",), (0.15,), (0.45,), (0.0,), (1.0,))
    with jax.enable_x64(True):
        _, c = gaussian_pushforward([0.0], [[1.0]], jax.vmap(pt))
        delta = float(pt.jacobian(jnp.zeros(1, jnp.float64))[0])
    assert abs(np.sqrt(c[0, 0]) - 0.3 / np.sqrt(12)) < 1e-6
    assert abs(delta / (0.3 / np.sqrt(12)) - np.sqrt(12) * stats.norm.pdf(0)) < 1e-9  # 1.382


@pytest.mark.parametrize("mu, cov", [
    (np.array([-0.6, 0.4]), np.array([[0.38, -0.11], [-0.11, 0.07]])),  # MUSE's on a linear mock (map_000)
    (np.array([0.3, -1.2]), np.array([[0.9, 0.25], [0.25, 0.16]])),
])
def test_the_pushforwards_quantiles_of_a_product_have_the_closed_form(mu, cov):
    """S8's shape, ``sigma8 sqrt(Omega_m)``, with lognormal priors: ``exp(z1) exp(z0) ** 0.5`` is
    the exponential of ``a . z``, a Gaussian of mean ``a . mu`` and variance ``a^T cov a``, so its
    quantiles are ``exp(a . mu + sqrt(a^T cov a) Phi^-1(q))``. The draws put an interval's end within
    0.0036 sd of it (the docstring's figure, for 200000 draws); 0.02 sd is 5.5 of those."""
    from fli.infer.posterior.priors import gaussian_quantiles

    a = np.array([0.5, 1.0])
    q = np.array([stats.norm.cdf(-1), 0.5, stats.norm.cdf(1)])
    fn = lambda z: np.stack([np.exp(z[:, 0]), np.exp(z @ a)], -1)
    got = gaussian_quantiles(mu, cov, fn, q)
    for col, w in ((0, np.array([1.0, 0.0])), (1, a)):
        m, s = w @ mu, np.sqrt(w @ cov @ w)
        np.testing.assert_allclose((np.log(got[:, col]) - m) / s, stats.norm.ppf(q), atol=0.02)
