"""Shell-averaged power spectra and cross-correlations against a plain numpy implementation.

Tolerances: float32 FFT values carry ~1e-6 relative round-off and the bin sums add up to a
few thousand terms in float32, so 1e-5 relative to the largest value; float64 1e-10. Tests on
random fields use the scatter of a mean of n/2 independent exponential variables,
sqrt(2 / n_modes), with a 5-sigma margin.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fli.sim.fft import make_fft
from fli.sim.power import binned_spectra, cross_correlation, default_kedges, power_spectrum
from fli.sim.sharding import make_mesh, white_noise

BOX = (120.0, 60.0, 90.0)


def _mesh(pdims):
    if jax.device_count() < pdims[0] * pdims[1]:
        pytest.skip(f"needs {pdims[0] * pdims[1]} devices")
    return make_mesh(pdims)


def np_power(x, box, edges, y=None):
    """Reference: full complex numpy FFT, every mode once, bins edges[b] <= |k| < edges[b+1]."""
    y = x if y is None else y
    fx, fy = np.fft.fftn(x.astype(np.float64)), np.fft.fftn(y.astype(np.float64))
    ks = [2 * np.pi * np.fft.fftfreq(n, L / n) for n, L in zip(x.shape, box, strict=False)]
    kx, ky, kz = np.meshgrid(*ks, indexing="ij")
    k = np.sqrt(kx**2 + ky**2 + kz**2).ravel()
    p = (np.real(fx * np.conj(fy)) * np.prod(box) / x.size**2).ravel()
    idx = np.digitize(k, edges) - 1
    m = (idx >= 0) & (idx < len(edges) - 1) & (k > 0)
    nb = len(edges) - 1
    n = np.bincount(idx[m], minlength=nb).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.bincount(idx[m], k[m], nb) / n, np.bincount(idx[m], p[m], nb) / n, n


@pytest.mark.parametrize(
    "backend,pdims,shape",
    [("pencil", (1, 1), (16, 8, 12)), ("pencil", (2, 4), (16, 8, 12)), ("pencil", (8, 1), (8, 16, 9)),
     ("jaxdecomp", (2, 4), (16, 8, 12))],
)
def test_power_spectrum_vs_numpy(backend, pdims, shape):
    plan = make_fft(_mesh(pdims), shape, backend)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    y = (x + rng.standard_normal(shape)).astype(np.float32)
    xs, ys = jax.device_put(x, plan.sharding), jax.device_put(y, plan.sharding)
    edges = default_kedges(plan, BOX)
    k, p, n = power_spectrum(xs, plan, BOX)
    rk, rp, rn = np_power(x, BOX, edges)
    np.testing.assert_array_equal(np.asarray(n), rn)
    np.testing.assert_allclose(np.asarray(k), rk, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(p), rp, rtol=0, atol=1e-5 * rp.max())
    # cross spectrum
    _, pxy, _ = power_spectrum(xs, plan, BOX, field2=ys)
    _, rpxy, _ = np_power(x, BOX, edges, y)
    np.testing.assert_allclose(np.asarray(pxy), rpxy, rtol=0, atol=1e-5 * np.abs(rpxy).max())
    # cross-correlation coefficient
    kr, r = cross_correlation(xs, ys, plan, BOX)
    _, py_, _ = np_power(y, BOX, edges)
    np.testing.assert_allclose(np.asarray(r), rpxy / np.sqrt(rp * py_), atol=1e-5)


def test_power_float64_and_explicit_edges():
    shape = (8, 16, 9)
    with jax.enable_x64(True):
        plan = make_fft(_mesh((2, 4)), shape)
        x = np.random.default_rng(1).standard_normal(shape)
        edges = np.array([0.0, 0.1, 0.2, 0.21, 0.4, 0.7])  # 0.2..0.21 is narrow: maybe empty
        k, p, n = power_spectrum(jax.device_put(x, plan.sharding), plan, BOX, kedges=edges)
        assert p.dtype == jnp.float64
        rk, rp, rn = np_power(x, BOX, edges)
        np.testing.assert_array_equal(np.asarray(n), rn)
        full = rn > 0
        np.testing.assert_allclose(np.asarray(p)[full], rp[full], rtol=1e-10)
        np.testing.assert_allclose(np.asarray(k)[full], rk[full], rtol=1e-10)
        centres = 0.5 * (edges[1:] + edges[:-1])
        np.testing.assert_allclose(np.asarray(k)[~full], centres[~full])
        assert np.all(np.asarray(p)[~full] == 0)


def test_default_bins():
    plan = make_fft(_mesh((1, 1)), (32, 16, 24))
    box = (100.0, 50.0, 75.0)  # equal cell sizes: Nyquist pi / 3.125 on every axis
    e = default_kedges(plan, box)
    kf = 2 * np.pi / 100.0
    np.testing.assert_allclose(np.diff(e), kf)
    np.testing.assert_allclose(e[0], 0.5 * kf)
    knyq = np.pi * 32 / 100.0
    assert e[-1] - 0.5 * kf <= knyq + 1e-9 < e[-1] + 0.5 * kf
    e5 = default_kedges(plan, box, 5)
    assert len(e5) == 6 and np.isclose(e5[0], e[0]) and np.isclose(e5[-1], e[-1])
    k, p, n = power_spectrum(jnp.zeros(plan.shape), plan, box, kedges=5)
    assert k.shape == p.shape == n.shape == (5,)


def test_flat_spectrum_of_white_noise():
    """Unit-variance white noise has P(k) = V / N (the cell volume) at every k."""
    shape, box = (32, 32, 32), (200.0, 200.0, 200.0)
    mesh = _mesh((2, 4))
    plan = make_fft(mesh, shape)
    x = white_noise(3, shape, mesh)
    k, p, n = power_spectrum(x, plan, box)
    k, p, n = np.asarray(k), np.asarray(p), np.asarray(n)
    expect = np.prod(box) / np.prod(shape)
    good = n >= 20
    assert good.sum() >= 10
    sigma = np.sqrt(2.0 / n[good])
    assert np.all(np.abs(p[good] / expect - 1) < 5 * sigma)
    # all modes together: a 1% level test
    pall = np.sum(p * n) / np.sum(n)
    assert abs(pall / expect - 1) < 5 * np.sqrt(2.0 / n.sum())
    # r(x, x) = 1, r(x, -x) = -1, r(x, independent) ~ 0
    _, r = cross_correlation(x, x, plan, box)
    np.testing.assert_allclose(np.asarray(r)[n > 0], 1.0, rtol=1e-5)
    _, r = cross_correlation(x, -x, plan, box)
    np.testing.assert_allclose(np.asarray(r)[n > 0], -1.0, rtol=1e-5)
    _, r = cross_correlation(x, white_noise(4, shape, mesh), plan, box)
    assert np.all(np.abs(np.asarray(r)[good]) < 5 * sigma)


def test_power_spectrum_of_shaped_field_and_gradients():
    """A field with P(k) = A k^-1 shaped in k-space comes back, and grads are finite."""
    shape, box = (32, 32, 32), (200.0, 200.0, 200.0)
    mesh = _mesh((2, 2))
    plan = make_fft(mesh, shape)
    from fli.sim.fft import kgrid_norm  # noqa: PLC0415

    x = white_noise(5, shape, mesh)
    kn = kgrid_norm(plan, box)
    amp = jnp.where(kn > 0, 1.0 / jnp.sqrt(jnp.where(kn > 0, kn, 1.0)), 0.0)
    y = plan.irfft(plan.rfft(x) * amp)
    k, p, n = power_spectrum(y, plan, box)
    # exact expectation: per-bin mean of (V/N) / |k| over the bin's modes
    cell = np.prod(box) / np.prod(shape)
    one = jnp.ones(plan.kshape, jnp.complex64)
    _, (mean_inv_k,), _ = binned_spectra(plan, box, [(one * amp, one * amp)])
    expect = np.asarray(mean_inv_k) * np.prod(shape) ** 2 / np.prod(box) * cell
    good = np.asarray(n) >= 20
    sigma = np.sqrt(2.0 / np.asarray(n)[good])
    assert np.all(np.abs(np.asarray(p)[good] / expect[good] - 1) < 5 * sigma)

    def loss(f):
        kk, pp, _ = power_spectrum(f, plan, box, kedges=np.array([0.0, 0.01, 0.2, 0.5]))
        return jnp.sum(pp)

    g = jax.jit(jax.grad(loss))(y)
    assert np.all(np.isfinite(np.asarray(g))) and float(jnp.abs(g).max()) > 0
