"""The scale cut (lensing.ell_max): the likelihood through each map's whitened Fourier modes.

Checked against what does not depend on how the rows are built: Parseval (every mode kept and no
mask is the pixel likelihood), the DFT's orthogonality (a mode past ell_max does not enter), and
the noise itself (fli.lensing.survey.add_noise's masked maps, whitened, have unit covariance).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fli.cli.compose import compose
from fli.config import ConfigError
from fli.infer.posterior.model import Latents, build_posterior
from fli.infer.posterior.scale_cut import check_ell_max, cut_rows, mode_rows, n_modes, whitened_rows
from fli.lensing.survey import add_noise
from tests.helpers.posterior import SMALL, small_posterior

FOV, NPIX = 5.0, 16
DELL = 360.0 / FOV  # the map's fundamental multipole


def test_every_mode_without_a_mask_is_the_pixel_likelihood():
    b = whitened_rows(NPIX, FOV, 1e9, None, 0.02)
    assert b.shape[0] == NPIX * NPIX  # one real component per pixel
    r = np.random.default_rng(0).normal(size=(NPIX, NPIX))
    # Parseval: float64 rows, so agreement to rounding
    assert np.sum(np.tensordot(b, r, 2) ** 2) == pytest.approx(np.sum(r * r) / 0.02 ** 2, rel=1e-10)


def test_modes_past_ell_max_do_not_enter_and_those_below_do():
    ell_max = 4.5 * DELL
    b = whitened_rows(NPIX, FOV, ell_max, None, 1.0)
    x = np.arange(NPIX)
    wave = lambda kx, ky: np.cos(2 * np.pi * (kx * x[:, None] + ky * x[None, :]) / NPIX + 0.3)
    # |k| = 4.47, kept: all of the wave's power is read (Parseval on its own mode)
    assert np.sum(np.tensordot(b, wave(4, 2), 2) ** 2) == pytest.approx(np.sum(wave(4, 2) ** 2), rel=1e-10)
    assert np.abs(np.tensordot(b, wave(3, 4), 2)).max() < 1e-12  # |k| = 5: past the cut, orthogonal
    # the count: integer vectors in a disc of radius 4.5, conjugate pairs as two real components
    k = np.fft.fftfreq(NPIX, 1.0 / NPIX)
    assert b.shape[0] == int(np.sum(np.hypot(k[:, None], k[None, :]) <= 4.5))
    assert n_modes(NPIX, FOV, [ell_max]) == b.shape[0]


def test_masked_noise_is_whitened():
    """fli.lensing.survey's own masked noise maps, through the rows: unit covariance (K draws: each
    entry's sampling sd is about 1/sqrt(K) = 0.016; 6 of them over ~1000 entries)."""
    rng = np.random.default_rng(3)
    mask = rng.random((NPIX, NPIX)) > 0.3
    mask[:5, :7] = False  # and a hole, so that neighbouring modes couple
    sigma = np.array([0.01, 0.03])
    rows, counts = cut_rows((2, NPIX, NPIX), FOV, (3.2 * DELL, 5.5 * DELL), mask, sigma)
    K = 4000
    with jax.enable_x64(True):  # K maps of the two bins in one call: sigma per map
        maps = np.asarray(add_noise(jax.random.key(0), jnp.zeros((2 * K, NPIX, NPIX), jnp.float64),
                                    np.tile(sigma, K), mask).kappa).reshape(K, 2, NPIX, NPIX)
    for b in range(2):
        v = np.tensordot(maps[:, b], rows[b, : counts[b]], axes=([1, 2], [1, 2]))
        cov = v.T @ v / K
        assert np.abs(cov - np.eye(counts[b])).max() < 6 / math.sqrt(K)
        assert not rows[b, counts[b]:].any()  # the padding rows are zero
    # the unmasked rows of the same modes are not the masked ones: the mask coupled them
    assert counts[0] == mode_rows(NPIX, FOV, 3.2 * DELL)[0].shape[0]


def test_ell_max_is_checked_against_the_bins():
    assert check_ell_max(None, 2) is None
    assert check_ell_max([300, 600.0], 2) == (300.0, 600.0)
    with pytest.raises(ConfigError, match=r"lensing.ell_max .* one positive multipole per source bin \(2 bins\)"):
        check_ell_max([300.0], 2)
    with pytest.raises(ConfigError, match="lensing.ell_max"):
        compose(["lensing.ell_max=[300,-1]"])
    # below the fundamental multipole only the map's mean is read
    assert cut_rows((2, NPIX, NPIX), FOV, (10.0, 600.0), None, np.ones(2))[1][0] == 1
    cfg, _ = compose([*SMALL, "lensing.ell_max=[300]"])
    with pytest.raises(ConfigError, match="lensing.ell_max"):
        build_posterior(cfg)


def test_the_posterior_with_every_mode_kept_is_the_pixel_posterior():
    """Through the model's own code, sharded over 2 x 2 devices: U and its gradient with
    ell_max past the map's largest multipole equal the pixel likelihood's (float32 sums of
    ~1e4 terms: relative 1e-5); and so does the linear forward's exact log p(d | theta)
    (fli.infer.posterior.exact), since the whitened components are then an orthogonal transform of the
    whitened pixels, under which a Gaussian's density is invariant (float32 response: 1e-4).
    The linear forward: the likelihood does not depend on which forward made kappa, and it
    compiles in seconds."""
    from fli.infer.posterior.exact import log_evidence

    lin = ["simulation.forward=linear"]
    post, data, lat = small_posterior((2, 2), extra=lin)
    cut, cdata, _ = small_posterior((2, 2), extra=[*lin, "lensing.ell_max=[1000,1000]"])
    assert cut.n_terms == math.prod(post.fwd.kappa_shape) and cdata.modes is not None
    at = Latents(lat.theta + 0.05, lat.s * 0.97)
    vg = lambda p, d: jax.jit(jax.value_and_grad(lambda x: p.potential_and_aux(x, d), has_aux=True))(at)
    ((u, aux), g), ((uc, cux), gc) = vg(post, data), vg(cut, cdata)
    assert float(uc) == pytest.approx(float(u), rel=1e-5)
    # the cut's own chi^2 (map.json's chi2_cut) is then the pixels' chi^2, over as many terms
    assert "chi2_cut" not in aux and int(cux["n_cut"]) == cut.n_terms
    assert float(cux["chi2_cut"]) == pytest.approx(float(cux["chi2"]), rel=1e-5)
    np.testing.assert_allclose(np.asarray(gc.s), np.asarray(g.s), rtol=1e-3, atol=1e-4 * float(jnp.abs(g.s).max()))
    np.testing.assert_allclose(np.asarray(gc.theta), np.asarray(g.theta), rtol=1e-3)
    theta = np.asarray(lat.theta) + 0.1
    assert log_evidence(cut, cdata, theta) == pytest.approx(log_evidence(post, data, theta), rel=1e-4)
