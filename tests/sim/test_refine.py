"""White noise refined onto a finer grid keeps the coarse grid's universe (fli/sim/refine.py)."""

import jax.numpy as jnp
import numpy as np
import pytest

from fli.cosmo.background import planck18
from fli.sim.grid import Grid
from fli.sim.lpt import linear_field
from fli.sim.refine import refine_white_noise
from fli.sim.sharding import make_mesh

COARSE, FINE = (8, 8, 16), (16, 16, 32)
BOX = (200.0, 200.0, 400.0)


def _band(shape):
    """numpy rfftn indices of the modes strictly inside ``shape``'s Nyquist on every axis."""
    f = [np.fft.fftfreq(n, 1.0 / n) for n in shape[:2]] + [np.arange(shape[2] // 2 + 1)]
    return [np.abs(fi) < n / 2 for fi, n in zip(f, shape, strict=True)], f


def _fine_of_coarse(coarse_k, fine_k):
    """The fine grid's modes at the coarse band's signed frequencies, beside the coarse ones."""
    (bx, by, bz), (fx, fy, _) = _band(COARSE)
    nf = FINE
    ix = np.flatnonzero(bx)
    iy = np.flatnonzero(by)
    iz = np.flatnonzero(bz)
    jx = np.asarray(fx[ix], int) % nf[0]
    jy = np.asarray(fy[iy], int) % nf[1]
    return coarse_k[np.ix_(ix, iy, iz)], fine_k[np.ix_(jx, jy, iz)]


def test_the_coarse_band_is_kept_and_the_rest_is_unit_white_noise():
    rng = np.random.default_rng(0)
    coarse = rng.standard_normal(COARSE)
    fine = refine_white_noise(coarse, FINE, np.random.default_rng(1))
    factor = np.prod(FINE) / np.prod(COARSE)
    c, f = _fine_of_coarse(np.fft.rfftn(coarse), np.fft.rfftn(fine))
    np.testing.assert_allclose(f, np.sqrt(factor) * c, rtol=1e-10, atol=1e-10)
    # unit white noise over 10 fine fields: per cell mean 0 and variance 1; each Fourier mode's
    # |FFT|^2 / N has mean 1 in and out of the band (5 standard errors each)
    many = np.stack([refine_white_noise(rng.standard_normal(COARSE), FINE, rng) for _ in range(10)])
    n = many.size
    assert abs(many.mean()) < 5 / np.sqrt(n)
    assert abs(many.var() - 1) < 5 * np.sqrt(2 / n)
    p = np.abs(np.fft.rfftn(many, axes=(1, 2, 3))) ** 2 / np.prod(FINE)
    band = np.zeros(p.shape[1:], bool)
    (bx, by, bz), (fx, fy, _) = _band(COARSE)
    band[np.ix_(np.asarray(fx[bx], int) % FINE[0], np.asarray(fy[by], int) % FINE[1], np.flatnonzero(bz))] = True
    for sel in (band, ~band):
        vals = p[:, sel]  # |FFT|^2 / N is exponential (chi^2_2 / 2) per complex mode: sd 1
        assert abs(vals.mean() - 1) < 5 / np.sqrt(vals.size), (sel.sum(), vals.mean())


def test_the_linear_field_on_the_finer_grid_has_the_coarse_ones_large_scales():
    """fli's own linear field (lpt.linear_field) of both: the fine grid's DFT is the coarse
    one's times the cell-count ratio on every mode of the coarse band (float32 FFTs: 1e-4 of
    the largest mode)."""
    cosmo = planck18()
    coarse = np.random.default_rng(2).standard_normal(COARSE)
    fine = refine_white_noise(coarse, FINE, np.random.default_rng(3))
    mesh = make_mesh((1, 1))
    fields = [np.asarray(linear_field(cosmo, jnp.asarray(s, jnp.float32), Grid(sh, BOX, mesh, halo=1)))
              for s, sh in ((coarse, COARSE), (fine, FINE))]
    c, f = _fine_of_coarse(np.fft.rfftn(fields[0]), np.fft.rfftn(fields[1]))
    factor = np.prod(FINE) / np.prod(COARSE)
    np.testing.assert_allclose(f, factor * c, atol=1e-4 * np.abs(factor * c).max())
    assert np.abs(factor * c).max() > 0


def test_a_grid_that_is_not_a_refinement_is_refused():
    with pytest.raises(ValueError, match="whole multiple"):
        refine_white_noise(np.zeros(COARSE), (12, 16, 32), np.random.default_rng(0))


# measured 21 s beside a one-core study (two pairs: 8x8x32 and 16x16x64 forwards, compiled once)
