"""fli's autocorrelation time (fli/infer/sample/autocorrelation.py) against the AR(1) process's closed
form and against Geyer's estimator written out on ArviZ's autocorrelation."""

import arviz as az
import numpy as np
import pytest

from fli.infer.sample.autocorrelation import autocorrelation_time


def _ar1(phi, n, m, seed=0):
    """m independent stationary AR(1) series of n steps, x_t = phi x_(t-1) + e_t."""
    rng = np.random.default_rng(seed)
    e = rng.normal(size=(m, n))
    x = np.empty((m, n))
    x[:, 0] = e[:, 0] / np.sqrt(1 - phi**2)
    for t in range(1, n):
        x[:, t] = phi * x[:, t - 1] + e[:, t]
    return x


def _geyer(x):
    """Geyer's initial monotone sequence written out step by step, on ArviZ's autocorrelation."""
    rho = az.autocorr(np.asarray(x, np.float64))
    total, previous, t = 0.0, np.inf, 0
    while t + 1 < len(rho):
        pair = rho[t] + rho[t + 1]
        if pair <= 0:
            break
        previous = min(pair, previous)
        total, t = total + previous, t + 2
    return max(-1.0 + 2.0 * total, 1.0 / np.log10(len(rho)))


@pytest.mark.parametrize("phi", [0.0, 0.5, 0.9])
def test_the_autocorrelation_time_of_an_ar1_process(phi):
    """tau = (1 + phi) / (1 - phi) in closed form (1, 3 and 19). 200 series of 2000 steps: the
    mean estimate's spread is a few per cent of tau, and Geyer's truncation biases it low by
    about 2 tau / n, so 6 % covers both. Each of 20 series against the estimator written out
    step by step on ArviZ's own autocorrelation (float32 FFT against float64: 1e-4)."""
    x = _ar1(phi, 2000, 200)
    tau = np.asarray(autocorrelation_time(x.astype(np.float32), axis=1))
    exact = (1 + phi) / (1 - phi)
    assert abs(tau.mean() / exact - 1) < 0.06, (tau.mean(), exact)
    np.testing.assert_allclose(tau[:20], [_geyer(s) for s in x[:20]], rtol=1e-4)


def test_a_constant_series_and_a_too_short_one():
    """A constant series has no autocorrelation to measure: tau = 1, not a NaN; fewer than 4
    steps are refused."""
    assert float(autocorrelation_time(np.ones((50, 1), np.float32))[0]) == 1.0
    with pytest.raises(ValueError, match="4 steps or more"):
        autocorrelation_time(np.ones(3))
